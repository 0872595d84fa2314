-- is_marked(value): whether a lock key's value is marked as waited on: its owner's token with
-- a `~` in front (see scripts/mod.rs, "Waited on"). Tokens start with a hex digit, so a `~`
-- first is always the mark. `value` is a string; the empty string is not marked.
local function is_marked(value)
  -- 126 is the byte of `~`.
  return string.byte(value) == 126
end
