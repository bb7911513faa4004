-- The token bucket, as step in tokenbucket.go: L is the tokens in units of 1/unit token.
local full = limit * unit
if A == unit then
  L = min(L, full)
elseif A == 0 then -- a key never seen: a full bucket
  L, T, A = full, now, unit
else -- the rule's unit changed: keep the whole tokens
  L = min(floor(L / A), limit) * unit -- a debt's fraction rounded down
  A = unit
end
local t = max(T, now)
local elapsed = t - T
if elapsed > 0 then
  if elapsed * rate >= full - L then L = full else L = L + elapsed * rate end
  T = t
end
local lag = t - now
if op == REFUND then
  L = min(full, L + n * unit)
  n, dry = refunded(KEYS[1], state, dry, T, L, A)
elseif op == DEBIT then
  L = max(L - n * unit, -MAXDEBT)
  n, dry = debited(KEYS[1], T, L, A, lag - floor(-(full - L) / rate))
end

local need = (n + keep) * unit
if L >= need then
  L = L - n * unit
  allowed = 1
else
  retry = lag - floor(-(need - L) / rate)
end
remaining = floor(L / unit) - keep
if remaining < 0 then remaining = 0 end
if L < full then
  reset = lag - floor(-(full - L) / rate)
end
save(KEYS[1], dry, T, L, A, reset)
