-- The arguments of a script that decides alone (see core.Script): n and the rule's four
-- from strings, and the time, Redis's own when ARGV[6] is empty. A batch's step has them
-- as numbers already, with the time the batch read once, and runs core.batchArgs instead.
local n, limit, period, unit, rate =
  tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = tonumber(ARGV[6]) or serverTime()
