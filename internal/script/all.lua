-- ApplyAll's script (redisstore): every request's step runs first as a peek, writing
-- nothing, and then, if every one is allowed, as a take. ARGV: for each request, the
-- index of its step and its number of keys, then its arguments as a single step's
-- (decode.lua); KEYS: each request's keys in turn. The time, where a request's is empty,
-- is the one instant of Redis's clock the script reads. It returns, per request, its
-- Outcome's five numbers and the instant it was decided at (a receipt's).
local keys, argvs, step, k, a, clock, nreq = {}, {}, {}, 1, 1, nil, 0
while a <= #ARGV do
  nreq = nreq + 1
  step[nreq] = steps[tonumber(ARGV[a])]
  local nkeys = tonumber(ARGV[a + 1])
  keys[nreq] = {}
  for j = 1, nkeys do
    keys[nreq][j] = KEYS[k]
    k = k + 1
  end
  local argv = {}
  for j = 1, 13 do
    if j == 8 then argv[j] = ARGV[a + 1 + j] else argv[j] = tonumber(ARGV[a + 1 + j]) end
  end
  if not argv[6] then
    clock = clock or serverTime()
    argv[6] = clock
  end
  argvs[nreq] = argv
  a = a + 15
end
local out, all = {}, true
for i = 1, nreq do
  local dry = {unpack(argvs[i])}
  dry[7] = PEEK -- the decision a take would give, writing nothing
  local d = {step[i](keys[i], dry)}
  for j = 1, 6 do out[(i - 1) * 6 + j] = d[j] end
  if d[1] == 0 then all = false end
end
if all then
  for i = 1, nreq do
    local d = {step[i](keys[i], argvs[i])}
    for j = 1, 6 do out[(i - 1) * 6 + j] = d[j] end
  end
end
return out
