-- A script that decides alone: its arguments come as strings, the lease kept as one (see
-- decode.lua), and the time is Redis's own when it is empty.
local argv = {}
for i = 1, #ARGV do
  if i == 8 then argv[i] = ARGV[i] else argv[i] = tonumber(ARGV[i]) end
end
argv[6] = argv[6] or serverTime()
return {steps[1](KEYS, argv)}
