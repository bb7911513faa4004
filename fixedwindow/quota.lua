-- The quota's calendar window, as quotaStep in quota.go: L is the count of the window
-- that ends at A; H, after a reset, the floor of the receipts it refunds (":floor:0").
-- The store sends the window around its own time and the next (window_start,
-- window_end, window_next); the time here (Redis's own, unless the store sends its
-- clock's) chooses the window among them.
if not (window_start and window_end and window_next and window_start < window_end and window_end < window_next) then
  error('quota: no calendar window')
end
if rewound > 0 then -- calendar windows are not periodic: back to now's, and the takes before are of another moment
  H = format(':%d:0', max(T + rewound, floorOf(H)))
  T = now
end
local t = now
if L > 0 or T ~= 0 then t = max(T, now) end
local ending = windowEnd(t, window_start, window_end, window_next)
if L > 0 and A ~= ending and rewound == 0 then L = 0 end -- a rewound key carries its count
T, A = t, ending
if op == RESET then -- void: an empty window keeps nothing (but a floor of this window); else empty, with a floor at its instant
  redis.call('DEL', KEYS[1])
  if L == 0 and (H == '' or windowEnd(floorOf(H), window_start, window_end, window_next) ~= ending) then
    T, A, t, H = 0, 0, now, ''
    ending = windowEnd(t, window_start, window_end, window_next)
  else
    voided, L, H = t, 0, format(':%d:0', max(t, floorOf(H)))
  end
end
if op == REFUND or op == PROBE then
  if taken > floorOf(H) and taken <= T and windowEnd(taken, window_start, window_end, window_next) == ending then
    gave = min(n, max(0, L))
    L = L - gave
  end
  n, dry = refunded(KEYS[1], state, dry, T, L, A, H)
elseif op == DEBIT then
  L = min(L + n, MAXDEBT)
  n, dry = debited(KEYS[1], T, L, A, ending - now, H)
end

L, allowed, remaining, retry, reset = count(L, n, keep, limit, ending, now)
save(KEYS[1], dry, T, L, A, reset, H)
at = T
if voided and windowEnd(voided, window_start, window_end, window_next) > now then
  voided_state(KEYS[1], voided, 0, 0, H, windowEnd(voided, window_start, window_end, window_next) - now)
end
