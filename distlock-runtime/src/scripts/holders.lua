-- The holders of a key held shared or as permits: a sorted set H beside the lock key, one
-- member per lease, scored by the lease's expiry (Redis time, ms). A member lives while its
-- score is after now; an expired one is dropped by the next script that counts (a crashed
-- holder's share frees itself at its own expiry, whatever the others renew). H itself expires
-- no earlier than its last member (keep), so no key lives forever.
-- A lease's mode, as the Rust side sends it (`LockMode` in mode.rs): 'x' exclusive (the lock
-- key's value, not a member), 'r' shared, or the decimal digits of N for one of N permits.
-- member(mode, token): a lease's member: its token when shared, 'N token' as one of N permits
-- (tokens hold no space), so that an operator's view tells the two apart.
local function member(mode, token)
  if mode == 'r' then return token end
  return mode .. ' ' .. token
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
-- hold(L, H, mode, token, ms, now, marked): the lease `token` holds the lock key L in `mode`
-- for ms from now (Redis time, ms): L set to the token (with the mark of a key waited on when
-- `marked`, see scripts/mod.rs) when exclusive, else its member added to L's holders H.
local function hold(L, H, mode, token, ms, now, marked)
  if mode == 'x' then
    redis.call('SET', L, marked and '~' .. token or token, 'PX', ms)
  else
    redis.call('ZADD', H, now + tonumber(ms), member(mode, token))
    keep(H, ms)
  end
end
-- fits(mode, H, now): whether a lease in mode fits beside L's live holders H, where no writer
-- holds L: an exclusive lease when no member is live, a reader always, one of N permits when
-- fewer than N members are live.
local function fits(mode, H, now)
  if mode == 'x' then return redis.call('EXISTS', H) == 0 or live(H, now) == 0 end
  return mode == 'r' or live(H, now) < tonumber(mode)
end
-- until_free(mode, H, now): how long until live holders make room for a lease in mode, in ms
-- (-1 when none holds): the last one's expiry for an exclusive lease or a reader (queued
-- behind a writer that waits for them), the first one's for a permit.
local function until_free(mode, H, now)
  local at
  if mode == 'x' or mode == 'r' then
    at = redis.call('ZRANGE', H, '+inf', '(' .. now, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
  else
    at = redis.call('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  end
  if not at[2] then return -1 end
  return tonumber(at[2]) - now
end
