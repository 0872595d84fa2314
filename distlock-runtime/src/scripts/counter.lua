-- A fencing counter holds the last token drawn for its lock key (draw.lua), as decimal digits.
-- exceeds(a, b): whether token a is greater than token b, both decimal digits without leading
-- zeros: the longer is, and at the same length text order is number order, so no number is
-- parsed.
local function exceeds(a, b)
  return #a > #b or (#a == #b and a > b)
end
-- keep_for(keep_ms, token, t): how long a counter set to token (digits, or a number) lives,
-- as digits (ms): keep_ms (the lease's ttl), and longer by however far the token is ahead of
-- the clock (Redis's TIME reply t), so that an expired counter never held a value the clock has
-- not passed: no key lives forever per lock name.
local function keep_for(keep_ms, token, t)
  local ahead = tonumber(token) - (t[1] * 1000000 + t[2])
  return string.format('%.0f', keep_ms + math.max(0, math.ceil(ahead / 1000)))
end
