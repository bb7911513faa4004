-- The head of a batch script on one server: one command may span all its keys.
local touchFirst = false
