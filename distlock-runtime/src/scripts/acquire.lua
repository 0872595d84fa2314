-- ACQUIRE: takes every lock key at once, each in its mode, or none: the acquire of every
-- request that is not fair, for one key or several.
-- KEYS: the lock keys L1..Ln (sorted, de-duplicated), then their fencing counters F1..Fn (see
--   draw.lua), then, unless every key is taken exclusively, their holders H1..Hn
--   (scripts/holders.lua), their fair queues Q1..Qn and the queues' entries W1..Wn (see
--   fair/entry.lua), in the same order. An exclusive request needs no more: a key held shared
--   or as permits holds SHARED (scripts/shared.lua).
-- ARGV[1]: the owner token.
-- ARGV[2]: the ttl in ms.
-- ARGV[3]: whether this request waits (`Waiting` in scripts/mod.rs): WAITED ('1') when it has
--   waited for a key already (it competed with other waiters, who may still wait: the keys it
--   takes exclusively are marked as waited on), '0' when it has not yet, NEVER ('-') when it
--   will not wait at all (a try-lock, which marks nothing).
-- ARGV[4]: the keys' modes, one word each, space-separated: 'x' exclusive, 'r' shared, N for
--   one of N permits, or 'N/i' for slot i of N permits, as a quorum holds them
--   (scripts/holders.lua).
-- ARGV[5] (optional): a proposed fencing token, the least one drawn (draw's floor).
-- A key is free for an exclusive lease when its lock key does not exist (no other owner holds it
-- exclusively, and it does not hold SHARED: no live member holds it shared or as a permit); for a
-- shared one when no other owner holds it exclusively and no live fair waiter is queued (readers
-- that are not fair do not overtake a queued writer; waiters whose wait has passed are dropped
-- from the queue); for one of N permits when, besides, fewer than N live members hold it; for slot
-- i of N permits when, besides, no live member holds slot i, and none holds the key outside slots
-- (slot_taken).
-- Returns the fencing token (its decimal digits) when every key was free (or already held by this
-- token, so a retried request after a lost answer is harmless) and is now taken for the ttl; {0,
-- i, pttl} when some key is not free, where i is the 1-based index of the first such key and pttl
-- the longest time in ms until the keys not free make room (-1 when one has no expiry, or only
-- fair waiters are in the way; SHARED expires with the last member). No key is taken then; the
-- first key not free is marked as waited on (see scripts/mod.rs, "Waited on") when another owner
-- holds it exclusively, since that is the key a waiter waits for (a release of shared holders or
-- permits announces itself anyway, and fair waiters are handed the key by message). A retried
-- request that finds its own token takes the key as it is, with a new fencing token.
-- A lock key of another type (another program's) fails the script with WRONGTYPE, no key
-- taken (a held key before it may have been marked); a counter of another type is overwritten
-- (draw.lua).
-- ARGV[3]'s values that the script tells apart, and the exclusive mode.
local WAITED, NEVER, EXCLUSIVE = '1', '-', 'x'
local token = ARGV[1]
-- What a free key is set to.
local value = ARGV[3] == WAITED and '~' .. token or token
-- The value the one-key exclusive path below found (another owner's, SHARED, or ours: a
-- retried request); false when it took the key and draw must draw its token.
local owner = nil
-- The Redis time of a one-key path that took its key and left its token to draw.
local taken_at = nil
if ARGV[4] == EXCLUSIVE then
  -- One key, exclusive: taken if its lock key does not exist, in one command (no member holds
  -- it then, see scripts/shared.lua).
  owner = redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2], 'GET')
  if not owner then
    taken_at = redis.call('TIME')
    local drawn = not ARGV[5] and draw_now(taken_at, KEYS[2], ARGV[2])
    if drawn then return drawn end
  end
end
if (ARGV[4] == 'r' or tonumber(ARGV[4])) and redis.call('EXISTS', KEYS[4]) == 0 then
  -- One key, shared or a permit, with nobody queued: SHARED set unless a writer holds it (its
  -- answer says which, and a writer's answer comes first); then the lease joins the holders
  -- (join.lua), or, a permit that does not fit, goes on below.
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local found = redis.call('SET', KEYS[1], SHARED, 'NX', 'PXAT', now + tonumber(ARGV[2]), 'GET')
  if not found or found == SHARED then
    if join(KEYS[1], KEYS[3], ARGV[4], token, ARGV[2], now, found and 'shared' or 'set') then
      local drawn = not ARGV[5] and draw_now(t, KEYS[2], ARGV[2])
      if drawn then return drawn end
      taken_at = t
    end
  end
end
-- The fencing draw's functions (counter.lua, draw.lua), put here by the composition
-- (lua_spliced! in scripts/mod.rs): the one-key paths above spend nothing on them.
--[[ draw ]]
if taken_at then return draw(KEYS, 2, 2, ARGV[2], taken_at, ARGV[5]) end
-- The owner check and the mark, put here by the composition: a free key's acquire above spends
-- nothing on them.
--[[ owner ]]
-- Marks a key held by another owner exclusively as waited on (see scripts/mod.rs): its release
-- will announce itself. A try-lock does not wait, and marks nothing; a key holding SHARED is
-- announced by its last member's release anyway.
local function mark(key, holder)
  if ARGV[3] ~= NEVER and holder ~= SHARED and not is_marked(holder) then
    redis.call('SET', key, '~' .. holder, 'KEEPTTL')
  end
end
if owner then
  if not is_owner(owner, token) then
    mark(KEYS[1], owner)
    return {0, 1, redis.call('PTTL', KEYS[1])}
  end
  -- Ours already (a retried request that ran late): the ttl counts from now.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return draw(KEYS, 2, 2, ARGV[2], redis.call('TIME'), ARGV[5])
end
-- The holders' functions and head_live, put here the same way: the common cases above spend
-- nothing on them.
--[[ holders ]]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local modes = {}
for word in string.gmatch(ARGV[4], '%S+') do modes[#modes + 1] = word end
local n = #modes
-- Whether key i is ours already, and else how long until it is free (ms, -1 for no expiry),
-- or nil when it is free now; and its exclusive owner, if another. Only a request with a key
-- not taken exclusively sends holders and queues (H, Q, W).
local function blocked(i)
  local L, mode = KEYS[i], modes[i]
  local holder = redis.call('GET', L)
  if mode == EXCLUSIVE then
    if is_owner(holder, token) then return nil end
    -- Held by a writer, or by members until SHARED expires.
    if holder then return redis.call('PTTL', L), holder end
    return nil
  end
  if holder and holder ~= SHARED then return redis.call('PTTL', L), holder end
  local H, Q, W = KEYS[2 * n + i], KEYS[3 * n + i], KEYS[4 * n + i]
  local score = redis.call('ZSCORE', H, member(mode, token))
  if score and tonumber(score) > now then return nil end
  if redis.call('EXISTS', Q) == 1 and head_live(Q, W, now) then
    local left = until_free(mode, H, now)
    return left > 0 and left or -1
  end
  if not fits(mode, H, now) then return until_free(mode, H, now) end
  return nil
end
local first, longest = 0, 0
for i = 1, n do
  local left, holder = blocked(i)
  if left then
    if first == 0 then
      first = i
      if holder then mark(KEYS[i], holder) end
    end
    if left < 0 then longest = -1 elseif longest >= 0 and left > longest then longest = left end
  end
end
if first > 0 then return {0, first, longest} end
for i = 1, n do
  local L, mode = KEYS[i], modes[i]
  -- A key of ours already marked as waited on stays marked.
  local waited_on = ARGV[3] == WAITED
    or (mode == EXCLUSIVE and redis.call('GET', L) == '~' .. token)
  hold(L, KEYS[2 * n + i], mode, token, ARGV[2], now, waited_on)
end
return draw(KEYS, n + 1, 2 * n, ARGV[2], t, ARGV[5])
