-- draw(counters, from, to, keep_ms, t, floor): draws the fencing token of a lease whose keys'
-- fencing counters are counters[from..to] (see fence.rs for why tokens are drawn so).
--   counters: a list of key names (a script's KEYS); each counter holds the last token drawn
--     for its lock key, as decimal digits.
--   keep_ms: how long a counter lives after this draw, in ms (the lease's ttl).
--   t: Redis's TIME reply.
--   floor (optional): decimal digits of a token the caller proposes, the least it accepts: a
--     quorum proposes one slightly ahead of its own clock, so that its nodes, whose clocks
--     differ, draw the same token and need no write-back (see topology/quorum.rs).
-- Returns the token as decimal digits: Redis's clock in microseconds (or the floor when that
-- is ahead), or one more than the greatest counter when that is not less. Every counter is
-- set to it. A counter lives keep_ms, and longer when the token is ahead of the clock (more
-- than one draw per microsecond, or a floor ahead), so an expired counter never held a value
-- the clock has not passed: no key lives forever per lock name.
-- A counter that holds another type (another program's key) is overwritten: tokens go on from
-- the clock, and the script does not stop half way.
-- The common case (the clock is ahead of every counter) costs one SET ... GET per counter and
-- no number conversion: each counter is set to the clock's digits and answers its last value,
-- compared as digits (same length, so text order is number order); only a counter found ahead
-- is parsed, and makes a second write. Tokens stay below 2^53, so Lua numbers (and
-- JavaScript's) hold them exactly.
local function draw(counters, from, to, keep_ms, t, floor)
  local us = t[2]
  local now = t[1] .. string.rep('0', 6 - #us) .. us
  if floor and (#floor > #now or (#floor == #now and floor > now)) then
    -- Ahead of this server's clock: the counters live until the clock has passed it.
    keep_ms = string.format('%.0f', keep_ms + math.ceil((tonumber(floor) - (t[1] * 1000000 + us)) / 1000))
    now = floor
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
    if last and (#last > #now or (#last == #now and last >= now)) then
      if not ahead or tonumber(last) > ahead then ahead = tonumber(last) end
    end
  end
  if not ahead then return now end
  local token = ahead + 1
  local now_us = t[1] * 1000000 + us
  local keep = keep_ms + math.ceil((token - now_us) / 1000)
  local text = string.format('%.0f', token)
  for i = from, to do redis.call('SET', counters[i], text, 'PX', keep) end
  return text
end
