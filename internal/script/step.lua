-- A step as a function of its keys and arguments, which a script calls once or once per
-- call of a batch; it returns its Outcome's five numbers (allowed (0 or 1), remaining,
-- retry after, reset after and delay, in us), then the instant it decided at and what a
-- refund gave back (script.Reply). package script fills the places marked by a
-- bracketed comment with the prologue and the algorithm's own part.
steps[#steps + 1] = function(KEYS, ARGV)
  local allowed, remaining, retry, reset, delay = 0, 0, 0, 0, 0
--[[decode]]
--[[state]]
--[[step]]
  return allowed, remaining, retry, reset, delay, at, gave
end
readsAhead[#steps] = --[[readsAhead]]
