-- The quota's calendar window, as quotaStep in quota.go: L is the count of the window
-- that ends at A. The store sends the window around its own time and the next
-- (window_start, window_end, window_next); the time here (Redis's own, unless the store
-- sends its clock's) chooses the window among them.
if not (window_start and window_end and window_next and window_start < window_end and window_end < window_next) then
  error('quota: no calendar window')
end
if rewound > 0 then T = now end -- calendar windows are not periodic: back to now's
local t = now
if L > 0 then t = max(T, now) end
local ending = windowEnd(t, window_start, window_end, window_next)
if L > 0 and A ~= ending and rewound == 0 then L = 0 end -- a rewound key carries its count
T, A = t, ending
if op == REFUND then
  L = max(0, L - n)
  n, dry = refunded(KEYS[1], state, dry, T, L, A)
elseif op == DEBIT then
  L = min(L + n, MAXDEBT)
  n, dry = debited(KEYS[1], T, L, A, ending - now)
end

L, allowed, remaining, retry, reset = count(L, n, keep, limit, ending, now)
save(KEYS[1], dry, T, L, A, reset)
