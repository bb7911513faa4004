-- The sliding log, as step in slidinglog.go: KEYS[2] is the log, a list of pairs
-- (instant, count) oldest first; L is the sum of the counts; A is the floor of the
-- receipts it refunds.
local log = KEYS[2]
local entries = redis.call('LLEN', log) / 2
if entries == 0 then L = 0 end
-- the events of a rewound key keep their ages (core.Rewind): moved back in the list, or,
-- when nothing is written, by off wherever an instant is read
local off = 0
if rewound > 0 then A = max(A, T + rewound) end -- the takes before are of another moment
if rewound > 0 and entries > 0 then
  if dry then
    off = rewound
  else
    local all = redis.call('LRANGE', log, 0, -1)
    for i = 1, #all, 2 do all[i] = int(tonumber(all[i]) - rewound) end
    redis.call('DEL', log)
    for i = 1, #all, 1000 do redis.call('RPUSH', log, unpack(all, i, math.min(i + 999, #all))) end
  end
end
local t = now
if entries > 0 or T ~= 0 then t = max(T, now) end
-- the oldest entries that have aged out: trimmed, or only skipped when nothing is written
local skip = 0
while skip < entries do
  local oldest = redis.call('LRANGE', log, 2 * skip, 2 * skip + 1)
  if t - (tonumber(oldest[1]) - off) < period then break end
  L = L - tonumber(oldest[2])
  skip = skip + 1
end
local base = 0 -- where the live entries start in the list
if skip > 0 then
  if dry then base = 2 * skip else redis.call('LTRIM', log, 2 * skip, -1) end
end
entries = entries - skip
T = t
if op == RESET then -- void: an empty log keeps nothing; else empty, with a floor at its instant
  redis.call('DEL', KEYS[1], log)
  if entries > 0 or A >= t then voided = t end
  entries, L = 0, 0
end

if op == REFUND then -- take back up to n of the events of the take's instant (a refund is never dry)
  if taken > A and taken <= T then
    -- the entry of that instant, searched from the newest, a page at a time
    local last, found = entries - 1, false
    while last >= 0 and not found do
      local first = max(0, last - 127)
      local page = redis.call('LRANGE', log, base + 2 * first, base + 2 * last + 1)
      for i = #page - 1, 1, -2 do
        local at_ = tonumber(page[i]) - off
        if at_ == taken then
          local count = tonumber(page[i + 1])
          gave = min(n, count)
          local index = base + 2 * (first + (i - 1) / 2)
          if gave == count then
            redis.call('LSET', log, index, 'x')
            redis.call('LSET', log, index + 1, 'x')
            redis.call('LREM', log, 2, 'x')
            entries = entries - 1
          else
            redis.call('LSET', log, index + 1, int(count - gave))
          end
          L = L - gave
          found = true
          break
        elseif at_ < taken then
          found = true -- older than the take: its events are gone
          break
        end
      end
      last = first - 1
    end
  end
  n, dry = refunded(KEYS[1], state, dry, T, L, A, H)
end

local newestAt = false
if entries > 0 then newestAt = tonumber(redis.call('LINDEX', log, -2)) - off end
if L + n + keep <= limit then
  if not dry then
    if newestAt == t then
      redis.call('LSET', log, -1, int(tonumber(redis.call('LINDEX', log, -1)) + n))
    else
      redis.call('RPUSH', log, int(t), int(n))
    end
  end
  newestAt = t
  L = L + n
  allowed = 1
else
  -- the oldest events must age out until n (and keep) fit; read the log a page at a time
  local excess, aged, from = L + n + keep - limit, 0, base
  while retry == 0 do
    local page = redis.call('LRANGE', log, from, from + 255)
    if #page == 0 then -- a log shorter than its sum: retry when the newest event ages out
      retry = max(1, t + period - now)
    end
    for i = 1, #page, 2 do
      aged = aged + tonumber(page[i + 1])
      if aged >= excess then
        retry = tonumber(page[i]) - off + period - now
        break
      end
    end
    from = from + 256
  end
end
remaining = max(0, limit - L - keep)
if newestAt then
  reset = newestAt + period - now
  if not dry then
    redis.call('PEXPIRE', log, int(max(1, TTLFLOOR, -floor(-reset / 1000))))
  end
end
save(KEYS[1], dry, T, L, A, reset, H)
at = T
if voided then voided_state(KEYS[1], voided, 0, max(voided, A), '', period + voided - now) end
