-- INSPECT: reads a lock without changing it.
-- KEYS: the lock key, its fencing counter, its queue's entries (see fair/pop_live.lua).
-- Returns nil when the lock is free (or its key holds another type), else
-- {owner, pttl, counter, waiters}: the owner's token without the mark of a lock someone waits
-- on (see scripts/mod.rs, "Waited on"), the lock's PTTL in ms (-1 for a key without expiry),
-- the counter's digits (empty when it is gone or of another type) and the number of queue
-- entries (0 when the entries key is of another type).
local owner = redis.pcall('GET', KEYS[1])
if type(owner) ~= 'string' then return nil end
if is_marked(owner) then owner = string.sub(owner, 2) end
local counter = redis.pcall('GET', KEYS[2])
if type(counter) ~= 'string' then counter = '' end
local waiters = redis.pcall('HLEN', KEYS[3])
if type(waiters) ~= 'number' then waiters = 0 end
return {owner, redis.call('PTTL', KEYS[1]), counter, waiters}
