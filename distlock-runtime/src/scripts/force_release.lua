-- FORCE_RELEASE: deletes a lock whoever holds it, as a release would: its oldest live fair
-- waiter, if any, is handed the lock, else the deletion is announced to waiters.
-- KEYS: the lock key L, its queue Q, its queue's entries W (see fair/pop_live.lua), its
--   fencing counter F.
-- ARGV[1]: the command that announces a release (PUBLISH, or SPUBLISH on a cluster).
-- Returns 1 when a lock was held, 0 when the key was free.
local publish = ARGV[1]
local L, Q, W = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', L) == 0 then return 0 end
local head = redis.pcall('LPOP', Q)
if type(head) ~= 'string' then head = nil end
if head then
  -- The fair queue's functions are defined here, where the release hands over, as in
  -- release.lua: the composition puts draw.lua and fair_*.lua in place of the marker below.
  --[[ draw pop_live hand serve ]]
  head = serve(publish, L, Q, W, KEYS[4], head)
end
if not head then
  redis.call('DEL', L)
  redis.pcall(publish, L, '')
end
return 1
