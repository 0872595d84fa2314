-- pop_live(Q, W, now, head): takes waiters off the front of a fair queue until one whose
-- deadline is after `now`, dropping on the way the entries of waiters whose wait has passed.
-- A fair queue is two keys beside its lock key: Q, a list of waiting owner tokens in arrival
-- order, and W, a hash from each waiting token to its entry "deadline_ms claim_ms secret"
-- (Redis time after which the waiter has given up; how long a hand-off to it holds before it
-- must confirm; a random value from the waiter's latest attempt, which only a hand-off made
-- by distlock's scripts can show it). A token in Q without an entry in W is a waiter that left
-- (or whose entry was lost): skipped like one whose wait has passed.
--   now: Redis time in ms.
--   head (optional): the first waiter, which the caller already took off Q.
-- Returns the live waiter's token, claim time (digits, ms) and secret (hex, possibly empty);
-- nil when the queue ran out.
local function pop_live(Q, W, now, head)
  while true do
    head = head or redis.call('LPOP', Q)
    if not head then return nil end
    local entry = redis.pcall('HGET', W, head)
    redis.pcall('HDEL', W, head)
    if type(entry) == 'string' then
      local deadline, claim, secret = string.match(entry, '^(%d+) (%d+) ?(%x*)$')
      if deadline and tonumber(deadline) > now then return head, claim, secret end
    end
    head = nil
  end
end
