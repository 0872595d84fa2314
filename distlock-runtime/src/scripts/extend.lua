-- EXTEND: extends several leases in one call, each only if its owner still holds every one of
-- its keys.
-- KEYS: the keys of every lease in the batch, lease after lease.
-- ARGV: for each lease, three values: owner token, new ttl in ms, number of keys.
-- Returns one integer per lease: 1 when every key was held by the token (marked as waited on
-- or not) and got PEXPIRE ttl; 0 when some key is gone, owned by another token or no longer a
-- string (pcall: one broken lease never fails the batch), in which case none of that lease's
-- keys is touched (a lost lock is never re-created or prolonged).
local results = {}
local k = 1
for a = 1, #ARGV, 3 do
  local token, ttl, count = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local owned = 1
  for i = k, k + count - 1 do
    local owner = redis.pcall('GET', KEYS[i])
    if owner ~= token and owner ~= '~' .. token then owned = 0 break end
  end
  if owned == 1 then
    for i = k, k + count - 1 do redis.call('PEXPIRE', KEYS[i], ttl) end
  end
  results[#results + 1] = owned
  k = k + count
end
return results
