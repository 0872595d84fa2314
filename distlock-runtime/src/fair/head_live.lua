-- head_live(Q, W, now): the first live waiter of a fair queue, left in place; waiters before it
-- whose wait has passed are dropped on the way.
-- A fair queue is two keys beside its lock key: Q, a list of waiting owner tokens in arrival
-- order, and W, a hash from each waiting token to its entry "deadline_ms claim_ms secret mode"
-- (Redis time after which the waiter has given up; how long a hand-off to it holds before it
-- must confirm; a random value from the waiter's latest attempt, which only a hand-off made
-- by distlock's scripts can show it; the mode it waits to hold the key in, see
-- scripts/holders.lua, 'x' when absent). A token in Q without an entry in W is a waiter that
-- left (or whose entry was lost): skipped like one whose wait has passed.
--   now: Redis time in ms.
-- Returns the live waiter's token, claim time (digits, ms), secret (hex, possibly empty) and
-- mode; nil when the queue ran out. `take_head` takes it off the queue.
local function head_live(Q, W, now)
  while true do
    local head = redis.call('LINDEX', Q, 0)
    if not head then return nil end
    local entry = redis.pcall('HGET', W, head)
    if type(entry) == 'string' then
      local deadline, claim, secret, mode = string.match(entry, '^(%d+) (%d+) ?(%x*) ?(%w*)$')
      if deadline and tonumber(deadline) > now then
        if mode == '' then mode = 'x' end
        return head, claim, secret, mode
      end
    end
    redis.call('LPOP', Q)
    redis.pcall('HDEL', W, head)
  end
end
-- take_head(Q, W, head): takes the head that head_live returned off the queue.
local function take_head(Q, W, head)
  redis.call('LPOP', Q)
  redis.pcall('HDEL', W, head)
end
