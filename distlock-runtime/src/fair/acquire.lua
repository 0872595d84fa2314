-- FAIR_ACQUIRE: takes one lock key fairly: only when it is free and no live waiter arrived
-- first; otherwise joins the key's queue, to be handed the lock by a release.
-- KEYS: the lock key L, its queue Q, its queue's entries W (see fair/pop_live.lua), its
--   fencing counter F.
-- ARGV[1]: the owner token.
-- ARGV[2]: the ttl in ms.
-- ARGV[3]: the claim time of a hand-off to this caller, in ms.
-- ARGV[4]: how much longer this caller waits, in ms (0: it does not wait).
-- ARGV[5]: this attempt's secret (hex), which a hand-off to this caller will show.
-- ARGV[6]: the command that announces a hand-off (PUBLISH, or SPUBLISH on a cluster).
-- ARGV[7]: WAITED ('1') when this caller has waited already (a key it takes is marked as
--   waited on: others may still wait), else '0', or '-' for a try-lock (`Waiting` in
--   scripts/mod.rs).
-- Returns the fencing token (its decimal digits, like ACQUIRE: a reply the client reads
-- without parsing an array) when the caller holds the key now with PX ttl: it was free and the
-- caller first in line, or it had been handed to the caller (whose attempt confirms the
-- hand-off and draws a new fencing token, greater than the hand-off's).
-- {0, pttl, now_ms} when the caller is queued (once, keeping its place and its deadline on
-- later attempts) behind the holder, whose remaining PTTL in ms is pttl (-1: no expiry), and
-- whose value is then marked as waited on (see scripts/mod.rs, "Waited on"); a caller that
-- does not wait (ARGV[4] is 0) is neither queued nor marks. A lock this caller takes from its
-- queue's head, or is handed, is marked too: others may be queued behind it. If the key was
-- free but another live waiter was first in line, it is handed to that waiter first (hand).
-- now_ms is Redis server time, which lets the caller date a hand-off it learns of by message.
-- The queue keys expire once no waiter in them can still be waiting.
local WAITED = '1'
local L, Q, W, F = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, ttl, claim, wait, secret = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local publish, waited = ARGV[6], ARGV[7] == WAITED
-- Takes the key if it is free, in one command; a held key is left as it is.
local owner = redis.call('SET', L, waited and '~' .. token or token, 'NX', 'PX', ttl, 'GET')
if not owner and redis.call('EXISTS', Q) == 0 then
  -- Free, and nobody queued.
  return draw(KEYS, 4, 4, ttl, redis.call('TIME'))
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if owner == token or owner == '~' .. token then
  -- Ours already (a hand-off, or a retried request): the ttl counts from now, and a mark
  -- stays.
  local fence = draw(KEYS, 4, 4, ttl, t)
  redis.call('SET', L, owner, 'PX', ttl)
  return fence
end
if not owner then
  -- Was free, with waiters queued: the first live one has it (which may be this caller, who
  -- holds it now), or this caller if none is left.
  local head, hclaim, hsecret = pop_live(Q, W, now)
  if not head then return draw(KEYS, 4, 4, ttl, t) end
  if head == token then
    -- Others may still be queued behind this caller: marked as waited on (a caller from the
    -- queue has waited, and set it so already).
    if not waited then redis.call('SET', L, '~' .. token, 'KEEPTTL') end
    return draw(KEYS, 4, 4, ttl, t)
  end
  hand(publish, L, F, head, hclaim, hsecret, t, now)
elseif not is_marked(owner) and wait > 0 then
  -- Held, and this caller will wait: marked as waited on, so its release hands over.
  redis.call('SET', L, '~' .. owner, 'KEEPTTL')
end
if wait <= 0 then return {0, redis.call('PTTL', L), now} end
local entry = string.format('%.0f %s %s', now + wait, claim, secret)
if redis.call('HSET', W, token, entry) == 1 then
  -- New in the queue (a later attempt keeps its place, and its deadline): the queue keys live
  -- until this waiter's wait and a claim are over.
  local keep = string.format('%.0f', wait + tonumber(claim))
  if redis.call('RPUSH', Q, token) == 1 then
    redis.call('PEXPIRE', Q, keep)
    redis.call('PEXPIRE', W, keep)
  else
    redis.call('PEXPIRE', Q, keep, 'GT')
    redis.call('PEXPIRE', W, keep, 'GT')
  end
end
return {0, redis.call('PTTL', L), now}
