-- CHECK: what a manager needs on one server, checked without writing (LockManager::ping; see
-- diagnose.rs).
-- KEYS: none (it runs on every server alike; the keys it checks are arguments).
-- ARGV[1..5]: a lock's keys under the manager's prefix: lock, fencing counter, queue, queue
--   entries, holders.
-- ARGV[6], ARGV[7], ARGV[8]: the commands that publish on, subscribe to and unsubscribe from a
--   lock's channel (the lock key's name).
-- ARGV[9...]: the other commands the manager sends, each one argument with its words apart
--   (`SELECT 0`, `CLUSTER SLOTS`).
-- Returns {missing, publish, subscribe, server, version, redis_version, unknown}: the checks the
-- user fails, each as the command and its first argument (`GET distlock:lock:{...}`); 1 or 0
-- for whether it may publish, and subscribe, on the channel; 'valkey' or 'redis'; its version
-- (Valkey's own for Valkey); the Redis version it reports (for Valkey, the Redis version it is
-- compatible with); and the checks of commands the server does not know, as `missing`'s (a
-- channel command it does not know reads as one the user may not run: notifications are
-- optional, and the manager's waiters then poll).
local L, F, Q, W, H = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local checks = {
  {'EVAL', 'return 1', '0'},
  {'GET', L}, {'SET', L, 'x'}, {'DEL', L}, {'EXISTS', L}, {'PTTL', L}, {'PEXPIRE', L, '1'},
  {'PEXPIREAT', L, '1'},
  {'GET', F}, {'SET', F, '1'}, {'PEXPIRE', F, '1'},
  {'EXISTS', Q}, {'LPOP', Q}, {'LREM', Q, '0', 'x'}, {'RPUSH', Q, 'x'}, {'PEXPIRE', Q, '1'},
  {'LINDEX', Q, '0'}, {'LLEN', Q},
  {'HGET', W, 'x'}, {'HSET', W, 'x', 'y'}, {'HDEL', W, 'x'}, {'HLEN', W}, {'PEXPIRE', W, '1'},
  {'EXISTS', H}, {'ZADD', H, '1', 'x'}, {'ZREM', H, 'x'}, {'ZSCORE', H, 'x'}, {'ZCARD', H},
  {'ZCOUNT', H, '0', '1'}, {'ZRANGE', H, '0', '1'}, {'ZREMRANGEBYSCORE', H, '0', '1'},
  {'PTTL', H}, {'PEXPIRE', H, '1'}, {'DEL', H},
  {'TIME'},
}
for i = 9, #ARGV do
  local words = {}
  for word in string.gmatch(ARGV[i], '%S+') do words[#words + 1] = word end
  checks[#checks + 1] = words
end
local missing, unknown = {}, {}
for _, check in ipairs(checks) do
  -- pcall: the server raises for a command it does not know (renamed away, or disabled).
  local known, allowed = pcall(redis.acl_check_cmd, unpack(check))
  local name = check[1] .. (check[2] and (' ' .. check[2]) or '')
  if not known then
    unknown[#unknown + 1] = name
  elseif not allowed then
    missing[#missing + 1] = name
  end
end
local function allowed(...)
  local known, yes = pcall(redis.acl_check_cmd, ...)
  return known and yes
end
local publish = allowed(ARGV[6], L, '') and 1 or 0
local subscribe = (allowed(ARGV[7], L) and allowed(ARGV[8], L)) and 1 or 0
local valkey = redis.VALKEY_VERSION
return {missing, publish, subscribe, valkey and 'valkey' or 'redis', valkey or redis.REDIS_VERSION,
  redis.REDIS_VERSION, unknown}
