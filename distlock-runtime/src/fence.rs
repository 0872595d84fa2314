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

/// Lua shared by every script that draws a fencing token.
///
/// Each lock key `L` has a counter `F` beside it holding the last token drawn for it. A token
/// is one more than the greatest counter of the lease's keys, and at least Redis's clock in
/// microseconds (`TIME`): after Redis lost a counter (a restart without persistence, a failover
/// to a replica that missed the write, an eviction), tokens go on from the clock instead of
/// starting again from 1, so they keep rising as long as Redis's clock does. A counter lives
/// `keep_ms` (the lease's ttl) after its last draw, and longer when the token is ahead of the
/// clock (more than one draw per microsecond), so an expired counter never held a value the
/// clock has not passed: no key lives forever per lock name.
///
/// Tokens stay below 2^53, so Lua numbers hold them exactly; Redis writes a number argument of
/// `redis.call` with all its digits (Lua's own `tostring` would not).
pub(crate) const FENCE: &str = r"
-- Redis's clock, in microseconds.
local function clock_us()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
-- Draws one token for the counters KEYS[from..to] at Redis time now_us; each is set to it.
local function draw(from, to, keep_ms, now_us)
  local token = now_us
  for i = from, to do
    local last = tonumber(redis.call('GET', KEYS[i]))
    if last and last >= token then token = last + 1 end
  end
  local keep = keep_ms
  if token > now_us then keep = keep + math.ceil((token - now_us) / 1000) end
  for i = from, to do redis.call('SET', KEYS[i], token, 'PX', keep) end
  return token
end
";
