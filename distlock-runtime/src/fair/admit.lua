-- admit(publish, L, Q, W, F, H, t, now, self, ttl): serves L's fair queue (Q, W: see
-- fair/entry.lua) from its head, in arrival order, while nothing holds L exclusively, for as
-- long as the head fits beside L's holders (fits, scripts/holders.lua). A waiter that does not
-- fit stops the serving (those behind it wait their turn: a writer is never overtaken by later
-- readers), and after an exclusive one nothing more fits.
--   publish: the command that announces a hand-off (PUBLISH, or SPUBLISH on a cluster).
--   F, H: L's fencing counter and holders (scripts/holders.lua).
--   t: Redis's TIME reply; now: the same time in ms.
--   self, ttl (optional): the caller's token, when it is a fair waiter attempting (its own
--     entry, when it comes up, is taken for it at once with its ttl, not handed by message;
--     its attempt draws its token), and its ttl in ms.
-- Returns whether the caller was admitted, and whether anyone was. Calls head_live, take_head,
-- hand, fits and hold.
local function admit(publish, L, Q, W, F, H, t, now, self, ttl)
  local admitted, any = false, false
  while redis.call('EXISTS', L) == 0 do
    local head, claim, secret, mode = head_live(Q, W, now)
    if not head then break end
    if not fits(mode, H, now) then break end
    take_head(Q, W, head)
    any = true
    if head == self then
      admitted = true
      -- Marked: others may be queued behind it.
      hold(L, H, mode, self, ttl, now, true)
    else
      hand(publish, L, F, H, head, claim, secret, mode, t, now)
    end
    -- After a writer, nothing more fits.
    if mode == 'x' then break end
  end
  return admitted, any
end
