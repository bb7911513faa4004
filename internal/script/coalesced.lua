-- The coalesced batch script of redisstore: each call decided in turn, as alone. Redis
-- pays for every argument of a script (most of a decision's cost, in a batch), so what
-- calls share is sent once. ARGV: the number of profiles; whether the calls' first keys
-- are known to be distinct ("1") or not ("0"); each profile (the index of its step, its
-- number of keys, then a step's arguments, decode.lua's, with a lease of '' when each
-- call sends its own, and a time of '*' when each call sends its own, from the store's
-- clock, or '' for Redis's, read once for the batch); then per call the index of its
-- profile (only when there are several), its lease and its time if it has its own, and
-- its keys' names. It returns, per call, its Outcome's five numbers, and for a take with
-- a receipt (taken TAKENNOW) the instant it was decided at. The state of each call's first key is read ahead, for the steps that
-- read it (readsAhead): with one MGET on a single server; on a cluster (touchFirst: see
-- cluster.lua), where one command may not span slots, with one MGET per key in a pass
-- that touches every key first, so that a key the node does not hold fails the script
-- before it writes anything. A key a batch names twice is read ahead only for its first
-- call; the later ones read it after the earlier writes. Every step gets the batch's own
-- KEYS and ARGV tables, filled anew for each call, and returns its five values.
local clock, profiles, a = nil, {}, 3
for p = 1, tonumber(ARGV[1]) do
  local now = ARGV[a + 7]
  if now == '' then -- the server's time: read once for the batch, one instant for all
    clock = clock or serverTime()
    now = clock
  elseif now ~= '*' then -- '*': each call has its own
    now = tonumber(now)
  end
  profiles[p] = {tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
    tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), now, tonumber(ARGV[a + 8]), ARGV[a + 9],
    tonumber(ARGV[a + 10]), tonumber(ARGV[a + 11]), tonumber(ARGV[a + 12]), tonumber(ARGV[a + 13]),
    tonumber(ARGV[a + 14])}
  a = a + 15
end
local only = #profiles == 1 and profiles[1] -- the usual batch: no index per call
local distinct = ARGV[2] == '1'
local last = #ARGV
if only and distinct and not touchFirst and only[2] > 0 then
  -- the usual batch, on one server: every call in turn from ARGV[a], its lease and time if
  -- it has its own, then its keys; no table indexed by call (Lua rehashes a growing table
  -- at every power of two), and one MGET of the first keys without a table of their names
  -- where a call is only its key
  local p, nk, off = only, only[2], 0
  local ownLease, ownNow = p[10] == '', p[8] == '*'
  if ownLease then off = off + 1 end
  if ownNow then off = off + 1 end
  local stride = off + nk
  local receipt = p[15] == TAKENNOW -- each call's answer carries the instant of its take
  local states = {}
  if readsAhead[p[1]] then
    if stride == 1 then
      states = redis.call('MGET', unpack(ARGV, a, last))
    else
      local names, j = {}, 0
      for from = a + off, last, stride do j = j + 1; names[j] = ARGV[from] end
      states = redis.call('MGET', unpack(names))
    end
  end
  -- out and argv made at their sizes: a table grown one entry at a time is rehashed at
  -- every power of two
  local each = 5
  if receipt then each = 6 end
  local out = {unpack(ARGV, 1, each * (last - a + 1) / stride)}
  local step, o, keys, argv, i = steps[p[1]], 0, {}, {false, false, false, false, false, false, false, false, false, false, false, false, false, false}, 0
  local lease, now = p[10], p[8]
  argv[9], argv[10], argv[11], argv[12], argv[13] = p[11], p[12], p[13], p[14], p[15] -- the profile's keep, window and taken, once
  for from = a, last, stride do
    i = i + 1
    if ownLease then lease = ARGV[from] end
    if ownNow then now = tonumber(ARGV[from + off - 1]) end
    for j = 1, nk do keys[j] = ARGV[from + off + j - 1] end
    argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], argv[7], argv[8], argv[14] =
      p[3], p[4], p[5], p[6], p[7], now, p[9], lease, states[i]
    if receipt then
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = step(keys, argv)
    else
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = step(keys, argv)
    end
    o = o + each
  end
  return out
end
-- each call: its profile, its lease, where its keys start in ARGV; no table of its own
local prof, leases, nows, at, ahead, na, seen, nc = {}, {}, {}, {}, {}, 0, {}, 0
while a <= last do
  local p = only
  if not p then
    p = profiles[tonumber(ARGV[a])]
    a = a + 1
  end
  local lease, now = p[10], p[8]
  if lease == '' then -- a lease of its own
    lease = ARGV[a]
    a = a + 1
  end
  if now == '*' then -- a time of its own
    now = tonumber(ARGV[a])
    a = a + 1
  end
  nc = nc + 1
  prof[nc], leases[nc], nows[nc], at[nc] = p, lease, now, a
  if distinct then
    if readsAhead[p[1]] then na = na + 1; ahead[na] = nc end
  else
    local k = ARGV[a]
    if readsAhead[p[1]] and not seen[k] then na = na + 1; ahead[na] = nc end
    seen[k] = true
  end
  a = a + p[2]
end
local pre = {}
if touchFirst then
  local wants = {}
  for _, i in ipairs(ahead) do wants[i] = true end
  for i = 1, nc do
    for j = 0, prof[i][2] - 1 do
      local k = ARGV[at[i] + j]
      if j == 0 and wants[i] then
        pre[i] = redis.call('MGET', k)[1]
      else
        redis.call('EXISTS', k)
      end
    end
  end
elseif na > 0 then
  local names = {}
  for j = 1, na do names[j] = ARGV[at[ahead[j]]] end
  local states = redis.call('MGET', unpack(names))
  for j = 1, na do pre[ahead[j]] = states[j] end
end
-- every step gets the same two tables, filled anew for each call
local out, o, keys, argv, nk = {}, 0, {}, {}, 0
for i = 1, nc do
  local p, from = prof[i], at[i]
  for j = 1, p[2] do keys[j] = ARGV[from + j - 1] end
  for j = p[2] + 1, nk do keys[j] = nil end
  nk = p[2]
  argv[1], argv[2], argv[3], argv[4], argv[5], argv[6], argv[7], argv[8], argv[9], argv[10], argv[11], argv[12], argv[13], argv[14] =
    p[3], p[4], p[5], p[6], p[7], nows[i], p[9], leases[i], p[11], p[12], p[13], p[14], p[15], pre[i]
  if p[15] == TAKENNOW then
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = steps[p[1]](keys, argv)
    o = o + 6
  else
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = steps[p[1]](keys, argv)
    o = o + 5
  end
end
return out
