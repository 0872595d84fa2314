-- RELEASE: releases the lock keys this owner still holds, each in its mode; never touches a
-- key, or a member, of someone else.
-- KEYS: for each lock key five keys: the lock key L, its fair queue Q, its queue's entries W
--   (see fair/entry.lua), its fencing counter F and its holders H (scripts/holders.lua).
-- ARGV[1]: the owner token.
-- ARGV[2]: QUEUED ('1') when the owner may be queued as a fair waiter (one that gives up, or
--   whose attempt's outcome is unknown), which then leaves the queues too; '0' when it is not
--   (`Queued` in scripts/mod.rs).
-- ARGV[3]: the command that announces a release (PUBLISH, or SPUBLISH on a cluster).
-- ARGV[4]: ALWAYS ('1') to treat every key as waited on (a quorum's: see
--   `Deployment::announce`); '0' to announce only the release of a key marked as waited on
--   (`Announce` in scripts/mod.rs).
-- ARGV[5] (optional): the keys' modes, one word each, space-separated: 'x', 'r', N, 'N/i' or
--   'N/*' (scripts/holders.lua: 'N/*' releases every slot the token holds); every key is held
--   exclusively when it is absent.
-- Returns the number of lock keys this owner held. An exclusive one that nobody waited on
-- (unmarked, see scripts/mod.rs, "Waited on") is deleted. A marked one is handed to its fair
-- queue's head (admit: `h ...` messages on the key's channel; a writer at the head takes the
-- key in place), or deleted. A shared or permit lease's member leaves the holders, the lock
-- key's SHARED (scripts/shared.lua) is deleted with the last live member or else expires with
-- the last, and the queue is served; so is it when a fair waiter leaves the queue (it may have
-- been the head others waited behind) and nobody holds the key exclusively.
-- Unless the key was then handed to a writer, the release is announced with an empty message
-- on the key's channel, for waiters that are not fair, when it served the whole queue to
-- readers or permits (others may fit beside them), or served nobody and made room: a marked
-- key's, the last reader's, any permit's, a leaving waiter's that emptied the queue (an
-- announcement Redis refuses, to an ACL user without channel rights, is skipped). A key that
-- is not of its type (overwritten by someone) is not ours and is skipped (pcall), so it cannot
-- keep the others from being released; a queue key of another type holds no waiter.
local QUEUED, ALWAYS, EXCLUSIVE = '1', '1', 'x'
local token, queued, publish, always = ARGV[1], ARGV[2] == QUEUED, ARGV[3], ARGV[4] == ALWAYS
-- One exclusive key that nobody waited on, released by an owner that is not queued: the common
-- case, decided before anything below is defined (a plain `GET` and `DEL`, as the cheapest
-- hand-written lock). `first` keeps what it read for the loop below.
local first = nil
if #KEYS == 5 and not ARGV[5] and not queued and not always then
  first = redis.pcall('GET', KEYS[1])
  if first == token then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
-- settle(L, H, now): after a member left the holders H, the lock key L's SHARED
-- (scripts/shared.lua) follows those left: it expires at the last live one's expiry, or goes,
-- with H, when none lives. Returns what L holds then, 'shared' or 'free' (see serve below).
local function settle(L, H, now)
  -- ZCARD first: the last member's release, the common case, finds H gone and needs no range.
  local last = redis.call('ZCARD', H) > 0 and redis.call('ZRANGE', H, '+inf', '(' .. now,
    'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  if last then
    redis.call('PEXPIREAT', L, last)
    return 'shared'
  end
  redis.call('DEL', L, H)
  return 'free'
end
-- One key held shared or as one of N permits, with nobody queued, released by an owner that
-- is not queued: the common case of those modes, written out likewise (the loop below does the
-- same): the member leaves, L settles, and the release is announced when the last member left
-- or a permit was freed.
if #KEYS == 5 and (ARGV[5] == 'r' or tonumber(ARGV[5])) and not queued and not always
  and redis.call('EXISTS', KEYS[2]) == 0 then
  local L, H = KEYS[1], KEYS[5]
  local member = ARGV[5] == 'r' and token or ARGV[5] .. ' ' .. token
  -- pcall: holders of another type hold no member of ours.
  local score = redis.pcall('ZSCORE', H, member)
  if type(score) ~= 'string' then return 0 end
  redis.call('ZREM', H, member)
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  if tonumber(score) <= now then return 0 end
  if settle(L, H, now) == 'free' or ARGV[5] ~= 'r' then redis.pcall(publish, L, '') end
  return 1
end
local modes = {}
for word in string.gmatch(ARGV[5] or '', '%S+') do modes[#modes + 1] = word end
-- Serves L's fair queue after a release that made room (admit); returns whether it handed the
-- key to anyone, and whether to a writer. `state` is what L holds, as admit takes it: 'ours'
-- (this owner's exclusive lease, deleted here unless a writer at the head takes it in place),
-- 'free' or 'shared'. The fair queue's and the holders' functions are defined in it once a
-- queue is found, so that a release that serves no queue spends nothing on them: the
-- composition (lua_spliced! in scripts/mod.rs) puts them in place of the marker below.
local function serve(L, Q, W, F, H, state)
  -- The head, taken at once when the key was ours (exclusive: whoever is first fits), else
  -- looked at. pcall: a queue key of another type holds no waiter.
  local head
  if state == 'ours' then head = redis.pcall('LPOP', Q) else head = redis.pcall('LINDEX', Q, 0) end
  if type(head) ~= 'string' then
    if state == 'ours' then redis.call('DEL', L) end
    return false, false
  end
  if state ~= 'ours' then head = nil end
  --[[ queue functions ]]
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local _, any, writer = admit(publish, L, Q, W, F, H, t, now, nil, nil, state, head)
  return any, writer
end
local released = 0
for i = 1, #KEYS, 5 do
  local L, Q, W, F, H = KEYS[i], KEYS[i + 1], KEYS[i + 2], KEYS[i + 3], KEYS[i + 4]
  local mode = modes[(i + 4) / 5] or EXCLUSIVE
  -- A fair waiter that leaves may have been the head others wait behind.
  local left = queued and redis.pcall('HDEL', W, token) == 1
  if left then redis.call('LREM', Q, 1, token) end
  -- Whether this release may have made room: then the queue is served, and it is announced
  -- when `announce` (someone may wait) and nobody was handed the key exclusively.
  local room, announce = left, left and redis.call('EXISTS', Q) == 0
  -- What L holds, when known ('ours', 'free', 'shared': see serve), and whether a writer holds
  -- it (then nothing is served).
  local state, writer = nil, false
  if mode == EXCLUSIVE then
    local owner = first
    if i > 1 or first == nil then owner = redis.pcall('GET', L) end
    if owner == token and not always then
      -- Nobody waited on this lease (see scripts/mod.rs): nothing to hand over or announce.
      released = released + 1
      redis.call('DEL', L)
      state = 'free'
    else
      -- The owner check, put here by the composition: the release above spends nothing on it.
      --[[ owner ]]
      if is_owner(owner, token) then
        released = released + 1
        room, announce, state = true, true, 'ours'
      elseif owner == SHARED then
        state = 'shared'
      elseif not owner then
        state = 'free'
      else
        -- Another owner's, or of another type (pcall): nothing to serve.
        writer = true
      end
    end
  else
    local t = redis.call('TIME')
    local now = t[1] * 1000 + math.floor(t[2] / 1000)
    -- member (scripts/holders.lua) written out: defining the holders' functions here cost a
    -- shared release 5% more server time (0.36 to 0.44 µs of 6.8 to 7.8 µs, the medians of 800
    -- paired batches of 300 calls, by `INFO commandstats`).
    local ms = {mode == 'r' and token or mode .. ' ' .. token}
    if string.sub(mode, -2) == '/*' then
      -- Whichever slot the token holds (in_slot, holders.lua, written out likewise): each
      -- member 'N/i token' of H, live or not. pcall: holders of another type hold none.
      ms = {}
      local all = redis.pcall('ZRANGE', H, 0, -1)
      if type(all) == 'table' and not all.err then
        for _, m in ipairs(all) do
          local head = string.match(m, '^%d+/%d+ ')
          if head and string.sub(m, #head + 1) == token then ms[#ms + 1] = m end
        end
      end
    end
    local held = false
    for _, m in ipairs(ms) do
      -- pcall: holders of another type hold no member of ours.
      local score = redis.pcall('ZSCORE', H, m)
      if type(score) == 'string' then
        redis.call('ZREM', H, m)
        held = held or tonumber(score) > now
      end
    end
    if held then
      released = released + 1
      -- Room for a writer (the last member left) or a permit.
      room = true
      state = settle(L, H, now)
      announce = announce or always or mode ~= 'r' or state == 'free'
    end
  end
  if room and not writer then
    if not state then
      -- pcall: a lock key of another type is nobody's to serve.
      local holder = redis.pcall('GET', L)
      writer = holder and holder ~= SHARED
      state = holder and 'shared' or 'free'
    end
    if not writer then
      local served, to_writer = serve(L, Q, W, F, H, state)
      -- Not handed to a writer: waiters that are not fair may fit now, in the room this
      -- release made, or beside the readers or permits the queue was served to once nobody is
      -- left queued (while a fair waiter is, they wait for it). pcall: a user without channel
      -- rights still releases; its waiters poll.
      if not to_writer
        and ((served and redis.call('EXISTS', Q) == 0) or (announce and not served)) then
        redis.pcall(publish, L, '')
      end
    end
  end
end
return released
