-- join(L, H, mode, token, ms, now, state): the shared or permit lease `token` (mode 'r' or N,
-- see holders.lua) joins the holders H of the lock key L, which no writer holds and nobody is
-- queued for, for ms from now (Redis time, ms): fits, hold and cover (holders.lua) written out
-- for the one-key paths that run before those are defined (defining the holders' functions
-- first cost a one-key shared acquire 12% more server time: 0.99 µs of 8.2 µs, the median of
-- 800 paired batches of 300 calls, by `INFO commandstats`).
--   state: what L held: 'free' (so no member lives; L is set to SHARED here), 'set' (free, and
--     set to SHARED until now + ms by the caller already) or 'shared' (SHARED: its expiry is
--     raised here). L expires at the member's score (PXAT), as cover does it.
-- A permit fits while fewer than N live members hold the key (expired ones are dropped), or
-- when its own member lives (a retried request, or a hand-off it confirms); a reader always.
-- Returns whether it joined; nothing is written when it did not.
local function join(L, H, mode, token, ms, now, state)
  local permits = tonumber(mode)
  local member = permits and mode .. ' ' .. token or token
  if permits and state == 'shared' then
    local score = redis.call('ZSCORE', H, member)
    if not (score and tonumber(score) > now) then
      redis.call('ZREMRANGEBYSCORE', H, '-inf', now)
      if redis.call('ZCARD', H) >= permits then return false end
    end
  end
  local at = now + tonumber(ms)
  redis.call('ZADD', H, at, member)
  if redis.call('PEXPIRE', H, ms, 'NX') == 0 then redis.call('PEXPIRE', H, ms, 'GT') end
  if state == 'free' then
    redis.call('SET', L, SHARED, 'PXAT', at)
  elseif state == 'shared' then
    redis.call('PEXPIREAT', L, at, 'GT')
  end
  return true
end
