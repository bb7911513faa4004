-- What a step whose first key holds the state "T:L:A" reads before its algorithm's own
-- part: the op, and that state (the latest instant seen, in us; Level; Aux).
-- Division rounds down as floor(a / b) and up as -floor(-a / b), written inline (a call
-- costs more than the division). Both are exact here: every numerator is an integer
-- below 2^53 in magnitude and every divisor a positive integer, so the quotient a / b,
-- rounded to a double, is never within its rounding error of the next integer.

-- a peek decides as a take would, writing nothing; a reset forgets the key, and then
-- answers as a peek of 1 on a fresh key
local dry = op == PEEK
if op == RESET then
  redis.call('DEL', unpack(KEYS))
  n, dry = 1, true
end

-- the state is one string, read and written with one call each; a batch reads the states
-- of its calls ahead, all at once, and hands each over after the arguments (false: no key)
local T, L, A = 0, 0, 0
local state = false
if op ~= RESET then
  state = ARGV[13]
  if state == nil then state = redis.call('GET', KEYS[1]) end
end
if state then
  local t, l, a = string.match(state, '^(-?%d+):(-?%d+):(%d+)$') -- a debit may take L below 0
  T, L, A = tonumber(t) or 0, tonumber(l) or 0, tonumber(a) or 0
end
-- a key's time more than a period ahead of now: the clock went back by more than that,
-- and the key's state moves back by whole periods, to within one (core.Rewind)
local rewound = 0
if T - now > period then
  rewound = floor((T - now - 1) / period) * period
  T = T - rewound
end
