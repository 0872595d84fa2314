-- is_owner(value, token): whether a lock key's value, as GET answers it (a string; false when
-- the key is missing; under pcall, an error table when it is of another type), is `token`'s: the
-- token itself, or the token marked as waited on (see mark.lua).
local function is_owner(value, token)
  return value == token or value == '~' .. token
end
