-- The leaky bucket, as step in leakybucket.go: L is the queued work in units of 1/unit request.
local full = limit * unit
if A == unit then
  L = min(L, full)
elseif A == 0 then -- a key never seen: an empty queue
  L, T, A = 0, now, unit
else -- the rule's unit changed: keep the queued requests whole
  L = min(-floor(-L / A), limit) * unit
  A = unit
end
local t = max(T, now)
local elapsed = t - T
if elapsed > 0 then
  if elapsed * rate >= L then L = 0 else L = L - elapsed * rate end
  T = t
end
local lag = t - now
if op == REFUND then
  L = max(0, L - n * unit)
  n, dry = refunded(KEYS[1], state, dry, T, L, A)
end

local need = (n + keep) * unit -- the slots it takes, and those it must leave
if L + need <= full then
  allowed = 1
  delay = lag - floor(-L / rate)
  L = L + n * unit
else
  retry = lag - floor(-(L + need - full) / rate)
end
remaining = floor((full - L) / unit) - keep
if remaining < 0 then remaining = 0 end
if L > 0 then
  reset = lag - floor(-L / rate)
end
save(KEYS[1], dry, T, L, A, reset)
