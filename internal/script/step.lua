-- A step as a function of its keys and arguments, which a script calls once or once per
-- call of a batch; it returns the five numbers of its Outcome: allowed (0 or 1),
-- remaining, retry after, reset after and delay (us). package script fills the places
-- marked by a bracketed comment with the prologue and the algorithm's own part.
steps[#steps + 1] = function(KEYS, ARGV)
  local allowed, remaining, retry, reset, delay = 0, 0, 0, 0, 0
--[[decode]]
--[[state]]
--[[step]]
  return allowed, remaining, retry, reset, delay
end
readsAhead[#steps] = --[[readsAhead]]
