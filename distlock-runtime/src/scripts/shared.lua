-- SHARED: the value of a lock key held shared or as permits (scripts/holders.lua): no owner
-- token (tokens are hex digits, marked ones start with `~`), and it lives until the last live
-- member's expiry. So a lock key that exists is held, and only a lock key that holds a token is
-- held exclusively: an exclusive acquire is decided by its `SET NX` alone, and never looks at
-- the holders.
local SHARED = 'holders'
