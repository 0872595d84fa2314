-- draw(counters, from, to, keep_ms, t, floor): draws the fencing token of a lease whose keys'
-- fencing counters are counters[from..to] (see fence.rs for why tokens are drawn so).
--   counters: a list of key names (a script's KEYS); each counter holds the last token drawn
--     for its lock key (counter.lua).
--   keep_ms: how long a counter lives after this draw, in ms (the lease's ttl).
--   t: Redis's TIME reply.
--   floor (optional): decimal digits of a token the caller proposes, the least it accepts: a
--     quorum proposes one slightly ahead of its own clock, so that its nodes, whose clocks
--     differ, draw the same token and need no write-back (see topology/quorum.rs).
-- Returns the token as decimal digits: Redis's clock in microseconds (or the floor when that
-- is ahead), or one more than the greatest counter when that is not less. Every counter is
-- set to it, and lives as keep_for says.
-- A counter that holds another type (another program's key) is overwritten: tokens go on from
-- the clock, and the script does not stop half way.
-- The common case (the clock is ahead of every counter) costs one SET ... GET per counter and
-- no number conversion: each counter is set to the clock's digits and answers its last value,
-- compared as digits (exceeds); only a counter found ahead is parsed, and makes a second write.
-- Tokens stay below 2^53, so Lua numbers (and JavaScript's) hold them exactly. Calls exceeds
-- and keep_for (counter.lua).
local function draw(counters, from, to, keep_ms, t, floor)
  local us = t[2]
  local now = t[1] .. string.rep('0', 6 - #us) .. us
  if floor and exceeds(floor, now) then
    -- Ahead of this server's clock: the counters live until the clock has passed it.
    keep_ms, now = keep_for(keep_ms, floor, t), floor
  end
  local ahead = nil
  for i = from, to do
    local last = redis.pcall('SET', counters[i], now, 'PX', keep_ms, 'GET')
    if type(last) == 'table' then
      -- Not a string (another program's key): it goes on from the clock, and this script
      -- does not stop half way.
      redis.call('SET', counters[i], now, 'PX', keep_ms)
      last = false
    end
    if last and not exceeds(now, last) then
      if not ahead or tonumber(last) > ahead then ahead = tonumber(last) end
    end
  end
  if not ahead then return now end
  local token = string.format('%.0f', ahead + 1)
  local keep = keep_for(keep_ms, token, t)
  for i = from, to do redis.call('SET', counters[i], token, 'PX', keep) end
  return token
end
