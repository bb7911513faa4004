-- The sliding window counter, as step in slidingwindow.go: L is the current window's
-- count, A the previous window's; unit is the tick in which elapsed time is weighed; H,
-- after a reset, the floor of the receipts it refunds (":floor:0").
L, A = min(L, limit), min(A, limit)
if rewound > 0 then H = format(':%d:0', max(T + rewound, floorOf(H))) end -- the takes before are of another moment
local t = now
if L > 0 or A > 0 or T ~= 0 then t = max(T, now) end
if L > 0 or A > 0 then
  local windows = floor(t / period) - floor(T / period)
  if windows == 1 then A, L = L, 0 elseif windows > 1 then A, L = 0, 0 end
end
T = t
if op == RESET then -- void: a key that counts nothing keeps nothing (but a floor of this window or the last); else empty, with a floor at its instant
  redis.call('DEL', KEYS[1])
  if L == 0 and A == 0 and floor(floorOf(H) / period) < floor(t / period) - 1 then
    T, t, H = 0, now, ''
  else
    voided, L, A, H = t, 0, 0, format(':%d:0', max(t, floorOf(H)))
  end
end
local start = floor(t / period) * period
if op == REFUND or op == PROBE then
  if taken > floorOf(H) and taken <= T then
    local from = floor(taken / period) * period
    if from == start then
      gave = min(n, max(0, L))
      L = L - gave
    elseif from == start - period then
      gave = min(n, max(0, A))
      A = A - gave
    end
  end
  n, dry = refunded(KEYS[1], state, dry, T, L, A, H)
end
if op == DEBIT then
  L = min(L + n, limit)
  n, dry = debited(KEYS[1], T, L, A, start + 2 * period - now, H)
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
save(KEYS[1], dry, T, L, A, reset, H)
at = T
if voided then voided_state(KEYS[1], voided, 0, 0, H, (floor(voided / period) + 2) * period - now) end
