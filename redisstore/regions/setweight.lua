-- Rebalance's write: sets field ARGV[1] of the weights KEYS[1] to ARGV[3] unless it holds
-- a decision for bucket ARGV[2] or a later one.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and tonumber(string.match(cur, '^(%d+):')) >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
