-- serve(publish, L, Q, W, F, head): a release's hand-off of the lock key L, whose fair queue
-- is Q and W (see pop_live) and fencing counter F: gives L to the first live waiter in the
-- queue (hand), whose first entry `head` the caller took off Q already.
--   publish: the command that announces a hand-off (PUBLISH, or SPUBLISH on a cluster).
-- Returns whether there was a live waiter (then L is its; else L is untouched and the queue
-- is empty). Calls pop_live and hand (fair/pop_live.lua, fair/hand.lua).
local function serve(publish, L, Q, W, F, head)
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local claim, secret
  head, claim, secret = pop_live(Q, W, now, head)
  if head then hand(publish, L, F, head, claim, secret, t, now) end
  return head ~= nil
end
