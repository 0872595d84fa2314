-- The holders of a key held shared or as permits: a sorted set H beside the lock key, one
-- member per lease, scored by the lease's expiry (Redis time, ms). A member lives while its
-- score is after now; an expired one is dropped by the next script that counts (a crashed
-- holder's share frees itself at its own expiry, whatever the others renew). H itself expires
-- no earlier than its last member (keep), so no key lives forever; the lock key holds SHARED
-- (shared.lua) no shorter than any live member (cover: until the same Redis time as the member's
-- score, PXAT, so the two clocks of a script, its commands' and TIME's, cannot part them), and a
-- release that leaves no live member deletes it.
-- A lease's mode, as the Rust side sends it (`LockMode` in mode.rs): 'x' exclusive (the lock
-- key's value, not a member), 'r' shared, or the decimal digits of N for one of N permits.
-- On a quorum a permit is held in a slot (docs/modes.md, "Semaphores on a quorum"): N slots per
-- key, each held by at most one live member, so that nodes granting different holders cannot
-- admit more than N between them. Its mode is 'N/i' for slot i of N (0 <= i < N), as an acquire
-- asks for it, or 'N/*' for whichever slot the lease's token holds, as a renewal or a release
-- names it (they do not know which slot was granted).
-- member(mode, token): a lease's member: its token when shared, 'N token' as one of N permits,
-- 'N/i token' in slot i (tokens hold no space), so that an operator's view tells them apart.
local function member(mode, token)
  if mode == 'r' then return token end
  return mode .. ' ' .. token
end
-- slot(mode): the slot a mode names (its digits, or '*' for whichever), nil outside slots.
local function slot(mode)
  return string.match(mode, '^%d+/([%d*]+)$')
end
-- in_slot(m): the slot member m holds and its token, nil for a member outside slots.
local function in_slot(m)
  return string.match(m, '^%d+/(%d+) (.+)$')
end
-- slot_taken(H, i, now): how long until slot i of the key whose holders are H is free for a new
-- lease, in ms, or nil when it is free now: it is taken while a live member holds slot i (of
-- any N), or a live member outside slots holds the key (a reader, or a permit a client counted
-- without slots), until the last of those expires.
local function slot_taken(H, i, now)
  local members = redis.call('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE', 'WITHSCORES')
  local last = nil
  for j = 1, #members, 2 do
    local s = in_slot(members[j])
    if s == nil or s == i then last = tonumber(members[j + 1]) end
  end
  return last and last - now
end
-- leased(H, mode, token, now): the live members of the lease `token` in mode: its member, or for
-- 'N/*' the members that hold a slot by token; none when H is missing or of another type
-- (pcall).
local function leased(H, mode, token, now)
  local found = {}
  if slot(mode) ~= '*' then
    local m = member(mode, token)
    local score = redis.pcall('ZSCORE', H, m)
    if type(score) == 'string' and tonumber(score) > now then found[1] = m end
    return found
  end
  local members = redis.pcall('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE')
  if type(members) ~= 'table' or members.err then return found end
  for _, m in ipairs(members) do
    local _, owner = in_slot(m)
    if owner == token then found[#found + 1] = m end
  end
  return found
end
-- live(H, now): drops expired members, and returns how many are left.
local function live(H, now)
  redis.call('ZREMRANGEBYSCORE', H, '-inf', now)
  return redis.call('ZCARD', H)
end
-- keep(H, ms): H lives at least ms more (a new or renewed member's lifetime): its expiry is set
-- if it has none, else raised if it is sooner.
local function keep(H, ms)
  if redis.call('PEXPIRE', H, ms, 'NX') == 0 then redis.call('PEXPIRE', H, ms, 'GT') end
end
-- cover(L, at): the lock key L, free of a writer, holds SHARED (scripts/shared.lua) at least
-- until Redis time `at` (ms, a member's score): set if it is free, its expiry raised if it holds
-- SHARED already (a writer's token is left as it is: callers hold L only where no writer does).
local function cover(L, at)
  if redis.call('SET', L, SHARED, 'NX', 'PXAT', at, 'GET') == SHARED then
    redis.call('PEXPIREAT', L, at, 'GT')
  end
end
-- hold(L, H, mode, token, ms, now, marked): the lease `token` holds the lock key L in `mode`
-- for ms from now (Redis time, ms): L set to the token (with the mark of a key waited on when
-- `marked`, see scripts/mod.rs) when exclusive, else its member added to L's holders H, and L
-- covering it (cover).
local function hold(L, H, mode, token, ms, now, marked)
  if mode == 'x' then
    redis.call('SET', L, marked and '~' .. token or token, 'PX', ms)
  else
    local at = now + tonumber(ms)
    redis.call('ZADD', H, at, member(mode, token))
    keep(H, ms)
    cover(L, at)
  end
end
-- fits(mode, H, now): whether a lease in mode fits beside L's live holders H, where no writer
-- holds L: an exclusive lease when no member is live (callers that know L is free of SHARED
-- know that without asking), a reader always, one of N permits when
-- fewer than N members are live, one in slot i when the slot is free (slot_taken).
local function fits(mode, H, now)
  if mode == 'x' then return redis.call('EXISTS', H) == 0 or live(H, now) == 0 end
  if mode == 'r' then return true end
  local count = live(H, now)
  local i = slot(mode)
  if i then return slot_taken(H, i, now) == nil end
  return count < tonumber(mode)
end
-- last_expiry(H, now): the expiry (Redis ms, digits) of the live member of H that expires last;
-- nil when none lives.
local function last_expiry(H, now)
  return redis.call('ZRANGE', H, '+inf', '(' .. now, 'BYSCORE', 'REV', 'LIMIT', 0, 1,
    'WITHSCORES')[2]
end
-- until_free(mode, H, now): how long until live holders make room for a lease in mode, in ms
-- (-1 when none holds): the last one's expiry for an exclusive lease or a reader (queued
-- behind a writer that waits for them), the first one's for a permit, slot_taken's for a slot.
local function until_free(mode, H, now)
  local i = slot(mode)
  if i then return slot_taken(H, i, now) or -1 end
  local at
  if mode == 'x' or mode == 'r' then
    at = last_expiry(H, now)
  else
    at = redis.call('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  end
  if not at then return -1 end
  return tonumber(at) - now
end
