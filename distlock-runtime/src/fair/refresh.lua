-- FAIR_REFRESH: keeps queued fair waiters of one process in the queue: moves each one's
-- deadline on, so that a process's waiters cost one call per renewal, not one each (see
-- fair/mod.rs, "Queue").
-- KEYS: the queue Q and its entries W of one lock key (see fair/entry.lua).
-- ARGV[1]: the caller's claim time, in ms (the queue keys outlive the deadlines it sets by
--   it; an entry's own claim time, in its entry, is kept).
-- ARGV[2], ARGV[3], ...: pairs of a waiter's owner token and how long its entry lasts from now,
--   in ms (its wait left, at most its presence).
-- Returns the tokens of the waiters that are no longer queued (handed the lock, or dropped
-- after their deadline passed): they must try again to learn where they stand.
local Q, W = KEYS[1], KEYS[2]
local claim = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local gone, longest = {}, 0
for i = 2, #ARGV, 2 do
  local token, keep = ARGV[i], tonumber(ARGV[i + 1])
  local claim, secret, mode = read_entry(redis.pcall('HGET', W, token), now)
  if claim then
    redis.call('HSET', W, token, write_entry(now + keep, claim, secret, mode))
    if keep > longest then longest = keep end
  else
    gone[#gone + 1] = token
  end
end
if longest > 0 then
  local keep_ms = string.format('%.0f', longest + claim)
  redis.call('PEXPIRE', Q, keep_ms, 'GT')
  redis.call('PEXPIRE', W, keep_ms, 'GT')
end
return gone
