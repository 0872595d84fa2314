-- A fair queue is two keys beside its lock key: Q, a list of waiting owner tokens in arrival
-- order, and W, a hash from each waiting token to its entry "deadline_ms claim_ms secret mode"
-- (Redis time after which the waiter has given up; how long a hand-off to it holds before it
-- must confirm; a random value from the waiter's latest attempt, which only a hand-off made
-- by distlock's scripts can show it; the mode it waits to hold the key in, see
-- scripts/holders.lua, 'x' when absent). A token in Q without an entry in W is a waiter that
-- left (or whose entry was lost).
-- write_entry(deadline, claim, secret, mode): an entry's text; deadline a number (ms), claim
-- digits (ms), secret hex.
local function write_entry(deadline, claim, secret, mode)
  return string.format('%.0f %s %s %s', deadline, claim, secret, mode)
end
-- read_entry(entry, now): the claim time (digits, ms), secret (hex, possibly empty) and mode of
-- a waiter whose entry is `entry` (as HGET answered under pcall), while its wait lasts at now
-- (Redis time, ms); nil when it has no entry (or one of another form), or its wait has passed.
local function read_entry(entry, now)
  if type(entry) ~= 'string' then return nil end
  local deadline, claim, secret, mode = string.match(entry, '^(%d+) (%d+) ?(%x*) ?(%w*)$')
  if not deadline or tonumber(deadline) <= now then return nil end
  if mode == '' then mode = 'x' end
  return claim, secret, mode
end
