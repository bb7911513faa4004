-- What a step whose first key holds the state "T:L:A" reads before its algorithm's own
-- part: the op, and that state (the latest instant seen, in us; Level; Aux), and its
-- tail H, pairs ":instant:number" that some algorithms keep after it (a bucket's record
-- of deficits, a window's floor: internal/core's receipts.go), '' for none.
-- Division rounds down as floor(a / b) and up as -floor(-a / b), written inline (a call
-- costs more than the division). Both are exact here: every numerator is an integer
-- below 2^53 in magnitude and every divisor a positive integer, so the quotient a / b,
-- rounded to a double, is never within its rounding error of the next integer.

-- the state is one string, read and written with one call each; a batch reads the states
-- of its calls ahead, all at once, and hands each over after the arguments (false: no key)
local T, L, A, H = 0, 0, 0, ''
local state = ARGV[14]
if state == nil then state = redis.call('GET', KEYS[1]) end
marks = ''
if state then
  local t, l, a, h = string.match(state, '^(-?%d+):(-?%d+):(%d+)(.*)$') -- a debit may take L below 0
  T, L, A, H = tonumber(t) or 0, tonumber(l) or 0, tonumber(a) or 0, h or ''
  local cut = string.find(H, '|', 1, true) -- the marks of its settlements, after the tail
  if cut then marks, H = string.sub(H, cut), string.sub(H, 1, cut - 1) end
end
-- a settlement tried again is a peek of 1 when the marks show it landed, else the
-- settlement; a settlement of a take (a Charge's) is marked. A loan given back is a
-- refund that settles no take.
if op == RETRYREFUND or op == RETRYDEBIT then
  if settledAt(marks, taken or 0) then
    op, n = PEEK, 1
  elseif op == RETRYREFUND then
    op = REFUND
  else
    op = DEBIT
  end
end
if (op == REFUND or op == DEBIT) and (taken or 0) > 0 then
  marks = mark(marks, taken)
elseif op == GIVEBACK then
  op = REFUND
end

-- a peek decides as a take would, writing nothing, and so does a probe (what a refund
-- would give back)
local dry = op == PEEK or op == PROBE
-- a reset forgets the key (its algorithm deletes its keys, once it has seen what they
-- held), but for what makes the receipts of its takes before give nothing back (voided:
-- the key's latest instant, when it held anything at all), and answers as a peek of 1 on
-- the key as it left it
local voided = false
if op == RESET then n, dry = 1, true end
-- a key's time more than a period ahead of now: the clock went back by more than that,
-- and the key's state moves back by whole periods, to within one (core.Rewind)
local rewound = 0
if T - now > period then
  rewound = floor((T - now - 1) / period) * period
  T = T - rewound
end
