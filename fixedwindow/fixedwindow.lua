-- The fixed window, as step in fixedwindow.go: L is the count of the window holding T.
local t = now
if L > 0 then
  t = max(T, now)
  if floor(T / period) ~= floor(t / period) then L = 0 end
end
T = t
if op == REFUND then
  L = max(0, L - n)
  n, dry = refunded(KEYS[1], state, dry, T, L, A)
end
local ending = (floor(t / period) + 1) * period
if op == DEBIT then
  L = min(L + n, MAXDEBT)
  n, dry = debited(KEYS[1], T, L, A, ending - now)
end

L, allowed, remaining, retry, reset = count(L, n, keep, limit, ending, now)
save(KEYS[1], dry, T, L, A, reset)
