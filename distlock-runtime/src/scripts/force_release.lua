-- FORCE_RELEASE: frees a lock whoever holds it, in whatever mode, as a release would: every
-- holder is dropped and told so, then its fair queue is served (admit), and the release
-- announced to waiters unless a writer was handed it.
-- KEYS: the lock key L, its queue Q, its queue's entries W (see fair/entry.lua), its
--   fencing counter F, its holders H (scripts/holders.lua).
-- ARGV[1]: the command that announces a release (PUBLISH, or SPUBLISH on a cluster).
-- ARGV[2]: the channel of forced releases (forced.rs), on which the holders' owner tokens
--   (space-separated), a newline and the key ARGV[3] are PUBLISHed (a cluster carries a PUBLISH
--   to every node), so that the holders' managers end their leases at once.
-- ARGV[3]: the lock's key, as requested.
-- Returns 1 when the lock was held, 0 when it was free.
local publish, forced = ARGV[1], ARGV[2]
local L, Q, W, F, H = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local held = redis.call('EXISTS', L) == 1
  or (redis.call('EXISTS', H) == 1 and redis.call('ZCOUNT', H, '(' .. now, '+inf') > 0)
if not held then return 0 end
-- The holders' owner tokens: the lock key's value without its waited-on mark `~`, and each
-- live member's last word (a member is the token, after its mode for a permit: holders.lua).
-- pcall: a key of another type holds no lease of ours.
local tokens = {}
local owner = redis.pcall('GET', L)
if type(owner) == 'string' and owner ~= SHARED then tokens[1] = string.gsub(owner, '^~', '') end
local members = redis.pcall('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE')
if type(members) == 'table' then
  for _, member in ipairs(members) do tokens[#tokens + 1] = string.match(member, '(%S+)$') end
end
redis.call('DEL', L, H)
-- pcall: a user without channel rights still releases; its holders learn at their renewal.
if #tokens > 0 then
  redis.pcall('PUBLISH', forced, table.concat(tokens, ' ') .. '\n' .. ARGV[3])
end
-- The fair queue's functions, put here by the composition, as in release.lua.
--[[ queue functions ]]
local served, writer = false, false
local waiting = redis.pcall('LLEN', Q)
if type(waiting) == 'number' and waiting > 0 then
  local _
  _, served, writer = admit(publish, L, Q, W, F, H, t, now, nil, nil, 'free')
end
-- Announced unless handed to a writer or to readers or permits with fair waiters still queued:
-- waiters that are not fair may fit beside those the queue was served to once nobody is queued.
if not served or (not writer and redis.call('EXISTS', Q) == 0) then
  redis.pcall(publish, L, '')
end
return 1
