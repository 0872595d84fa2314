-- hand(publish, L, F, head, claim, secret, t, now): gives the lock key L (free, or held by the
-- caller) to the fair waiter `head`, which pop_live took off the queue, at Redis time t.
--   publish: the command that announces it (PUBLISH, or SPUBLISH on a cluster).
--   F: L's fencing counter, which the hand-off draws a fencing token from (draw.lua).
--   claim, secret: the waiter's claim time (ms) and secret, from its queue entry.
--   t: Redis's TIME reply; now: the same time in ms.
-- Sets L to the waiter's token, marked as waited on, with PX claim, and publishes on L's
-- channel (the key's name) `h <token> <fence> <now> <claim> <mac>`, where <mac> is
-- sha1hex(secret .. ' ' .. fields .. ' ' .. secret) over the fields before it: the secret
-- signs the message and is never published.
-- Returns nothing. Calls draw (draw.lua).
local function hand(publish, L, F, head, claim, secret, t, now)
  local fence = draw({F}, 1, 1, claim, t)
  -- Marked as waited on: more waiters may be queued behind it.
  redis.call('SET', L, '~' .. head, 'PX', claim)
  local signed = string.format('%s %s %.0f %s', head, fence, now, claim)
  -- pcall: a user without channel rights still hands over; its waiters poll.
  redis.pcall(publish, L,
    'h ' .. signed .. ' ' .. redis.sha1hex(secret .. ' ' .. signed .. ' ' .. secret))
end
