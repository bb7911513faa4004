-- The prelude of every algorithm's script: the same integers as Algorithm.Prepare gives
-- Step in Go, and the state of KEYS[1]. Lua numbers are doubles, exact for integers below
-- 2^53; every quantity here is below 2^52 (ratelimit.MaxExact).
--
-- KEYS[1]: the key's state, the string "T:L:A": the latest instant seen (us), Level, Aux.
-- ARGV: n, limit, period (us), unit, rate, now (us since the Unix epoch; empty for Redis TIME),
-- op, lease, and from a batch the state of KEYS[1] read ahead. A batch hands the first six
-- over as numbers, the time included, and its steps take them as they are.
local floor, max, min, tonumber, format = math.floor, math.max, math.min, tonumber, string.format

-- int is an integer as Redis stores it: %d (exact below 2^63) never writes an exponent, and
-- costs a fraction of %.0f.
local function int(x)
  return format('%d', x)
end

-- save writes the state back with a TTL of reset, the microseconds until the key is back
-- to full (and worth nothing), rounded up to a whole millisecond, at least 1.
local function save(key, dry, T, L, A, reset)
  if not dry then
    redis.call('SET', key, format('%d:%d:%d', T, L, A), 'PX', int(max(1, -floor(-reset / 1000))))
  end
end

-- refunded writes a refunded state, keeping its TTL (a refund only brings the key's full
-- allowance nearer); the rest of the step then answers as a peek of 1: it returns the new
-- n and dry.
local function refunded(key, state, dry, T, L, A)
  if state and not dry then
    redis.call('SET', key, format('%d:%d:%d', T, L, A), 'KEEPTTL')
  end
  return 1, true
end
-- the step: the part above is a batch's once, this part each call's
local n, limit, period, unit, rate =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = tonumber(ARGV[6])
if not now then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end
-- the arguments end: a batch hands them over as numbers, with the time it read once

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

-- the state is one string "T:L:A", read and written with one call each; a batch reads
-- every call's state at once and hands it over as ARGV[9] (false: no key)
local T, L, A = 0, 0, 0
local state = false
if op ~= 'reset' then
  state = ARGV[9]
  if state == nil then state = redis.call('GET', KEYS[1]) end
end
if state then
  local t, l, a = string.match(state, '^(-?%d+):(%d+):(%d+)$')
  T, L, A = tonumber(t) or 0, tonumber(l) or 0, tonumber(a) or 0
end


-- the reply, which core.Script returns after the step: allowed (0 or 1), remaining, retry
-- after, reset after and delay (us)
local allowed, remaining, retry, reset, delay = 0, 0, 0, 0, 0

