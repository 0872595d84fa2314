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
-- take_live(Q, W, now, head): the first live waiter of a fair queue, taken off it (its entry is
-- left for the caller, who takes the waiter: HDEL), for a caller that knows whoever is first
-- fits; waiters before it whose wait has passed are dropped on the way. `head` (optional): the
-- first token, taken off already (LPOP).
-- Returns what head_live returns.
local function take_live(Q, W, now, head)
  while true do
    head = head or redis.pcall('LPOP', Q)
    if type(head) ~= 'string' then return nil end
    local claim, secret, mode = read_entry(redis.pcall('HGET', W, head), now)
    if claim then return head, claim, secret, mode end
    redis.pcall('HDEL', W, head)
    head = nil
  end
end
