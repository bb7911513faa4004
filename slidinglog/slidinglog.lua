-- The sliding log, as step in slidinglog.go: KEYS[2] is the log, a list of pairs
-- (instant, count) oldest first; L is the sum of the counts.
local log = KEYS[2]
local function int(x) -- an integer as Redis must store it: never in exponent notation
  return string.format('%.0f', x)
end
local entries = redis.call('LLEN', log) / 2
if entries == 0 then L = 0 end
local t = now
if entries > 0 then t = max(T, now) end
while entries > 0 do
  local oldest = redis.call('LRANGE', log, 0, 1)
  if t - tonumber(oldest[1]) < period then break end
  redis.call('LPOP', log, 2)
  L = L - tonumber(oldest[2])
  entries = entries - 1
end
T = t

if L + n <= limit then
  local newest = redis.call('LRANGE', log, -2, -1)
  if #newest == 2 and tonumber(newest[1]) == t then
    redis.call('LSET', log, -1, int(tonumber(newest[2]) + n))
  else
    redis.call('RPUSH', log, int(t), int(n))
    entries = entries + 1
  end
  L = L + n
  allowed = 1
else
  -- the oldest events must age out until n fit; read the log a page at a time
  local excess, aged, from = L + n - limit, 0, 0
  while retry == 0 do
    local page = redis.call('LRANGE', log, from, from + 255)
    if #page == 0 then -- a log shorter than its sum: retry when the newest event ages out
      retry = max(1, t + period - now)
    end
    for i = 1, #page, 2 do
      aged = aged + tonumber(page[i + 1])
      if aged >= excess then
        retry = tonumber(page[i]) + period - now
        break
      end
    end
    from = from + 256
  end
end
remaining = max(0, limit - L)
if entries > 0 then
  reset = tonumber(redis.call('LINDEX', log, -2)) + period - now
  redis.call('PEXPIRE', log, max(1, -floor(-reset / 1000)))
end
save(reset)
return {allowed, remaining, retry, reset, delay}
