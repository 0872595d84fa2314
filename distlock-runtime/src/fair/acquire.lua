-- FAIR_ACQUIRE: takes one lock key fairly, in a mode (scripts/holders.lua): only when it is free
-- for that mode and no live waiter arrived first; otherwise joins the key's queue, to be handed
-- the lock by a release.
-- KEYS: the lock key L, its queue Q, its queue's entries W (see fair/entry.lua), its
--   fencing counter F, its holders H (scripts/holders.lua).
-- ARGV[1]: the owner token.
-- ARGV[2]: the ttl in ms.
-- ARGV[3]: the claim time of a hand-off to this caller, in ms.
-- ARGV[4]: how long this caller's queue entry lasts from now, in ms: the wait it has left, at
--   most its presence (fair/request.rs); 0: it does not wait.
-- ARGV[5]: this attempt's secret (hex), which a hand-off to this caller will show.
-- ARGV[6]: the command that announces a hand-off (PUBLISH, or SPUBLISH on a cluster).
-- ARGV[7]: WAITED ('1') when this caller has waited already (a key it takes exclusively is
--   marked as waited on: others may still wait), else '0', or '-' for a try-lock (`Waiting` in
--   scripts/mod.rs).
-- ARGV[8]: the mode: 'x' exclusive, 'r' shared, or N for one of N permits.
-- Returns the fencing token (its decimal digits, like ACQUIRE: a reply the client reads
-- without parsing an array) when the caller holds the key now for the ttl: it was free for the
-- mode and the caller first in line, or it had been handed to the caller (whose attempt
-- confirms the hand-off and draws a new fencing token, greater than the hand-off's).
-- {0, pttl, now_ms} when the caller is queued (once, keeping its place on later attempts,
-- which move its deadline to ARGV[4] from now) behind what holds the key, which frees room for
-- it in pttl ms (-1: no expiry); an exclusive holder's value is then marked as waited on (see scripts/mod.rs,
-- "Waited on"; a release of shared or permit holders always looks at the queue). A caller that
-- does not wait (ARGV[4] is 0) is neither queued nor marks. An exclusive lock this caller takes
-- from its queue's head, or is handed, is marked too: others may be queued behind it. If the
-- key was free with live waiters queued, they are served first (admit), which may admit this
-- caller.
-- now_ms is Redis server time, which lets the caller date a hand-off it learns of by message.
-- The queue keys expire once no waiter in them can still be waiting.
local WAITED, EXCLUSIVE = '1', 'x'
local L, Q, W, F, H = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local token, ttl, claim, wait, secret = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local publish, waited, mode = ARGV[6], ARGV[7] == WAITED, ARGV[8]
local t = redis.call('TIME')
local owner = redis.call('GET', L)
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- Whether fair waiters are queued, once read.
local queued = nil
-- Whether the paths below took the key and left its token to draw.
local taken = false
if (not owner or (owner == SHARED and mode ~= EXCLUSIVE))
  and (mode == EXCLUSIVE or mode == 'r' or tonumber(mode)) then
  queued = redis.call('EXISTS', Q) == 1
  if queued then
    -- Served in order below.
  elseif mode == EXCLUSIVE then
    -- Free (no member holds it: scripts/shared.lua) and nobody queued: taken, before the
    -- functions below are defined (hold written out).
    redis.call('SET', L, waited and '~' .. token or token, 'PX', ttl)
    taken = true
  else
    -- No writer, nobody queued: a reader joins, a permit if it fits (join.lua).
    taken = join(L, H, mode, token, ttl, now, owner and 'shared' or 'free')
  end
  if taken then
    local drawn = draw_now(t, F, ttl)
    if drawn then return drawn end
  end
end
-- The functions the paths below call, put here by the composition (lua_spliced! in
-- scripts/mod.rs): the paths above spend nothing on them.
--[[ functions ]]
if taken then return draw(KEYS, 4, 4, ttl, t) end
-- Ours already (a hand-off, or a retried request): the ttl counts from now, and a mark stays.
local ours
if mode == EXCLUSIVE then
  ours = is_owner(owner, token)
else
  local score = redis.call('ZSCORE', H, member(mode, token))
  ours = score and tonumber(score) > now
end
if ours then
  hold(L, H, mode, token, ttl, now, owner ~= token)
  return draw(KEYS, 4, 4, ttl, t)
end
-- Held by a writer: L holds its token. SHARED (scripts/shared.lua) is no writer's.
local writer = owner and owner ~= SHARED
-- Whether fair waiters are queued: nobody overtakes them (a writer's holder is waited for anyway).
if queued == nil then queued = not writer and redis.call('EXISTS', Q) == 1 end
-- A writer fits a free L at once: no member lives without SHARED.
if not owner and not queued or (owner == SHARED and not queued and fits(mode, H, now)) then
  -- Free for this mode, and nobody queued: taken.
  hold(L, H, mode, token, ttl, now, waited)
  return draw(KEYS, 4, 4, ttl, t)
end
-- The functions that serve the queue and queue this caller, put here by the composition
-- (lua_spliced! in scripts/mod.rs): the paths above spend nothing on them.
--[[ queue functions ]]
if queued then
  -- Free of a writer, with waiters queued: they go first, in order, as far as they fit (this
  -- caller among them, if its turn came); then it is taken as above if that left nobody queued.
  local admitted = admit(publish, L, Q, W, F, H, t, now, token, ttl, owner and 'shared' or 'free')
  if admitted then return draw(KEYS, 4, 4, ttl, t) end
  owner = redis.call('GET', L)
  writer = owner and owner ~= SHARED
  if not writer and redis.call('EXISTS', Q) == 0
    and (not owner or fits(mode, H, now)) then
    hold(L, H, mode, token, ttl, now, waited)
    return draw(KEYS, 4, 4, ttl, t)
  end
end
local pttl
if writer then
  if not is_marked(owner) and wait > 0 then
    -- Held exclusively, and this caller will wait: marked as waited on, so its release hands
    -- over.
    redis.call('SET', L, '~' .. owner, 'KEEPTTL')
  end
  pttl = redis.call('PTTL', L)
else
  pttl = until_free(mode, H, now)
end
if wait <= 0 then return {0, pttl, now} end
local entry = write_entry(now + wait, claim, secret, mode)
-- The queue keys live until this waiter's wait and a claim are over; a later attempt keeps the
-- waiter's place and moves its deadline on (ARGV[4] is at most the waiter's presence, see
-- fair/request.rs: a waiter that stops trying drops out). A waiter that joins sets them to
-- live a quarter longer than that when they would live less than that, so that waiters joining
-- one after the other read the queue's expiry (PTTL) and set the two about once per quarter
-- wait, not each: the keys outlive the last wait by a claim and at most a quarter of the wait
-- and claim more.
local keep = wait + tonumber(claim)
local keep_ms = string.format('%.0f', keep)
if redis.call('HSET', W, token, entry) == 1 then
  local first = redis.call('RPUSH', Q, token) == 1
  local longer = string.format('%.0f', keep * 1.25)
  if first then
    -- A new queue (and its entries with it: the two are emptied together).
    redis.call('PEXPIRE', Q, longer)
    redis.call('PEXPIRE', W, longer)
  elseif redis.call('PTTL', Q) < keep then
    redis.call('PEXPIRE', Q, longer, 'GT')
    redis.call('PEXPIRE', W, longer, 'GT')
  end
else
  redis.call('PEXPIRE', Q, keep_ms, 'GT')
  redis.call('PEXPIRE', W, keep_ms, 'GT')
end
return {0, pttl, now}
