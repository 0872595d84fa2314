-- draw_now(t, F, ms): the fencing draw's common case (draw.lua), for the one-key paths that run
-- before draw's functions are defined (defining them costs a script server time a path that does
-- not call them need not spend): at Redis time t (TIME's reply) the clock is ahead of the
-- counter F, which is set to it for ms and answers its last value, compared as digits
-- (exceeds, counter.lua). Returns the token's digits; nil when the counter is ahead of the
-- clock or of another type: then it holds what it held again, and draw draws above it.
local function draw_now(t, F, ms)
  local us = t[2]
  local now = t[1] .. string.rep('0', 6 - #us) .. us
  local last = redis.pcall('SET', F, now, 'PX', ms, 'GET')
  if not last or (type(last) == 'string' and (#now > #last or (#now == #last and now > last)))
  then
    return now
  end
  if type(last) == 'string' then redis.call('SET', F, last, 'PX', ms) end
  return nil
end
