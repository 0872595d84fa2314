-- EXTEND: extends several leases in one call, each only if its owner still holds every one of
-- its keys.
-- KEYS: the keys of every lease in the batch, lease after lease: for each of its keys, the
--   lock key when held exclusively, its holders (scripts/holders.lua) when shared or a permit;
--   then its fencing counter (scripts/draw.lua), which lives as long as the leases whose token
--   it holds, so that inspecting a lock held for long still shows its token; then, when shared
--   or a permit, the lock key, which holds SHARED (scripts/shared.lua) until the last live
--   member's expiry: set to it anew, so a renewal for less than before (`hold_at_least`, a
--   manual extend) shortens it too.
-- ARGV: for each lease, three values: owner token, new ttl in ms, and its keys' modes, one word
--   per key, space-separated ('x', 'r', N or 'N/*', scripts/holders.lua).
-- Returns one integer per lease: 1 when every key was held by the token (an exclusive one
-- marked as waited on or not; a member whose expiry has not passed, for 'N/*' any slot the
-- token holds) and now lives ttl more;
-- 0 when some key is gone, owned by another token or no longer of its type (pcall: one broken
-- lease never fails the batch), or held shared while a writer's token is in its lock key, in
-- which case none of that lease's keys is touched (a lost lock is never re-created or
-- prolonged). Calls is_owner (scripts/owner.lua), leased, keep and last_expiry
-- (scripts/holders.lua).
local EXCLUSIVE = 'x'
local now = nil
local results = {}
local k = 1
for a = 1, #ARGV, 3 do
  local token, ttl = ARGV[a], ARGV[a + 1]
  local modes = {}
  for word in string.gmatch(ARGV[a + 2], '%S+') do modes[#modes + 1] = word end
  local owned = 1
  -- Each key's live members of the lease (holders.lua's leased), when held by members.
  local members = {}
  -- Where each key's names start among KEYS: two for an exclusive key, three for the others.
  local at = {}
  local next_at = k
  for j, mode in ipairs(modes) do
    at[j] = next_at
    next_at = next_at + (mode == EXCLUSIVE and 2 or 3)
  end
  for j, mode in ipairs(modes) do
    local key = KEYS[at[j]]
    if mode == EXCLUSIVE then
      if not is_owner(redis.pcall('GET', key), token) then owned = 0 break end
    else
      if not now then
        local t = redis.call('TIME')
        now = t[1] * 1000 + math.floor(t[2] / 1000)
      end
      members[j] = leased(key, mode, token, now)
      if #members[j] == 0 then owned = 0 break end
      -- A writer in the lock key beside a live member: the member's lease is not one any more.
      local held = redis.pcall('GET', KEYS[at[j] + 2])
      if held and held ~= SHARED then owned = 0 break end
    end
  end
  if owned == 1 then
    for j, mode in ipairs(modes) do
      local key = KEYS[at[j]]
      if mode == EXCLUSIVE then
        redis.call('PEXPIRE', key, ttl)
      else
        for _, m in ipairs(members[j]) do
          redis.call('ZADD', key, 'XX', now + tonumber(ttl), m)
        end
        keep(key, ttl)
        -- SHARED until the last live member's expiry (this lease's, or a longer one's).
        redis.call('SET', KEYS[at[j] + 2], SHARED, 'PXAT', last_expiry(key, now))
      end
      redis.call('PEXPIRE', KEYS[at[j] + 1], ttl, 'GT')
    end
  end
  results[#results + 1] = owned
  k = next_at
end
return results
