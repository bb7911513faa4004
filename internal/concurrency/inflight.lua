-- The in-flight limit, as acquireLease, releaseLease and extendLease in
-- concurrency.go. KEYS[1]: the key's leases, a sorted set of lease ids scored by
-- their expiry (us since the Unix epoch); its TTL is the latest expiry's. KEYS[2]: the
-- leases released while not held, scored by when that is forgotten (a lease's duration
-- after), so that an acquire that runs after its release takes nothing; its TTL is the
-- latest of them. lease is the id of the lease a take acquires, a refund releases or an
-- extension renews, as a string; period is a lease's duration (us).
local key, released = KEYS[1], KEYS[2]
local after = '(' .. int(now) -- scores after now: the leases alive

if op == RESET then -- forget every lease; answer as a peek
  redis.call('DEL', key, released)
  op = PEEK
end
local dry = op == PEEK
-- a lease never expires more than its duration from now: later ones, left by a clock
-- that went back, are brought to it (read so when nothing is written)
local horizon = now + period
if not dry then
  for _, k in ipairs({key, released}) do
    redis.call('ZREMRANGEBYSCORE', k, '-inf', int(now))
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', k, '(' .. int(horizon), '+inf')) do
      redis.call('ZADD', k, int(horizon), id)
    end
  end
end

-- the expiry of the lease id if it is alive, else false; the lease 0 is never held
local function alive(id)
  if id == '0' then return false end
  local at = tonumber(redis.call('ZSCORE', key, id))
  if at and at > now then return at end
  return false
end

-- when the release of the lease id, while not held, is forgotten, if it is not yet, else
-- false
local function gone(id)
  if id == '0' then return false end
  local at = tonumber(redis.call('ZSCORE', released, id))
  if at and at > now then return min(at, horizon) end -- brought to it, if a peek read it so
  return false
end

local until_, wrote, extended = now + period, false, 0
if op == REFUND or op == EXTEND then -- then answer as a peek of a new lease
  local expires = alive(lease)
  if expires and op == REFUND then
    redis.call('ZREM', key, lease)
    gave = 1
  elseif op == REFUND and tonumber(lease) > 0 and not gone(lease) then -- not held: kept released
    redis.call('ZADD', released, int(until_), lease)
    local last = redis.call('ZREVRANGE', released, 0, 0, 'WITHSCORES')
    redis.call('PEXPIRE', released, max(1, TTLFLOOR, -floor(-(min(tonumber(last[2]), horizon) - now) / 1000)))
  elseif expires then
    extended = 1
    if until_ > expires then
      redis.call('ZADD', key, int(until_), lease)
      wrote = true
    end
  end
  lease, dry = '0', true
end

-- a take (a peek when dry): renew the lease held, or add it if there is room
local held = redis.call('ZCOUNT', key, after, '+inf')
local expires = alive(lease)
local refused = not expires and gone(lease) -- released before this acquire ran
local added = false
if refused then
elseif expires then
  allowed = 1
  if not dry and until_ > expires then
    redis.call('ZADD', key, int(until_), lease)
    wrote = true
  end
elseif held + keep < limit then
  allowed, added = 1, true
  if not dry then
    redis.call('ZADD', key, int(until_), lease)
    wrote = true
  end
end

local last = redis.call('ZREVRANGEBYSCORE', key, '+inf', after, 'WITHSCORES', 'LIMIT', 0, 1)
local latest = last[2] and min(tonumber(last[2]), horizon) -- the latest expiry written
if wrote then
  redis.call('PEXPIRE', key, max(1, TTLFLOOR, -floor(-(latest - now) / 1000)))
end
if added then held = held + 1 end
if added or expires then latest = max(latest or 0, until_) end
if allowed == 0 and held > 0 and not refused then -- until enough leases expire that one fits with keep
  local first = redis.call('ZRANGEBYSCORE', key, after, '+inf', 'WITHSCORES', 'LIMIT', held + keep - limit, 1)
  retry = min(tonumber(first[2]), horizon) - now
end
if latest then reset = latest - now end
if refused then retry = refused - now end
if op == EXTEND then allowed = extended end
remaining = max(0, limit - held - keep)
