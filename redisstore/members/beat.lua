-- Beat: announces ARGV[1] until ARGV[2] + ARGV[3] (microseconds; the time is Redis's own
-- when ARGV[2] is empty), drops the members whose instant has passed, keeps the set for
-- as long, and counts the members.
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], math.floor(ttl / 1000) + 1)
return redis.call('ZCARD', KEYS[1])
