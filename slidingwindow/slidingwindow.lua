-- The sliding window counter, as step in slidingwindow.go: L is the current window's
-- count, A the previous window's; unit is the tick in which elapsed time is weighed.
L, A = min(L, limit), min(A, limit)
local t = now
if L > 0 or A > 0 then
  t = max(T, now)
  local windows = floor(t / period) - floor(T / period)
  if windows == 1 then A, L = L, 0 elseif windows > 1 then A, L = 0, 0 end
end
T = t
if op == REFUND then
  L = max(0, L - n)
  n, dry = refunded(KEYS[1], state, dry, T, L, A)
end
local start = floor(t / period) * period
if op == DEBIT then
  L = min(L + n, limit)
  n, dry = debited(KEYS[1], T, L, A, start + 2 * period - now)
end
local ticks = floor(period / unit)
local elapsed = floor((t - start) / unit)
local weighted = A * (ticks - elapsed)

local need = n + keep
if L + need <= limit and weighted + (L + need) * ticks <= limit * ticks then
  L = L + n
  allowed = 1
else
  -- solve prev * (ticks - e) <= room * ticks for the tick e, here or in the next window
  local prev, room, from = A, limit - L - need, start
  if room < 0 then
    prev, room, from = L, limit - need, start + period
  end
  if room < 0 then -- more than limit less its reserve: never; when the key is empty
    retry = from + period - now
  else
    retry = from + (ticks - floor((room * ticks) / prev)) * unit - now
  end
end
remaining = max(0, limit - L + floor(-weighted / ticks) - keep)
if L > 0 then
  reset = start + 2 * period - now
elseif A > 0 then
  reset = start + period - now
end
save(KEYS[1], dry, T, L, A, reset)
