-- hand(publish, L, F, H, head, claim, secret, mode, t, now): gives the lock key L to the fair
-- waiter `head` in its mode (scripts/holders.lua), at Redis time t, for its claim time: L (free)
-- set to its token, marked as waited on (more waiters may be queued behind it), when exclusive;
-- its member added to L's holders H when shared or a permit. The caller took it off the queue.
--   publish: the command that announces it (PUBLISH, or SPUBLISH on a cluster).
--   F: L's fencing counter, which the hand-off draws a fencing token from (draw.lua).
--   claim, secret: the waiter's claim time (ms) and secret, from its queue entry.
--   t: Redis's TIME reply; now: the same time in ms.
-- Publishes on L's channel (the key's name) `h <token> <fence> <now> <claim> <mac>`, where <mac>
-- is sha1hex(secret .. ' ' .. fields .. ' ' .. secret) over the fields before it: the secret
-- signs the message and is never published.
-- Returns nothing. Calls draw and hold.
local function hand(publish, L, F, H, head, claim, secret, mode, t, now)
  local fence = draw({F}, 1, 1, claim, t)
  -- Marked as waited on: more waiters may be queued behind it.
  hold(L, H, mode, head, claim, now, true)
  local signed = string.format('%s %s %.0f %s', head, fence, now, claim)
  -- pcall: a user without channel rights still hands over; its waiters poll.
  redis.pcall(publish, L,
    'h ' .. signed .. ' ' .. redis.sha1hex(secret .. ' ' .. signed .. ' ' .. secret))
end
