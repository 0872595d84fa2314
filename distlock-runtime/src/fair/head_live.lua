-- head_live(Q, W, now): the first live waiter of a fair queue (Q, W: see fair/entry.lua), left
-- in place; waiters before it whose wait has passed, or without an entry, are dropped on the
-- way.
--   now: Redis time in ms.
-- Returns the live waiter's token, claim time (digits, ms), secret (hex, possibly empty) and
-- mode; nil when the queue ran out. `take_head` takes it off the queue. Calls read_entry.
local function head_live(Q, W, now)
  while true do
    local head = redis.call('LINDEX', Q, 0)
    if not head then return nil end
    local claim, secret, mode = read_entry(redis.pcall('HGET', W, head), now)
    if claim then return head, claim, secret, mode end
    redis.call('LPOP', Q)
    redis.pcall('HDEL', W, head)
  end
end
-- take_head(Q, W, head): takes the head that head_live returned off the queue.
local function take_head(Q, W, head)
  redis.call('LPOP', Q)
  redis.pcall('HDEL', W, head)
end
