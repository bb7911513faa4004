-- Flush: marks KEYS[1], the interval now in, as reported by this region (ARGV[2], the
-- time), and adds to each demand hash of KEYS[2...] its fields: ARGV[3...] holds, for
-- each, the number of its fields, then each field and its count. ARGV[1] is the TTL in ms
-- of every key.
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
local a = 3
for k = 2, #KEYS do
  local fields = tonumber(ARGV[a])
  a = a + 1
  for i = 1, fields do
    redis.call('HINCRBY', KEYS[k], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('PEXPIRE', KEYS[k], ARGV[1])
end
return 1
