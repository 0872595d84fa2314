//! Fencing tokens: how each lease's token is drawn, and why tokens keep rising after Redis lost
//! its data.
//!
//! Storage that fences (remembers the greatest token it accepted and refuses smaller ones) is
//! what makes a holder that lost its lease without knowing it (paused past its ttl, cut off
//! from Redis) harmless. That needs tokens that only ever rise per key, across every client,
//! after a lease expired, and after Redis lost the counter: a restart without persistence, a
//! failover to a replica that missed the last writes, an eviction. A token is therefore at
//! least Redis's clock in microseconds, and one more than the last token of the key when
//! that is greater. The clock assumption: the Redis server's wall clock (and, after a
//! failover, the new primary's) does not step back by more than the time between the last
//! token drawn before the loss and the first one after. NTP-disciplined clocks slew rather than
//! step, and a failover takes longer than their offsets; a clock set back by hand breaks the
//! guarantee until the counter has caught up.

/// Lua shared by every script that draws a fencing token: `draw(from, to, keep_ms, t, floor)`,
/// where `t` is Redis's `TIME` reply and `floor` (decimal digits, or nil) a token the caller
/// proposes: a quorum proposes one slightly ahead of its own clock, so that its nodes, whose
/// clocks differ, draw the same token and need no write-back (see `topology/quorum.rs`).
///
/// Each lock key `L` has a counter `F` beside it holding the last token drawn for it. A token
/// is Redis's clock in microseconds, or one more than the greatest counter of the lease's keys
/// when that is not less: after Redis lost a counter (a restart without persistence, a failover
/// to a replica that missed the write, an eviction), tokens go on from the clock instead of
/// starting again from 1, so they keep rising as long as Redis's clock does; while the counter
/// lives, a clock stepped back cannot make them fall. A counter lives `keep_ms` (the lease's
/// ttl) after its last draw, and longer when the token is ahead of the clock (more than one draw
/// per microsecond), so an expired counter never held a value the clock has not passed: no key
/// lives forever per lock name.
///
/// The common case (the clock is ahead of every counter) costs one `SET ... GET` per counter and
/// no number conversion: each counter is set to the clock's digits and answers its last value,
/// compared as digits (same length, so text order is number order); only a counter found ahead
/// is parsed, and makes a second write. `draw` returns the token as its digits. Tokens stay
/// below 2^53, so Lua numbers (and JavaScript's) hold them exactly.
pub(crate) const FENCE: &str = r"
local function draw(from, to, keep_ms, t, floor)
  local us = t[2]
  local now = t[1] .. string.rep('0', 6 - #us) .. us
  if floor and (#floor > #now or (#floor == #now and floor > now)) then
    -- Ahead of this server's clock: the counters live until the clock has passed it.
    keep_ms = string.format('%.0f', keep_ms + math.ceil((tonumber(floor) - (t[1] * 1000000 + us)) / 1000))
    now = floor
  end
  local ahead = nil
  for i = from, to do
    local last = redis.pcall('SET', KEYS[i], now, 'PX', keep_ms, 'GET')
    if type(last) == 'table' then
      -- Not a string (another program's key): it goes on from the clock, and this script
      -- does not stop half way.
      redis.call('SET', KEYS[i], now, 'PX', keep_ms)
      last = false
    end
    if last and (#last > #now or (#last == #now and last >= now)) then
      if not ahead or tonumber(last) > ahead then ahead = tonumber(last) end
    end
  end
  if not ahead then return now end
  local token = ahead + 1
  local now_us = t[1] * 1000000 + us
  local keep = keep_ms + math.ceil((token - now_us) / 1000)
  local text = string.format('%.0f', token)
  for i = from, to do redis.call('SET', KEYS[i], text, 'PX', keep) end
  return text
end
";

/// Raises fencing counters to a token drawn elsewhere, so the next lease of each key draws
/// above it: the write-back of a lease whose keys live on several servers (a cluster's slots,
/// a quorum's nodes), whose token is the greatest any of them drew.
///
/// KEYS: fencing counters. ARGV[1]: the token (decimal digits); ARGV[2]: the lease's ttl in ms.
/// Sets each counter that is missing or below the token to it, living the ttl plus however far
/// the token is ahead of this server's clock (the same rule as `draw`). Returns the number of
/// counters raised.
pub(crate) static RAISE: std::sync::LazyLock<crate::call::Lua> = std::sync::LazyLock::new(|| {
    crate::call::Lua::new(
        r"#!lua
local token, keep_ms = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local ahead = tonumber(token) - (t[1] * 1000000 + t[2])
local keep = string.format('%.0f', keep_ms + math.max(0, math.ceil(ahead / 1000)))
local raised = 0
for i = 1, #KEYS do
  local last = redis.pcall('GET', KEYS[i])
  if type(last) ~= 'string' or #last < #token or (#last == #token and last < token) then
    redis.call('SET', KEYS[i], token, 'PX', keep)
    raised = raised + 1
  end
end
return raised
",
    )
});

/// The write-back of `token` to the fencing counters of the keys `taking` takes ([`RAISE`]).
pub(crate) fn raise_call(taking: &crate::call::Taking, token: u64) -> crate::call::ScriptCall {
    use crate::call::{Kind, ScriptCall};
    let mut raise = ScriptCall::new(
        "acquire (fencing write-back)",
        &RAISE,
        Kind::Raise,
        taking.indices.len(),
    );
    for fence in taking.fences() {
        raise.key(fence);
    }
    raise.arg(token).arg(crate::time::millis(taking.ttl));
    raise
}
