-- The quota's calendar window, as quotaStep in quota.go: L is the count of the window
-- that ends at A. ARGV[10] is "start:end:next", the window around the store's time and
-- the next; the time here (Redis's own, unless the store sends its clock's) chooses the
-- window among them.
local ws, we, wn = string.match(ARGV[10] or '', '^(-?%d+):(-?%d+):(-?%d+)$')
ws, we, wn = tonumber(ws), tonumber(we), tonumber(wn)
if not (ws and we and wn and ws < we and we < wn) then
  error('quota: ARGV[10] holds no calendar window')
end
if rewound > 0 then T = now end -- calendar windows are not periodic: back to now's
local t = now
if L > 0 then t = max(T, now) end
local ending
if t < ws then -- the window before the store's: it ends where the store's starts
  ending = ws
elseif t < we then
  ending = we
elseif t < wn then
  ending = wn
else -- further ahead than the store can see: windows as long as the next
  ending = wn + (floor((t - wn) / (wn - we)) + 1) * (wn - we)
end
if L > 0 and A ~= ending and rewound == 0 then L = 0 end -- a rewound key carries its count
T, A = t, ending
if op == 'refund' then
  L = max(0, L - n)
  n, dry = refunded(KEYS[1], state, dry, T, L, A)
end

if L + n + keep <= limit then
  L = L + n
  allowed = 1
else
  retry = ending - now
end
remaining = max(0, limit - L - keep)
if L > 0 then
  reset = ending - now
end
save(KEYS[1], dry, T, L, A, reset)
