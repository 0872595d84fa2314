-- INSPECT: reads a lock without changing it.
-- KEYS: the lock key, its fencing counter, its queue's entries (see fair/entry.lua), its
--   holders (scripts/holders.lua), its queue (fair/entry.lua).
-- ARGV[1] (optional): the claim time of a hand-off, in ms (HANDOFF_CLAIM, fair/mod.rs).
-- Returns nil when the lock is free (or its keys hold other types), else
-- {kind, pttl, counter, waiters, holders, queued, member...}:
--   kind: 'x' when held exclusively, 'h' when exclusively by a fair hand-off's claim that its
--     recipient has not extended yet (see claimed below), 's' when by members (shared or
--     permits);
--   pttl: the lock's PTTL in ms (-1 for a key without expiry), or the time until the last
--     member's expiry;
--   counter: the fencing counter's digits (empty when it is gone or of another type);
--   waiters: the number of queue entries (0 when the entries key is of another type);
--   holders: the number of live holders;
--   queued: the live waiters among the queue's first 100 tokens, in arrival order, as
--     {token, mode, token, mode, ...} (mode: the word of scripts/holders.lua); those whose
--     wait has passed or whose entry is gone are left out (and left in place);
--   member...: the exclusive owner's token without the mark of a lock someone waits on (see
--     scripts/mod.rs, "Waited on"), or the first 100 live members in order of expiry (see
--     scripts/holders.lua: a token, 'N token', or 'N/i token' for a quorum's slot i).
-- Raises a refusal of any command it runs. A key of another type reads as nothing (pcall), but
-- any other refusal, an ACL user without the right to a command, is raised again by the same
-- command on the same line (where Redis 7.0's error names it): a count read as 0 would be a
-- wrong answer, which is worse than an error.
local L, F, W, H, Q = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local function refused(answer)
  return type(answer) == 'table' and answer.err ~= nil
    and string.sub(answer.err, 1, 9) ~= 'WRONGTYPE'
end
local function counter_and_waiters()
  local counter = redis.pcall('GET', F)
  if refused(counter) then redis.call('GET', F) end
  if type(counter) ~= 'string' then counter = '' end
  local waiters = redis.pcall('HLEN', W)
  if refused(waiters) then redis.call('HLEN', W) end
  if type(waiters) ~= 'number' then waiters = 0 end
  return counter, waiters
end
local function queued()
  local live = {}
  -- LINDEX rather than LRANGE: the commands a manager's ACL already allows (see check.lua).
  for i = 0, 99 do
    local token = redis.pcall('LINDEX', Q, i)
    if refused(token) then redis.call('LINDEX', Q, i) end
    if type(token) ~= 'string' then break end
    local entry = redis.pcall('HGET', W, token)
    if refused(entry) then redis.call('HGET', W, token) end
    local claim, _, mode = read_entry(entry, now)
    if claim then
      live[#live + 1] = token
      live[#live + 1] = mode
    end
  end
  return live
end
-- Whether a lock key whose value is `value`, with pttl ms left and fencing counter `counter`,
-- is in a hand-off's claim: fair/hand.lua sets the key marked for ARGV[1] ms at the moment it
-- draws the fencing token from Redis's clock (microseconds, draw.lua), and the recipient's first
-- renewal moves the expiry on; so the expiry is the token's time plus the claim (within 2 ms:
-- Redis 7.0 reads the clock anew for each command of a script). A marked lease whose expiry
-- falls there too reads the same (LockInfo::handoff_claim lists when).
local function claimed(value, pttl, counter)
  local claim = tonumber(ARGV[1])
  if not claim or not is_marked(value) or pttl < 0 or #counter < 7 then return false end
  local drawn = tonumber(string.sub(counter, 1, -4))
  return math.abs(now + pttl - drawn - claim) <= 2
end
local owner = redis.pcall('GET', L)
if refused(owner) then redis.call('GET', L) end
-- SHARED (scripts/shared.lua): held by members, read below.
if type(owner) == 'string' and owner ~= SHARED then
  local counter, waiters = counter_and_waiters()
  local pttl = redis.call('PTTL', L)
  local kind = claimed(owner, pttl, counter) and 'h' or 'x'
  if is_marked(owner) then owner = string.sub(owner, 2) end
  return {kind, pttl, counter, waiters, 1, queued(), owner}
end
local count = redis.pcall('ZCOUNT', H, '(' .. now, '+inf')
if refused(count) then redis.call('ZCOUNT', H, '(' .. now, '+inf') end
if type(count) ~= 'number' or count == 0 then return nil end
local members = redis.call('ZRANGE', H, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 100,
  'WITHSCORES')
local counter, waiters = counter_and_waiters()
local last = redis.call('ZRANGE', H, '+inf', '(' .. now, 'BYSCORE', 'REV', 'LIMIT', 0, 1,
  'WITHSCORES')
local reply = {'s', tonumber(last[2]) - now, counter, waiters, count, queued()}
for i = 1, #members, 2 do reply[#reply + 1] = members[i] end
return reply
