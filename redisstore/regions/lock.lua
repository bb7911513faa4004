-- Rebalance's lock of a bucket: KEYS[1], taken for ARGV[1] ms by one instance only;
-- nil when another holds it.
return redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1])
