-- RAISE: raises fencing counters to a token drawn elsewhere, so the next lease of each key
-- draws above it: the write-back of a lease whose keys live on several servers (a cluster's
-- slots, a quorum's nodes), whose token is the greatest any of them drew.
-- KEYS: fencing counters.
-- ARGV[1]: the token (decimal digits).
-- ARGV[2]: the lease's ttl in ms.
-- Sets each counter that is missing, below the token or of another type to it, living as a
-- drawn one does (keep_for, counter.lua).
-- Returns the number of counters raised.
local token = ARGV[1]
local keep = keep_for(ARGV[2], token, redis.call('TIME'))
local raised = 0
for i = 1, #KEYS do
  local last = redis.pcall('GET', KEYS[i])
  if type(last) ~= 'string' or exceeds(token, last) then
    redis.call('SET', KEYS[i], token, 'PX', keep)
    raised = raised + 1
  end
end
return raised
