-- The leaky bucket, as step in leakybucket.go: L is the queued work in units of 1/unit
-- request; H, the record of its deficits (the work queued) while a take with a receipt
-- may be refunded.
local full = limit * unit
if A == unit then
  L = min(L, full)
elseif A == 0 then -- a key never seen, or reset (whose time is the reset's): an empty queue
  L, A = 0, unit
  if T == 0 then T = now end
else -- the rule's unit changed: keep the queued requests whole, and no record
  L = min(-floor(-L / A), limit) * unit
  A, H = unit, ''
end
if rewound > 0 then H = format(':%d:0', max(T + rewound, floorOf(H))) end -- the takes before are of another moment
local t = max(T, now)
local elapsed = t - T
if elapsed > 0 then
  if elapsed * rate >= L then L = 0 else L = L - elapsed * rate end
  T = t
end
if L == 0 then H = hforget(H, t) end
local vfloor = 0
if op == RESET then -- void: an empty queue keeps nothing; else empty, with a floor at its instant
  redis.call('DEL', KEYS[1])
  if L == 0 and H == '' then
    T, t = now, now
  else
    voided, vfloor, L, H = T, max(T, floorOf(H)), 0, ''
  end
end
local receipt = taken == TAKENNOW and op == TAKE -- decided after every entry of the record
local ht, hm
ht, hm, t = hopen(H, t, receipt)
if receipt then T = t end
local lag = t - now
if op == REFUND or op == PROBE then
  local give = 0
  if ht then give = min(n * unit, hleast(ht, hm, taken, L, T)) end
  if give > 0 then
    L = L - give
    hrefund(ht, hm, taken, give, T, L)
    gave = floor(give / unit)
  end
  if ht then H = hwrite(ht, hm) end
  n, dry = refunded(KEYS[1], state, dry, T, L, A, H)
end

local need = (n + keep) * unit -- the slots it takes, and those it must leave
if L + need <= full then
  allowed = 1
  delay = lag - floor(-L / rate)
  if ht then hnote(ht, hm, t - 1, L) end
  L = L + n * unit
else
  retry = lag - floor(-(L + need - full) / rate)
end
remaining = floor((full - L) / unit) - keep
if remaining < 0 then remaining = 0 end
if L > 0 then
  reset = lag - floor(-L / rate)
end
if ht and not dry then H = hwrite(ht, hm) end
save(KEYS[1], dry, T, L, A, reset, H)
at = T
if voided then voided_state(KEYS[1], voided, 0, 0, format(':%d:0', vfloor), period) end
