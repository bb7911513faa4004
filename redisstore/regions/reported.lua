-- Whether a region has reported its demand of a bucket (KEYS[1], set by flush.lua).
return redis.call('EXISTS', KEYS[1])
