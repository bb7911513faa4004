-- The fields of the hash KEYS[1] (weights, or a bucket's demand), through a client that
-- runs scripts only.
return redis.call('HGETALL', KEYS[1])
