-- What every script of this module defines once, before its steps (package script):
-- the library functions the steps use, the codes of the operations, Redis's clock, and
-- the helpers of the "T:L:A" state. Lua numbers are doubles, exact for integers below
-- 2^53; every quantity here is below 2^52 (mathx.MaxExact).
local floor, max, min, tonumber, format = math.floor, math.max, math.min, tonumber, string.format

-- the operations, as package script's Op codes
local TAKE, PEEK, REFUND, RESET, EXTEND, DEBIT = 0, 1, 2, 3, 4, 5

-- the deepest a debit takes a key, in its Level's units (mathx.MaxExact): a debt the
-- scripts and Go count alike
local MAXDEBT = 4503599627370496

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

-- save writes the state back with a TTL of reset, the microseconds until the key is back
-- to full (and worth nothing), rounded up to a whole millisecond; a state worth nothing
-- already (reset 0: a full bucket, an empty window) is deleted, as a key never seen.
local function save(key, dry, T, L, A, reset)
  if dry then return end
  if reset <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, format('%d:%d:%d', T, L, A), 'PX', int(-floor(-reset / 1000)))
  end
end

-- refunded writes a refunded state, keeping its TTL (a refund only brings the key's full
-- allowance nearer); the rest of the step then answers as a peek of 1: it returns the new
-- n and dry.
local function refunded(key, state, dry, T, L, A)
  if state and not dry then
    redis.call('SET', key, format('%d:%d:%d', T, L, A), 'KEEPTTL')
  end
  return 1, true
end

-- debited writes a debited state, with the TTL of reset, the microseconds until it is
-- back to full (a debit may take a key never seen); the rest of the step then answers
-- as a peek of 1, at the request's reserve: it returns the new n and dry.
local function debited(key, T, L, A, reset)
  redis.call('SET', key, format('%d:%d:%d', T, L, A), 'PX', int(max(1, -floor(-reset / 1000))))
  return 1, true
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
