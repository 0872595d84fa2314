-- ACQUIRE: takes every lock key at once, or none: the acquire of every request that is not
-- fair, for one key or several.
-- KEYS: the lock keys L1..Ln (sorted, de-duplicated), then their fencing counters F1..Fn in the
--   same order (see draw.lua).
-- ARGV[1]: the owner token.
-- ARGV[2]: the ttl in ms.
-- ARGV[3]: whether this request waits (`Waiting` in scripts/mod.rs): WAITED ('1') when it has
--   waited for a key already (it competed with other waiters, who may still wait: the keys it
--   takes are marked as waited on), '0' when it has not yet, NEVER ('-') when it will not wait
--   at all (a try-lock, which marks nothing).
-- ARGV[4] (optional): a proposed fencing token, the least one drawn (draw's floor).
-- Returns the fencing token (its decimal digits) when every key was free (or already held by
-- this token, so a retried request after a lost answer is harmless) and is now set with PX ttl;
-- {0, i, pttl} when some key is held by another owner, where i is the 1-based index of the
-- first held key and pttl the longest remaining PTTL among the held keys in ms (-1 when a held
-- key has no expiry). No key is taken then; the first held key is marked as waited on (see
-- scripts/mod.rs, "Waited on"), since that is the key a waiter waits for. A retried request
-- that finds its own token takes the key as it is, with a new fencing token.
-- A lock key of another type (another program's) fails the script with WRONGTYPE, no key
-- taken (a held key before it may have been marked); a counter of another type is overwritten
-- (draw.lua).
-- ARGV[3]'s values that the script tells apart.
local WAITED, NEVER = '1', '-'
local n = #KEYS / 2
local token, marked = ARGV[1], '~' .. ARGV[1]
-- What a free key is set to.
local value = ARGV[3] == WAITED and marked or token
-- Marks a key held by another owner as waited on (see scripts/mod.rs): its release will
-- announce itself. A try-lock does not wait, and marks nothing.
local function mark(key, owner)
  if ARGV[3] ~= NEVER and not is_marked(owner) then
    redis.call('SET', key, '~' .. owner, 'KEEPTTL')
  end
end
if n == 1 then
  -- One key: take it if free, in one command.
  local owner = redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2], 'GET')
  if owner and owner ~= token and owner ~= marked then
    mark(KEYS[1], owner)
    return {0, 1, redis.call('PTTL', KEYS[1])}
  end
  -- Ours already (a retried request that ran late): the ttl counts from now.
  if owner then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
else
  local first, owners = 0, {}
  for i = 1, n do
    local owner = redis.call('GET', KEYS[i])
    if owner and owner ~= token and owner ~= marked then first = i break end
    owners[i] = owner
  end
  if first > 0 then
    local longest = 0
    for i = first, n do
      local owner = redis.call('GET', KEYS[i])
      if owner and owner ~= token and owner ~= marked then
        if i == first then mark(KEYS[i], owner) end
        local pttl = redis.call('PTTL', KEYS[i])
        if pttl < 0 then longest = -1 elseif longest >= 0 and pttl > longest then longest = pttl end
      end
    end
    return {0, first, longest}
  end
  -- A key of ours already marked as waited on stays marked.
  for i = 1, n do
    local owner = owners[i]
    redis.call('SET', KEYS[i], owner == marked and owner or value, 'PX', ARGV[2])
  end
end
return draw(KEYS, n + 1, 2 * n, ARGV[2], redis.call('TIME'), ARGV[4])
