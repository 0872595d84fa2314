-- KEY_TYPES: the type of each key, probed with the commands distlock has the rights for (TYPE
-- is not among them): GET fails but on a string, HGET but on a hash, LREM (of a value no list
-- of distlock holds, so it removes nothing) but on a list, ZSCORE but on a sorted set.
-- KEYS: the keys.
-- Returns for each key `none`, `string`, `hash`, `list`, `zset` or `other`.
local types = {}
for i, key in ipairs(KEYS) do
  local t = 'other'
  if redis.call('EXISTS', key) == 0 then t = 'none'
  elseif type(redis.pcall('GET', key)) ~= 'table' then t = 'string'
  elseif type(redis.pcall('HGET', key, '~')) ~= 'table' then t = 'hash'
  elseif type(redis.pcall('LREM', key, 0, '~')) ~= 'table' then t = 'list'
  elseif type(redis.pcall('ZSCORE', key, '~')) ~= 'table' then t = 'zset'
  end
  types[i] = t
end
return types
