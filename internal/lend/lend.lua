-- Lend's script (redisstore, ratelimit.Lender): each loan decided in turn, as Decide
-- (lend.go, beside it) decides it in Go (a test holds the two the same). ARGV, per loan
-- (stride 24): the index of its step; a step's arguments (decode.lua's, with n 1, op
-- take (or debit, for a partial take's debit of want), the holder as the lease, keep 0
-- and taken 0); then give, want, share, ttl (us),
-- revoke ('1'; '2': end the holder's record; else '0'), its window (0: none; a period: the period-aligned window of
-- now; -1: the calendar window of its arguments), out and seq; then the names of its
-- state key and of its record of loans, a hash of holder ->
-- "out:until:limit:period:back:since:seq" (records written before seq: without it). The
-- time, where a loan's is empty, is the one instant of Redis's clock the script reads.
-- Per loan it returns the key's allowed, remaining, retry, reset and delay after the loan
-- (a take of what was lent, or a peek of one), then lent, for (us), kept (1 or 0), the
-- events the holder's record holds out after it, and the instant of its take (0 when it
-- lent nothing).
local stride, clock, out, o = 24, nil, {}, 0
-- closing reports whether now is in the last quarter of its window (win a period: the
-- period-aligned one; -1: the calendar window of ws, we and wn), as lend.go's closing.
local function closing(now, win, ws, we, wn)
  local start, e
  if win > 0 then
    start = floor(now / win) * win
    e = start + win
  elseif win < 0 then
    if now >= ws and now < we then
      start, e = ws, we
    else
      e = windowEnd(now, ws, we, wn)
      start = e - (wn - we)
    end
  else
    return false
  end
  return e > now and (e - now) * 4 <= e - start
end
if touchFirst then -- every key before any write, so that a key the node does not hold fails the script first
  for a = 1, #ARGV, stride do
    redis.call('EXISTS', ARGV[a + 22], ARGV[a + 23])
  end
end
for a = 1, #ARGV, stride do
  local step, argv = steps[tonumber(ARGV[a])], {}
  for j = 1, 13 do
    if j == 8 then argv[j] = ARGV[a + j] else argv[j] = tonumber(ARGV[a + j]) end
  end
  if not argv[6] then
    clock = clock or serverTime()
    argv[6] = clock
  end
  local now, limit, period, holder, debit = argv[6], argv[2], argv[3], argv[8], argv[7] == DEBIT
  local give, want, share = tonumber(ARGV[a + 14]), tonumber(ARGV[a + 15]), tonumber(ARGV[a + 16])
  local ttl, revoke, ending, win = tonumber(ARGV[a + 17]), ARGV[a + 18] == '1', ARGV[a + 18] == '2', tonumber(ARGV[a + 19])
  local lout, seq = tonumber(ARGV[a + 20]), tonumber(ARGV[a + 21])
  local keys, book = {ARGV[a + 22]}, ARGV[a + 23]
  argv[8], argv[13] = 0, 0 -- the step's lease, and taken: none
  -- the records: those that ended or were lent under another rule dropped, every other
  -- holder's for a revoke (and the holder's own below), the holder's own taken out
  local recs, partial = {}, holder == '0' -- a partial take: no record, and its reserve kept
  if not partial then
    argv[9] = 0
    -- every record only when the holders may be more than the shares (or for a revoke):
    -- else a loan lends by its shares whatever the others hold, and ended ones wait
    local n, r = 0, nil
    if not revoke then
      n = redis.call('HLEN', book)
      if n <= share then r = redis.call('HGET', book, holder) end
    end
    if revoke or n > share or n == share and not r then
      recs = redis.call('HGETALL', book)
    elseif r then
      recs = {holder, r}
    end
  end
  local mine, back, since, kept, holders, mseq, muntil, others = 0, 0, 0, false, 1, 0, 0, {}
  for i = 1, #recs, 2 do
    local r, u, l, p, b, s, q = string.match(recs[i + 1], '^(%d+):(%d+):(%d+):(%d+):(%d+):(-?%d+):?(%d*)$')
    r, u, l, p = tonumber(r), tonumber(u), tonumber(l), tonumber(p)
    if not r or u <= now or l ~= limit or p ~= period then
      redis.call('HDEL', book, recs[i])
    elseif recs[i] == holder then
      mine, back, since, kept, mseq, muntil = r, tonumber(b), tonumber(s), true, tonumber(q) or 0, u
    else
      others[#others + 1] = recs[i]
      if r > 0 then holders = holders + 1 end
    end
  end
  local late = kept and seq > 0 and seq <= mseq -- its holder settled it by a later loan: it changes nothing
  if revoke and not late then
    for _, h in ipairs(others) do redis.call('HDEL', book, h) end
    holders = 1
  end
  if late then
    local p = {unpack(argv)}
    p[7] = PEEK
    local allowed, remaining, retry, reset, delay = step(keys, p)
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = allowed, remaining, retry, reset, delay
    out[o + 6], out[o + 7], out[o + 8], out[o + 9], out[o + 10] = 0, mine > 0 and muntil - now or 0, 1, mine, 0
    o = o + 10
  else
    if kept then
      if back > 0 then -- what the key would still hold of the events out, as of since
        local pr = {unpack(argv)}
        pr[1], pr[7], pr[13] = back, PROBE, since
        local _, _, _, _, _, _, g = step(keys, pr)
        back = g
      end
      give = min(give, mine)
      if seq > 0 then -- what a loan whose answer was lost lent, or what one gave that did not land
        give = min(mine, give + max(0, mine - lout))
      end
      if give > 0 then
        local b = min(give, back)
        if b > 0 then
          local g = {unpack(argv)}
          g[1], g[7], g[13] = b, GIVEBACK, since
          step(keys, g)
          back = back - b
        end
        mine = mine - give
      end
    end
    if revoke then mine = 0 end -- every record, this holder's too: what it holds was lent before
    local p = {unpack(argv)}
    p[7] = PEEK
    local allowed, remaining, retry, reset, delay, lent = nil, nil, nil, nil, nil, 0
    if debit then -- a partial take's debit: all of want, whatever the key has left, then a peek of 1
      p[1], p[7] = want, DEBIT
      allowed, remaining, retry, reset, delay = step(keys, p)
      lent = want
    else
      allowed, remaining, retry, reset, delay = step(keys, p)
      if want > 0 and allowed == 1 then
        if closing(now, win, argv[10], argv[11], argv[12]) then holders = 1 end -- what the holders leave unlent now ends with the window
        lent = min(want, max(1, floor((remaining + 1) / max(share, holders)))) -- the last few events too, one to each asker
      end
      if lent > 0 then
        local t = {unpack(argv)}
        t[1], t[7] = lent, TAKE
        if not partial then t[13] = TAKENNOW end -- a loan may be given back
        local took
        allowed, remaining, retry, reset, delay, took = step(keys, t)
        if allowed ~= 1 then -- cannot be: no more was lent than is left
          lent = 0
        else
          since = took
        end
      end
    end
    mine = mine + lent
    back = min(back + lent, mine)
    local ends = now
    if ending then mine = 0 end -- what it holds out was spent: the record ends
    if (mine > 0 or seq > 0) and not partial and not ending then -- a numbered loan's record outlives its events: a loan arriving late finds it
      local e = now + max(1, ttl)
      if win > 0 then
        e = min(e, (floor(now / win) + 1) * win)
      elseif win < 0 then
        e = min(e, windowEnd(now, argv[10], argv[11], argv[12]))
      end
      redis.call('HSET', book, holder, format('%d:%d:%d:%d:%d:%d:%d', mine, e, limit, period, back, since, max(mseq, seq)))
      local need = max(TTLFLOOR, -floor(-(e - now) / 1000))
      if redis.call('PTTL', book) < need then redis.call('PEXPIRE', book, need) end
      if mine > 0 then ends = e end
    elseif kept then
      redis.call('HDEL', book, holder)
    end
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = allowed, remaining, retry, reset, delay
    if partial or mine <= 0 then mine = 0 end
    out[o + 6], out[o + 7], out[o + 8], out[o + 9], out[o + 10] = lent, ends - now, kept and 1 or 0, mine, lent > 0 and since or 0
    o = o + 10
  end
end
return out
