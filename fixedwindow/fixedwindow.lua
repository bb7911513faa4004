-- The fixed window, as step in fixedwindow.go: L is the count of the window holding T;
-- H, after a reset, the floor of the receipts it refunds (":floor:0").
if rewound > 0 then H = format(':%d:0', max(T + rewound, floorOf(H))) end -- the takes before are of another moment
local t = now
if L > 0 or T ~= 0 then t = max(T, now) end
if L > 0 and floor(T / period) ~= floor(t / period) then L = 0 end
T = t
if op == RESET then -- void: an empty window keeps nothing (but a floor of this window); else empty, with a floor at its instant
  redis.call('DEL', KEYS[1])
  if L == 0 and floor(floorOf(H) / period) < floor(t / period) then
    T, t, H = 0, now, ''
  else
    voided, L, H = t, 0, format(':%d:0', max(t, floorOf(H)))
  end
end
if op == REFUND or op == PROBE then
  if taken > floorOf(H) and taken <= T and floor(taken / period) == floor(t / period) then
    gave = min(n, max(0, L))
    L = L - gave
  end
  n, dry = refunded(KEYS[1], state, dry, T, L, A, H)
end
local ending = (floor(t / period) + 1) * period
if op == DEBIT then
  L = min(L + n, MAXDEBT)
  n, dry = debited(KEYS[1], T, L, A, ending - now, H)
end

L, allowed, remaining, retry, reset = count(L, n, keep, limit, ending, now)
save(KEYS[1], dry, T, L, A, reset, H)
at = T
if voided then voided_state(KEYS[1], voided, 0, 0, H, (floor(voided / period) + 1) * period - now) end
