-- RELEASE: releases the lock keys this owner still holds; never touches a key owned by
-- someone else.
-- KEYS: for each lock key four keys: the lock key L, its fair queue Q, its queue's entries W
--   (see fair/pop_live.lua) and its fencing counter F.
-- ARGV[1]: the owner token.
-- ARGV[2]: QUEUED ('1') when the owner may be queued as a fair waiter (one that gives up, or
--   whose attempt's outcome is unknown), which then leaves the queues too; '0' when it is not
--   (`Queued` in scripts/mod.rs).
-- ARGV[3]: the command that announces a release (PUBLISH, or SPUBLISH on a cluster).
-- ARGV[4]: ALWAYS ('1') to treat every key as waited on (a quorum's: see
--   `Route::announces`); '0' to announce only the release of a key marked as waited on
--   (`Announce` in scripts/mod.rs).
-- Returns the number of lock keys this owner held. One that nobody waited on (unmarked, see
-- scripts/mod.rs, "Waited on") is deleted. A marked one is handed to the oldest live fair
-- waiter if its queue has one (serve: a `h ...` message on the key's channel), else deleted
-- and announced with an empty message on the key's channel, for waiters (an announcement Redis
-- refuses, to an ACL user without channel rights, is skipped). A key that is not a string
-- (overwritten by someone) is not ours and is skipped (pcall), so it cannot keep the others
-- from being released; a queue key of another type holds no waiter.
local QUEUED, ALWAYS = '1', '1'
local token, queued, publish, always = ARGV[1], ARGV[2] == QUEUED, ARGV[3], ARGV[4] == ALWAYS
local released = 0
for i = 1, #KEYS, 4 do
  local L, Q, W = KEYS[i], KEYS[i + 1], KEYS[i + 2]
  if queued and redis.pcall('HDEL', W, token) == 1 then redis.call('LREM', Q, 1, token) end
  local owner = redis.pcall('GET', L)
  if owner == token and not always then
    -- Nobody waited on this lease (see scripts/mod.rs): nothing to hand over or announce.
    released = released + 1
    redis.call('DEL', L)
  elseif owner == token or owner == '~' .. token then
    released = released + 1
    -- The queue's first waiter, if any (pcall: a queue key of another type holds none).
    local head = redis.pcall('LPOP', Q)
    if type(head) ~= 'string' then head = nil end
    if head then
      -- The fair queue's functions are defined here, where a release hands over, so that one
      -- without a queue spends nothing on them: the composition (lua_spliced! in
      -- scripts/mod.rs) puts draw.lua and fair_*.lua in place of the marker below.
      --[[ draw pop_live hand serve ]]
      head = serve(publish, L, Q, W, KEYS[i + 3], head)
    end
    if not head then
      redis.call('DEL', L)
      -- pcall: a user without channel rights still releases; its waiters poll.
      redis.pcall(publish, L, '')
    end
  end
end
return released
