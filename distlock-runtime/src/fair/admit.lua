-- admit(publish, L, Q, W, F, H, t, now, self, ttl, state, head): serves L's fair queue (Q, W:
-- see fair/entry.lua) from its head, in arrival order, while nothing holds L exclusively, for
-- as long as the head fits beside L's holders (fits, scripts/holders.lua). A waiter that does
-- not fit stops the serving (those behind it wait their turn: a writer is never overtaken by
-- later readers), and after an exclusive one nothing more fits.
--   publish: the command that announces a hand-off (PUBLISH, or SPUBLISH on a cluster).
--   F, H: L's fencing counter and holders (scripts/holders.lua).
--   t: Redis's TIME reply; now: the same time in ms.
--   self, ttl (optional): the caller's token, when it is a fair waiter attempting (its own
--     entry, when it comes up, is taken for it at once with its ttl, not handed by message;
--     its attempt draws its token), and its ttl in ms.
--   state: what L holds, never a writer's token: 'free', 'shared' (SHARED, scripts/shared.lua),
--     or 'ours': the caller's exclusive lease, which it releases. Whoever is first fits then
--     (no member lives beside a writer): a writer at the head takes L in place, anyone else
--     after L's deletion; L is deleted if nobody takes it.
--   head (optional, with 'ours'): the first token, taken off the queue already.
-- Returns whether the caller was admitted, whether anyone was, and whether a writer was (who
-- holds L now). Calls head_live, take_head, take_live, hand, fits and hold.
local function admit(publish, L, Q, W, F, H, t, now, self, ttl, state, head)
  local admitted, any = false, false
  while true do
    local claim, secret, mode
    if state == 'ours' then
      head, claim, secret, mode = take_live(Q, W, now, head)
      if not head then break end
      redis.pcall('HDEL', W, head)
      -- A writer takes L in place; anyone else joins the holders once it is free.
      if mode ~= 'x' then redis.call('DEL', L) end
    else
      head, claim, secret, mode = head_live(Q, W, now)
      if not head then break end
      -- A writer fits a free L at once: no member lives without SHARED.
      if not ((mode == 'x' and state == 'free') or fits(mode, H, now)) then break end
      take_head(Q, W, head)
    end
    any = true
    if head == self then
      admitted = true
      -- Marked: others may be queued behind it.
      hold(L, H, mode, self, ttl, now, true)
    else
      hand(publish, L, F, H, head, claim, secret, mode, t, now)
    end
    -- After a writer, nothing more fits.
    if mode == 'x' then return admitted, any, true end
    state = 'shared'
  end
  if state == 'ours' then redis.call('DEL', L) end
  return admitted, any, false
end
