-- The arguments of a step, by name, in the order of package script's Fields (a test
-- holds the two the same). A script that decides alone hands them over as numbers, its
-- lease as the string it came as (an id of 63 bits, more than a double holds exactly);
-- the time is Redis's own, read once for the script; a window is nil for an algorithm
-- without one.
local n, limit, period, unit, rate, now, op, lease, keep, window_start, window_end, window_next, taken =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13]
-- what a step returns beside its Outcome: the instant it decided at (the key's latest,
-- for a take's receipt), and what a refund gave back
local at, gave = now, 0
