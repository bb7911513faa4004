-- The helpers of every algorithm's script (see core.Script): a batch script holds them
-- once, before all its steps. Lua numbers are doubles, exact for integers below 2^53;
-- every quantity here is below 2^52 (mathx.MaxExact).
--
-- KEYS[1]: the key's state, the string "T:L:A": the latest instant seen (us), Level, Aux.
-- ARGV: n, limit, period (us), unit, rate, now (us since the Unix epoch; empty for Redis TIME),
-- op, lease, reserve (percent; empty for none), window ("start:end:next" in us; empty for
-- none), and from a batch the state of KEYS[1] read ahead. A batch hands the first six
-- over as numbers, the time included (see args.lua).
local floor, max, min, tonumber, format = math.floor, math.max, math.min, tonumber, string.format

-- int is an integer as Redis stores it: %d (exact below 2^63) never writes an exponent, and
-- costs a fraction of %.0f.
local function int(x)
  return format('%d', x)
end

-- save writes the state back with a TTL of reset, the microseconds until the key is back
-- to full (and worth nothing), rounded up to a whole millisecond; a state worth nothing
-- already (reset 0: a full bucket, an empty window) is deleted, as a key never seen.
local function save(key, dry, T, L, A, reset)
  if dry then return end
  if reset <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, format('%d:%d:%d', T, L, A), 'PX', int(-floor(-reset / 1000)))
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
