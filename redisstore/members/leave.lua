-- Leave: takes ARGV[1] out of the members KEYS[1].
return redis.call('ZREM', KEYS[1], ARGV[1])
