-- RAISE: raises fencing counters to a token drawn elsewhere, so the next lease of each key
-- draws above it: the write-back of a lease whose keys live on several servers (a cluster's
-- slots, a quorum's nodes), whose token is the greatest any of them drew.
-- KEYS: fencing counters.
-- ARGV[1]: the token (decimal digits).
-- ARGV[2]: the lease's ttl in ms.
-- Sets each counter that is missing, below the token or of another type to it, living the ttl
-- plus however far the token is ahead of this server's clock (the same rule as draw.lua).
-- Returns the number of counters raised.
local token, keep_ms = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local ahead = tonumber(token) - (t[1] * 1000000 + t[2])
local keep = string.format('%.0f', keep_ms + math.max(0, math.ceil(ahead / 1000)))
local raised = 0
for i = 1, #KEYS do
  local last = redis.pcall('GET', KEYS[i])
  if type(last) ~= 'string' or #last < #token or (#last == #token and last < token) then
    redis.call('SET', KEYS[i], token, 'PX', keep)
    raised = raised + 1
  end
end
return raised
