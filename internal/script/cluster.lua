#!lua flags=allow-cross-slot-keys
-- The head of a batch script on Redis Cluster: its keys may sit in several slots of the
-- node (Redis 7), and it touches them all before it writes any (see coalesced.lua).
local touchFirst = true
