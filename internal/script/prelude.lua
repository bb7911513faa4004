-- What every script of this module defines once, before its steps (package script):
-- the library functions the steps use, the codes of the operations, Redis's clock, and
-- the helpers of the "T:L:A" state. Lua numbers are doubles, exact for integers below
-- 2^53; every quantity here is below 2^52 (mathx.MaxExact).
local floor, max, min, tonumber, format = math.floor, math.max, math.min, tonumber, string.format

-- the operations, as package script's Op codes (PROBE: a refund that writes nothing;
-- RETRYREFUND and RETRYDEBIT: a settlement tried again; GIVEBACK: a loan's refund)
local TAKE, PEEK, REFUND, RESET, EXTEND, DEBIT, PROBE, RETRYREFUND, RETRYDEBIT, GIVEBACK =
  0, 1, 2, 3, 4, 5, 6, 7, 8, 9

-- taken of a take with a receipt (ratelimit.TakenNow); the bound of the record of a
-- bucket's deficits (core's deficitsMax); an instant before every receipt's
local TAKENNOW, DEFICITS, MININSTANT = -1, 8, -4611686018427387904

-- the deepest a debit takes a key, in its Level's units (mathx.MaxExact): a debt the
-- scripts and Go count alike
local MAXDEBT = 4503599627370496

-- the least TTL of a key written, in milliseconds: 0, or redisstore.WithMinTTL's, which
-- the store writes here (for a fake clock, whose time stands still while Redis's passes)
local TTLFLOOR = 0

-- the steps of the script, and whether each reads the state of its first key (which a
-- batch may read ahead for it)
local steps, readsAhead = {}, {}

-- serverTime is the Redis server's clock, in microseconds since the Unix epoch.
local function serverTime()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- int is an integer as Redis stores it: %d (exact below 2^63) never writes an exponent, and
-- costs a fraction of %.0f.
local function int(x)
  return format('%d', x)
end

-- The marks of a key's settlements, after its state's tail: the instants of the takes a
-- refund or a debit settled (a Charge's), SETTLED at most, after a floor at or below which
-- older ones were dropped, "|floor|at|at...". A settlement tried again (RETRYREFUND,
-- RETRYDEBIT) whose take they hold, or is at or below the floor, landed already. The
-- state of the step now running keeps them in marks, which the writers below append.
local SETTLED, marks = 8, ''

-- settledAt reports whether the marks m hold the take at t, or drop it.
local function settledAt(m, t)
  local first = true
  for v in string.gmatch(m, '|(-?%d+)') do
    v = tonumber(v)
    if (first and t <= v) or (not first and v == t) then return true end
    first = false
  end
  return false
end

-- mark is the marks m with the take at t settled: past SETTLED, the oldest goes, and the
-- floor rises to it.
local function mark(m, t)
  local vals = {}
  for v in string.gmatch(m, '|(-?%d+)') do vals[#vals + 1] = tonumber(v) end
  local f, ats = vals[1] or 0, {}
  if t <= f then return m end
  for i = 2, #vals do
    if vals[i] == t then return m end
    ats[i - 1] = vals[i]
  end
  ats[#ats + 1] = t
  table.sort(ats)
  while #ats > SETTLED do f = max(f, table.remove(ats, 1)) end
  local parts = {format('|%d', f)}
  for i = 1, #ats do parts[i + 1] = format('|%d', ats[i]) end
  return table.concat(parts)
end

-- save writes the state back, with its tail H, with a TTL of reset, the microseconds
-- until the key is back to full (and worth nothing), rounded up to a whole millisecond;
-- a state worth nothing already (reset 0: a full bucket, an empty window) is deleted, as
-- a key never seen.
local function save(key, dry, T, L, A, reset, H)
  if dry then return end
  if reset <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, format('%d:%d:%d', T, L, A) .. H .. marks, 'PX', int(max(TTLFLOOR, -floor(-reset / 1000))))
  end
end

-- refunded writes a refunded state, keeping its TTL (a refund only brings the key's full
-- allowance nearer); the rest of the step then answers as a peek of 1: it returns the new
-- n and dry.
local function refunded(key, state, dry, T, L, A, H)
  if state and not dry then
    redis.call('SET', key, format('%d:%d:%d', T, L, A) .. H .. marks, 'KEEPTTL')
  end
  return 1, true
end

-- debited writes a debited state, with the TTL of reset, the microseconds until it is
-- back to full (a debit may take a key never seen); the rest of the step then answers
-- as a peek of 1, at the request's reserve: it returns the new n and dry.
local function debited(key, T, L, A, reset, H)
  redis.call('SET', key, format('%d:%d:%d', T, L, A) .. H .. marks, 'PX', int(max(1, TTLFLOOR, -floor(-reset / 1000))))
  return 1, true
end

-- voided writes what a reset of the key at t keeps (the algorithm's Void): the state
-- "t:L:A" and its tail H, for keep microseconds (rounded up to a millisecond).
local function voided_state(key, t, L, A, H, keep)
  if keep > 0 then
    redis.call('SET', key, format('%d:%d:%d', t, L, A) .. H .. marks, 'PX', int(max(1, TTLFLOOR, -floor(-keep / 1000))))
  end
end

-- floorOf is the floor of a window's tail H (":floor:0" after a reset), or MININSTANT.
local function floorOf(H)
  if H == '' then return MININSTANT end
  return tonumber(string.match(H, '^:(-?%d+):')) or MININSTANT
end

-- The record of a bucket's deficits (internal/core's receipts.go, in Go), kept in its
-- state's tail as ":instant:deficit" pairs, the instants never decreasing and the deficits
-- rising, the first the floor: read into two arrays, and written back.
local function hread(H)
  local ht, hm, k = {}, {}, 0
  for t, m in string.gmatch(H, ':(-?%d+):(-?%d+)') do
    k = k + 1
    ht[k], hm[k] = tonumber(t), tonumber(m)
  end
  return ht, hm
end

local function hwrite(ht, hm)
  local parts = {}
  for i = 1, #ht do parts[i] = format(':%d:%d', ht[i], hm[i]) end
  return table.concat(parts)
end

-- hnote adds the deficit m seen at t to a running record (core's note).
local function hnote(ht, hm, t, m)
  local k = #ht
  if k == 0 then return end
  t = max(t, ht[k])
  while k > 0 and hm[k] >= m do
    ht[k], hm[k] = nil, nil
    k = k - 1
  end
  k = k + 1
  ht[k], hm[k] = t, m
  if k > DEFICITS then -- the neighbours closest in proportion merge, the later instant with the smaller deficit
    local at, best = 1, -1
    for i = 1, k - 1 do
      local r = hm[i] / hm[i + 1]
      if r > best then at, best = i, r end
    end
    hm[at + 1] = hm[at]
    table.remove(ht, at)
    table.remove(hm, at)
  end
end

-- hrefund records a refund at t that gave back give of the take at taken, leaving the
-- deficit left: every entry from taken on falls by give, and those before read no more
-- than the first of them after its fall (core's NoteRefund).
local function hrefund(ht, hm, taken, give, t, left)
  local k = #ht
  if k == 0 or give <= 0 then return end
  local from = k + 1
  for i = 2, k do
    if ht[i] >= taken then from = i; break end
  end
  local ceiling = left
  if from <= k then ceiling = hm[from] - give end
  for i = from, k do hm[i] = hm[i] - give end
  local i = from - 1
  while i >= 2 and hm[i] >= ceiling do
    table.remove(ht, i)
    table.remove(hm, i)
    i = i - 1
  end
  hnote(ht, hm, t, left)
end

-- hleast is the least deficit since a take at taken, the key's now being deficit at T
-- (core's LeastDeficit).
local function hleast(ht, hm, taken, deficit, T)
  if #ht == 0 or taken <= 0 or taken <= ht[1] or taken > T then return 0 end
  for i = 2, #ht do
    if ht[i] >= taken then return min(hm[i], deficit) end
  end
  return max(0, deficit)
end

-- hforget is the tail of a bucket full (its deficit 0) at t: no record, but a floor at t
-- or later (a reset in this microsecond) (core's ForgetDeficits).
local function hforget(H, t)
  if H == '' then return H end
  local f = tonumber(string.match(H, '^:(-?%d+):'))
  if f and f >= t then return format(':%d:0', f) end
  return ''
end

-- hreceipt starts the record for a take with a receipt at t, unless it runs, and returns
-- the instant the take is decided at: past t when the newest entry is at t (core's
-- ReceiptAt).
local function hreceipt(ht, hm, t)
  if #ht == 0 then ht[1], hm[1] = t - 1, 0 end
  if ht[#ht] == t then return t + 1 end
  return t
end

-- hopen reads a bucket's record for a step at t, if it keeps one or the step is a take
-- with a receipt (which starts one): the record (false, false without one), and the
-- instant the step is decided at (hreceipt's, for such a take).
local function hopen(H, t, receipt)
  if H == '' and not receipt then return false, false, t end
  local ht, hm = hread(H)
  if receipt then t = hreceipt(ht, hm, t) end
  return ht, hm, t
end

-- count admits n events to the window that ends at ending, whose count is L, if they fit
-- with keep: the fixed window's decision, and a calendar quota's (count in Go). It
-- returns the new count, and allowed, remaining, retry and reset.
local function count(L, n, keep, limit, ending, now)
  local allowed, retry, reset = 0, 0, 0
  if L + n + keep <= limit then
    L = L + n
    allowed = 1
  else
    retry = ending - now
  end
  if L > 0 then reset = ending - now end
  return L, allowed, max(0, limit - L - keep), retry, reset
end

-- windowEnd is the end of the calendar window that holds t, of the window [ws, we) the
-- store placed around its own time and the next, [we, wn): the deciding clock may be a
-- little ahead of or behind the store's. A time before ws falls in the window that ends
-- at ws; one from wn on in windows as long as [we, wn).
local function windowEnd(t, ws, we, wn)
  if t < ws then return ws end
  if t < we then return we end
  if t < wn then return wn end
  return wn + (floor((t - wn) / (wn - we)) + 1) * (wn - we)
end
