//! The Lua scripts (and one transaction) that make every lock operation atomic on the Redis
//! server.
//!
//! Each script is sent with `EVALSHA` and reloaded on `NOSCRIPT` (redis-rs's `invoke_async`), so a
//! `SCRIPT FLUSH` or a server restart costs one extra round trip, never a failure. A lock key holds
//! the owner's random token as its value and the lease's expiry as its PTTL.

use std::sync::LazyLock;

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
const FENCE: &str = r"
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

/// Takes every lock key at once, or none: the acquire of every request that is not fair, for
/// one key or several.
///
/// KEYS: the lock keys `L1..Ln` (sorted, de-duplicated), then their fencing counters `F1..Fn`
/// in the same order (see [`FENCE`]).
/// ARGV[1]: the owner token; ARGV[2]: the ttl in milliseconds.
/// Returns the fencing token (an integer) when every key was free (or already held by this
/// token, so a retried request after a lost answer is harmless) and is now set with `PX ttl`;
/// `{0, i, pttl}` when some key is held by another owner, where `i` is the 1-based index of the
/// first held key and `pttl` the longest remaining PTTL among the held keys in ms (-1 when a held
/// key has no expiry). Nothing is written then.
///
/// Declared with `#!lua` (Redis 7.0): Redis checks memory and key permissions before the script
/// runs, so an acquire it refuses has written nothing; an acquire that fails after it wrote is
/// released by token (see `manager::InDoubt`).
pub(crate) static ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "#!lua\n{FENCE}{}",
        r"
local n = #KEYS / 2
local first = 0
for i = 1, n do
  local owner = redis.call('GET', KEYS[i])
  if owner and owner ~= ARGV[1] then first = i break end
end
if first > 0 then
  local longest = 0
  for i = first, n do
    local owner = redis.call('GET', KEYS[i])
    if owner and owner ~= ARGV[1] then
      local pttl = redis.call('PTTL', KEYS[i])
      if pttl < 0 then longest = -1 elseif longest >= 0 and pttl > longest then longest = pttl end
    end
  end
  return {0, first, longest}
end
local token = draw(n + 1, 2 * n, ARGV[2], clock_us())
for i = 1, n do redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2]) end
return token
"
    ))
});

/// Lua shared by the scripts that can hand a lock over to a fair waiter.
///
/// A fair queue is two keys beside the lock key `L`: `Q`, a list of waiting owner tokens in
/// arrival order, and `W`, a hash from each waiting token to its entry
/// `"deadline_ms claim_ms secret"` (Redis server time after which the waiter has given up; how
/// long a hand-off to it holds before it must confirm; a random value from the waiter's latest
/// attempt that only a hand-off made by this script can show it). The lock's fencing counter
/// (see [`FENCE`]) is named by its index in `KEYS`.
const FAIR_QUEUE: &str = r"
-- The token of the oldest waiter whose deadline is after now; stale entries in front are
-- dropped. nil when none is left.
local function first_live(Q, W, now)
  while true do
    local head = redis.call('LINDEX', Q, 0)
    if not head then return nil end
    local entry = redis.pcall('HGET', W, head)
    local deadline = type(entry) == 'string' and tonumber(string.match(entry, '^(%d+) ')) or 0
    if deadline > now then return head end
    redis.call('LPOP', Q)
    redis.pcall('HDEL', W, head)
  end
end
-- Gives the lock L (free, or held by the caller) to the oldest live waiter: L is set to its
-- token for its claim time (drawing a fencing token from the counter KEYS[f]), and a message
-- on L's channel tells it (and the waiter after it, which watches the claim) so, with the
-- waiter's secret as proof that the message comes from here. Returns false when no live
-- waiter is left.
local function serve(L, Q, W, f, now_us)
  local now = math.floor(now_us / 1000)
  local head = first_live(Q, W, now)
  if not head then
    redis.call('DEL', Q, W)
    return false
  end
  local claim, secret = string.match(redis.call('HGET', W, head), '^%d+ (%d+) ?(%x*)$')
  redis.call('LPOP', Q)
  redis.call('HDEL', W, head)
  local fence = draw(f, f, claim, now_us)
  redis.call('SET', L, head, 'PX', claim)
  local next = first_live(Q, W, now) or ''
  redis.call('PUBLISH', L,
    string.format('h %s %.0f %.0f %s %s %s', head, fence, now, claim, next, secret))
  return true
end
";

/// Releases the lock keys this owner still holds; never touches a key owned by someone else.
///
/// KEYS: for each lock key four keys: the lock key, its fair queue, its queue's entries (see
/// [`FAIR_QUEUE`]) and its fencing counter.
/// ARGV[1]: the owner token; ARGV[2]: `1` when the owner may be queued as a fair waiter (one
/// that gives up, or whose attempt's outcome is unknown), which then leaves the queue too.
/// Returns the number of lock keys this owner held. Each one is handed to the oldest live fair
/// waiter if its queue has one (a `h ...` message on the key's channel), else deleted and
/// announced with an empty message on the key's channel, for waiters. A key that is not a
/// string (overwritten by someone) is not ours and is skipped (`pcall`), so it cannot keep the
/// others from being released.
///
/// `allow-oom`: a release frees memory overall, and must complete under memory pressure rather
/// than stop half way through a hand-off.
pub(crate) static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "#!lua flags=allow-oom\n{FENCE}{FAIR_QUEUE}{}",
        r"
local token, queued = ARGV[1], ARGV[2] == '1'
local released = 0
for i = 1, #KEYS, 4 do
  local L, Q, W = KEYS[i], KEYS[i + 1], KEYS[i + 2]
  if queued and redis.pcall('HDEL', W, token) == 1 then redis.call('LREM', Q, 1, token) end
  if redis.pcall('GET', L) == token then
    released = released + 1
    if redis.call('EXISTS', Q) == 0 or not serve(L, Q, W, i + 3, clock_us()) then
      redis.call('DEL', L)
      redis.call('PUBLISH', L, '')
    end
  end
end
return released
"
    ))
});

/// Takes one lock key fairly: only when it is free and no live waiter arrived first; otherwise
/// joins the key's queue, to be handed the lock by a release.
///
/// KEYS: the lock key, its queue, its queue's entries, its fencing counter (see [`FAIR_QUEUE`]).
/// ARGV[1]: the owner token; ARGV[2]: the ttl in ms; ARGV[3]: the claim time of a hand-off in
/// ms; ARGV[4]: how much longer this caller waits, in ms; ARGV[5]: this attempt's secret (hex),
/// which a hand-off to this caller will show.
/// Returns `{1, fencing_token, now_ms}` when the caller holds the key now with `PX ttl`: it was
/// free and the caller first in line, or it had been handed to the caller (whose attempt
/// confirms the hand-off and draws a new fencing token, greater than the hand-off's).
/// `{0, pttl, now_ms}` when the caller is queued (once, keeping its place on later attempts)
/// behind the holder, whose remaining PTTL in ms is `pttl` (-1: no expiry); a caller that does
/// not wait (ARGV[4] is 0) is not queued. If the key was free
/// but another waiter was first in line, it is handed to that waiter first. `now_ms` is Redis
/// server time, which lets the caller date a hand-off it learns of by message.
/// The queue keys expire once no waiter in them can still be waiting.
pub(crate) static ACQUIRE_FAIR: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "#!lua\n{FENCE}{FAIR_QUEUE}{}",
        r"
local L, Q, W = KEYS[1], KEYS[2], KEYS[3]
local token, ttl, claim, wait, secret = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local now_us = clock_us()
local now = math.floor(now_us / 1000)
local owner = redis.call('GET', L)
if owner == token or (not owner and redis.call('EXISTS', Q) == 0) then
  -- Ours already (a hand-off, or a retried request), or free with nobody queued.
  local fence = draw(4, 4, ttl, now_us)
  redis.call('SET', L, token, 'PX', ttl)
  return {1, fence, now}
end
if not owner then
  local head = first_live(Q, W, now)
  if not head or head == token then
    if head then
      redis.call('LPOP', Q)
      redis.call('HDEL', W, token)
    end
    local fence = draw(4, 4, ttl, now_us)
    redis.call('SET', L, token, 'PX', ttl)
    return {1, fence, now}
  end
  serve(L, Q, W, 4, now_us)
end
if wait <= 0 then return {0, redis.call('PTTL', L), now} end
if redis.call('HEXISTS', W, token) == 0 then redis.call('RPUSH', Q, token) end
redis.call('HSET', W, token, string.format('%.0f %s %s', now + wait, claim, secret))
local keep = wait + tonumber(claim)
if redis.call('PTTL', Q) < keep then redis.call('PEXPIRE', Q, string.format('%.0f', keep)) end
if redis.call('PTTL', W) < keep then redis.call('PEXPIRE', W, string.format('%.0f', keep)) end
return {0, redis.call('PTTL', L), now}
"
    ))
});

/// Extends several leases in one call, each only if its owner still holds every one of its keys.
///
/// KEYS: the keys of every lease in the batch, lease after lease.
/// ARGV: for each lease, three values: owner token, new ttl in ms, number of keys.
/// Returns one integer per lease: 1 when every key was held by the token and got `PEXPIRE ttl`;
/// 0 when some key is gone, owned by another token or no longer a string (`pcall`: one broken
/// lease never fails the batch), in which case none of that lease's keys is touched (a lost lock
/// is never re-created or prolonged).
pub(crate) static EXTEND: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local results = {}
local k = 1
for a = 1, #ARGV, 3 do
  local token, ttl, count = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local owned = 1
  for i = k, k + count - 1 do
    if redis.pcall('GET', KEYS[i]) ~= token then owned = 0 break end
  end
  if owned == 1 then
    for i = k, k + count - 1 do redis.call('PEXPIRE', KEYS[i], ttl) end
  end
  results[#results + 1] = owned
  k = k + count
end
return results
",
    )
});

/// What the acquire script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// Every key is now held; the lease's fencing token.
    Acquired { fencing_token: u64 },
    /// Some key is held by another owner.
    Held {
        /// Index into the request's sorted keys of the first held key.
        first_held: usize,
        /// The longest remaining lifetime among the held keys, if they all have one.
        remaining: Option<std::time::Duration>,
    },
}

/// What the fair acquire script answered, with the Redis server time it ran at (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FairAnswer {
    pub(crate) acquire: Acquire,
    pub(crate) server_ms: u64,
}

impl redis::FromRedisValue for FairAnswer {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let fields: Vec<i64> = redis::FromRedisValue::from_redis_value(v)?;
        let (acquire, now) = match fields.as_slice() {
            [1, fence, now] => (
                Acquire::Acquired {
                    fencing_token: u64::try_from(*fence)
                        .map_err(|_| redis::ParsingError::from("negative fencing token"))?,
                },
                now,
            ),
            [0, pttl, now] => (
                Acquire::Held {
                    first_held: 0,
                    remaining: u64::try_from(*pttl)
                        .ok()
                        .map(std::time::Duration::from_millis),
                },
                now,
            ),
            _ => {
                return Err(redis::ParsingError::from(
                    "unexpected fair acquire script reply",
                ))
            }
        };
        Ok(Self {
            acquire,
            server_ms: u64::try_from(*now)
                .map_err(|_| redis::ParsingError::from("negative server time"))?,
        })
    }
}

/// A hand-off message: the lock was given to `token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handoff {
    /// The waiter the lock was handed to.
    pub(crate) token: String,
    pub(crate) fencing_token: u64,
    /// Redis server time of the hand-off, in ms.
    pub(crate) server_ms: u64,
    /// How long the lock is held for the waiter before it must be extended.
    pub(crate) claim: std::time::Duration,
    /// The next live waiter in line, which watches the claim; empty when none.
    pub(crate) next: String,
    /// The secret the recipient's latest attempt stored in the queue: a message without it was
    /// not made by the release script.
    pub(crate) secret: String,
}

impl Handoff {
    /// Parses a message from the release channel: `None` for a plain release (empty) or
    /// anything not a hand-off.
    pub(crate) fn parse(message: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(message).ok()?;
        let mut fields = text.strip_prefix("h ")?.split(' ');
        let token = fields.next()?.to_owned();
        let fencing_token = fields.next()?.parse().ok()?;
        let server_ms = fields.next()?.parse().ok()?;
        let claim = std::time::Duration::from_millis(fields.next()?.parse().ok()?);
        let next = fields.next().unwrap_or_default().to_owned();
        let secret = fields.next().unwrap_or_default().to_owned();
        Some(Self {
            token,
            fencing_token,
            server_ms,
            claim,
            next,
            secret,
        })
    }
}

impl redis::FromRedisValue for Acquire {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        if let redis::Value::Int(fence) = v {
            return Ok(Self::Acquired {
                fencing_token: u64::try_from(fence)
                    .map_err(|_| redis::ParsingError::from("negative fencing token"))?,
            });
        }
        let fields: Vec<i64> = redis::FromRedisValue::from_redis_value(v)?;
        match fields.as_slice() {
            [0, index, pttl] => Ok(Self::Held {
                first_held: usize::try_from(*index - 1)
                    .map_err(|_| redis::ParsingError::from("bad key index"))?,
                remaining: u64::try_from(*pttl)
                    .ok()
                    .map(std::time::Duration::from_millis),
            }),
            _ => Err(redis::ParsingError::from("unexpected acquire script reply")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_off_messages_parse_and_plain_releases_do_not() {
        let handoff = Handoff::parse(b"h 0af3 17 1795000000123 2000 9bc1 5e").unwrap();
        assert_eq!(
            handoff,
            Handoff {
                token: "0af3".into(),
                fencing_token: 17,
                server_ms: 1_795_000_000_123,
                claim: std::time::Duration::from_secs(2),
                next: "9bc1".into(),
                secret: "5e".into(),
            }
        );
        let last_in_line = Handoff::parse(b"h a 1 2 3  5e").unwrap();
        assert_eq!((&*last_in_line.next, &*last_in_line.secret), ("", "5e"));
        assert!(Handoff::parse(b"").is_none());
        assert!(Handoff::parse(b"h a x 2 3 ").is_none());
    }
}
