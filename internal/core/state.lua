-- What every step reads before its algorithm's own part (see core.Script): the op, and
-- the state of KEYS[1].
-- Division rounds down as floor(a / b) and up as -floor(-a / b), written inline (a call
-- costs more than the division). Both are exact here: every numerator is an integer
-- below 2^53 in magnitude and every divisor a positive integer, so the quotient a / b,
-- rounded to a double, is never within its rounding error of the next integer.

-- op: take (empty), peek (the decision take gives, writing nothing), refund or reset. A
-- batch runs each request first as a peek, then as a take if all are allowed.
local op = ARGV[7] or ''
local dry = op == 'peek'
if op == 'reset' then -- forget the key; answer as a peek of 1 on a fresh key
  if not dry then
    redis.call('DEL', unpack(KEYS))
  end
  n, dry = 1, true
end

-- keep: what a take or a peek must leave of limit for more important requests
-- (Args.Keep, which the store sends as ARGV[9], 0 for the others); absent, or a number
-- from a batch (0, most often): no call unless there is one.
local keep = ARGV[9]
if keep and keep ~= 0 and keep ~= '0' and (op == '' or op == 'take' or op == 'peek') then
  keep = tonumber(keep)
else
  keep = 0
end

-- the state is one string "T:L:A", read and written with one call each; a batch reads
-- every call's state at once and hands it over as ARGV[11] (false: no key)
local T, L, A = 0, 0, 0
local state = false
if op ~= 'reset' then
  state = ARGV[11]
  if state == nil then state = redis.call('GET', KEYS[1]) end
end
if state then
  local t, l, a = string.match(state, '^(-?%d+):(%d+):(%d+)$')
  T, L, A = tonumber(t) or 0, tonumber(l) or 0, tonumber(a) or 0
end
-- a key's time more than a period ahead of now: the clock went back by more than that,
-- and the key's state moves back by whole periods, to within one (core.Rewind)
local rewound = 0
if T - now > period then
  rewound = floor((T - now - 1) / period) * period
  T = T - rewound
end


-- the reply, which core.Script returns after the step: allowed (0 or 1), remaining, retry
-- after, reset after and delay (us)
local allowed, remaining, retry, reset, delay = 0, 0, 0, 0, 0

