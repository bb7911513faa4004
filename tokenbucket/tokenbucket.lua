-- The token bucket, as step in tokenbucket.go: L is the tokens in units of 1/unit token;
-- H, the record of its deficits while a take with a receipt may be refunded.
local full = limit * unit
if A == unit then
  L = min(L, full)
elseif A == 0 then -- a key never seen, or reset (whose time is the reset's): a full bucket
  L, A = full, unit
  if T == 0 then T = now end
else -- the rule's unit changed: keep the whole tokens, and no record
  L = min(floor(L / A), limit) * unit -- a debt's fraction rounded down
  A, H = unit, ''
end
if rewound > 0 then H = format(':%d:0', max(T + rewound, floorOf(H))) end -- the takes before are of another moment
local t = max(T, now)
local elapsed = t - T
if elapsed > 0 then
  if elapsed * rate >= full - L then L = full else L = L + elapsed * rate end
  T = t
end
if L == full then H = hforget(H, t) end
local vfloor = 0
if op == RESET then -- void: a full bucket keeps nothing; else full, with a floor at its instant
  redis.call('DEL', KEYS[1])
  if L == full and H == '' then
    T, L, t = now, full, now
  else
    voided, vfloor, L, H = T, max(T, floorOf(H)), full, ''
  end
end
local receipt = taken == TAKENNOW and (op == TAKE or op == DEBIT) -- decided after every entry of the record
local ht, hm
ht, hm, t = hopen(H, t, receipt)
if receipt then T = t end
local lag = t - now
if op == REFUND or op == PROBE then
  local lack = full - L
  local give = 0
  if ht then give = min(n * unit, hleast(ht, hm, taken, lack, T)) end
  if give > 0 then
    L = L + give
    hrefund(ht, hm, taken, give, T, lack - give)
    gave = floor(give / unit)
  end
  if ht then H = hwrite(ht, hm) end
  n, dry = refunded(KEYS[1], state, dry, T, L, A, H)
elseif op == DEBIT then
  if ht then
    hnote(ht, hm, T - 1, full - L)
    H = hwrite(ht, hm)
  end
  L = max(L - n * unit, -MAXDEBT)
  n, dry = debited(KEYS[1], T, L, A, lag - floor(-(full - L) / rate), H)
end

local need = (n + keep) * unit
if L >= need then
  if ht then hnote(ht, hm, t - 1, full - L) end
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
if ht and not dry then H = hwrite(ht, hm) end
save(KEYS[1], dry, T, L, A, reset, H)
at = T
if voided then voided_state(KEYS[1], voided, 0, 0, format(':%d:0', vfloor), period) end
