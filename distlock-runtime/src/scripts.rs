//! The Lua scripts that take, release and extend locks, atomically on the Redis server. The
//! fair queue's own script and the Lua it shares with the release live in `fair.rs`, the
//! fencing counter's Lua in `fence.rs`.
//!
//! Each script is sent with `EVALSHA`, and with `EVAL` (which loads it again) on `NOSCRIPT`, so a
//! `SCRIPT FLUSH`, a server restart or a promoted replica costs one extra round trip, never a
//! failure (see `topology/mod.rs`). A lock key holds
//! the owner's random token as its value and the lease's expiry as its PTTL.
//!
//! **Waited on.** A holder's value gets a `~` in front of its token (tokens start with a hex
//! digit) once someone waits for the key: an attempt that finds it held and will wait marks it,
//! in the same script, and a hand-off gives the key marked. Only a marked lock's release looks
//! for a fair waiter to hand it to and announces itself on the key's channel; an unmarked one is
//! a plain `GET` and `DEL`, as the cheapest hand-written lock is. A waiter therefore marks every
//! holder it waits on before it relies on that holder's release to wake it: a holder that
//! changes by a release announces itself if it was marked, one that expires publishes nothing
//! anyway (waiters wake at its expiry), and one handed over is marked. Scripts that check an
//! owner accept both forms; a mark is never removed but by the key's deletion, and a stale one
//! (its waiter gave up, or only tried) costs that release its announcement, nothing else. A
//! quorum announces every release: its waiter listens on one node, where the attempt that
//! marked the holder may have failed.

use std::sync::LazyLock;

use redis::{RedisWrite, ToRedisArgs};

use crate::call::Lua;
use crate::fair::FAIR_QUEUE;
use crate::fence::FENCE;

/// Takes every lock key at once, or none: the acquire of every request that is not fair, for
/// one key or several.
///
/// KEYS: the lock keys `L1..Ln` (sorted, de-duplicated), then their fencing counters `F1..Fn`
/// in the same order (see `fence.rs`).
/// ARGV[1]: the owner token; ARGV[2]: the ttl in milliseconds; ARGV[3] ([`Waiting`]): `1` when
/// this request has waited for a key already (it competed with other waiters, who may still
/// wait: the keys it takes are marked as waited on), `0` when it has not, `-` when it will not
/// wait at all (a try-lock, which marks nothing); ARGV[4] (optional): a proposed fencing token, the least one
/// drawn (see `fence.rs`).
/// Returns the fencing token (its decimal digits) when every key was free (or already held by this
/// token, so a retried request after a lost answer is harmless) and is now set with `PX ttl`;
/// `{0, i, pttl}` when some key is held by another owner, where `i` is the 1-based index of the
/// first held key and `pttl` the longest remaining PTTL among the held keys in ms (-1 when a held
/// key has no expiry). No key is taken then; the first held key is marked as waited on (see the
/// module docs), since that is the key a waiter waits for.
///
/// Declared with `#!lua` (Redis 7.0): Redis checks memory and key permissions before the script
/// runs, so an acquire it refuses has written nothing; an acquire that fails after it wrote (a
/// counter overwritten with another type, say) is released by token (see `acquire.rs`, "in
/// doubt"). A retried request that finds its own token takes the key as it is, with a new
/// fencing token.
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        "#!lua\n{FENCE}{}",
        r"
local n = #KEYS / 2
local token, waited = ARGV[1], '~' .. ARGV[1]
-- What a free key is set to.
local value = ARGV[3] == '1' and waited or token
-- Marks a key held by another owner as waited on (see the module docs): its release will announce
-- itself. A try-lock does not wait, and marks nothing.
local function mark(key, owner)
  if ARGV[3] ~= '-' and string.byte(owner) ~= 126 then
    redis.call('SET', key, '~' .. owner, 'KEEPTTL')
  end
end
if n == 1 then
  -- One key: take it if free, in one command.
  local owner = redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2], 'GET')
  if owner and owner ~= token and owner ~= waited then
    mark(KEYS[1], owner)
    return {0, 1, redis.call('PTTL', KEYS[1])}
  end
  -- Ours already (a retried request that ran late): the ttl counts from now.
  if owner then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
else
  local first, owners = 0, {}
  for i = 1, n do
    local owner = redis.call('GET', KEYS[i])
    if owner and owner ~= token and owner ~= waited then first = i break end
    owners[i] = owner
  end
  if first > 0 then
    local longest = 0
    for i = first, n do
      local owner = redis.call('GET', KEYS[i])
      if owner and owner ~= token and owner ~= waited then
        if i == first then mark(KEYS[i], owner) end
        local pttl = redis.call('PTTL', KEYS[i])
        if pttl < 0 then longest = -1 elseif longest >= 0 and pttl > longest then longest = pttl end
      end
    end
    return {0, first, longest}
  end
  -- A key of ours already waited on stays marked.
  for i = 1, n do
    local owner = owners[i]
    redis.call('SET', KEYS[i], owner == waited and owner or value, 'PX', ARGV[2])
  end
end
return draw(n + 1, 2 * n, ARGV[2], redis.call('TIME'), ARGV[4])
"
    ))
});

/// Releases the lock keys this owner still holds; never touches a key owned by someone else.
///
/// KEYS: for each lock key four keys: the lock key, its fair queue, its queue's entries (see
/// `fair.rs`) and its fencing counter.
/// ARGV[1]: the owner token; ARGV[2] ([`Queued`]): `1` when the owner may be queued as a fair
/// waiter (one that gives up, or whose attempt's outcome is unknown), which then leaves the
/// queue too; ARGV[3]: the command that announces a release (`PUBLISH`, or `SPUBLISH` on a
/// cluster); ARGV[4] ([`Announce`]): `1` to treat every key as waited on (a quorum's: see
/// `Route::announces`).
/// Returns the number of lock keys this owner held. One that nobody waited on (unmarked, see the
/// module docs) is deleted. A marked one is handed to the oldest live fair waiter if its queue
/// has one (a `h ...` message on the key's channel), else deleted and announced with an empty
/// message on the key's channel, for waiters (an announcement Redis refuses, to an ACL user
/// without channel rights, is skipped). A key that is not a
/// string (overwritten by someone) is not ours and is skipped (`pcall`), so it cannot keep the
/// others from being released.
///
/// `allow-oom`: a release frees memory overall, and must complete under memory pressure rather
/// than stop half way through a hand-off.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(format!(
        r"#!lua flags=allow-oom
local token, queued, publish, always = ARGV[1], ARGV[2] == '1', ARGV[3], ARGV[4] == '1'
local released = 0
for i = 1, #KEYS, 4 do
  local L, Q, W = KEYS[i], KEYS[i + 1], KEYS[i + 2]
  if queued and redis.pcall('HDEL', W, token) == 1 then redis.call('LREM', Q, 1, token) end
  local owner = redis.pcall('GET', L)
  if owner == token and not always then
    -- Nobody waited on this lease (see the module docs): nothing to hand over or announce.
    released = released + 1
    redis.call('DEL', L)
  elseif owner == token or owner == '~' .. token then
    released = released + 1
    -- The queue's first waiter, if any (pcall: a queue key of another type holds none).
    local head = redis.pcall('LPOP', Q)
    if type(head) ~= 'string' then head = nil end
    if head then
      -- Defined here, so a release without a queue spends nothing on them.
      {FENCE}{FAIR_QUEUE}
      head = serve(L, Q, W, i + 3, head)
    end
    if not head then
      redis.call('DEL', L)
      -- pcall: a user without channel rights still releases; its waiters poll.
      redis.pcall(publish, L, '')
    end
  end
end
return released
"
    ))
});

/// Extends several leases in one call, each only if its owner still holds every one of its keys.
///
/// KEYS: the keys of every lease in the batch, lease after lease.
/// ARGV: for each lease, three values: owner token, new ttl in ms, number of keys.
/// Returns one integer per lease: 1 when every key was held by the token (marked as waited on or
/// not) and got `PEXPIRE ttl`;
/// 0 when some key is gone, owned by another token or no longer a string (`pcall`: one broken
/// lease never fails the batch), in which case none of that lease's keys is touched (a lost lock
/// is never re-created or prolonged).
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"
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
",
    )
});

/// Whether a request waits, and whether it has waited: `ACQUIRE`'s ARGV[3], `ACQUIRE_FAIR`'s
/// ARGV[7]. It says whether an attempt marks a held key as waited on (see the module docs), and
/// whether it takes free keys marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// It will wait, and has not yet: an attempt that finds a key held marks it, one that takes
    /// keys takes them plain. Sent as `0`.
    NotYet,
    /// An earlier attempt found a key held: keys taken now are marked, for the waiters behind.
    /// Sent as `1`.
    Waited,
    /// A try-lock: it marks nothing. Sent as `-` (the fair script tells a try-lock by its wait
    /// of 0 ms, and reads this as `0`).
    Never,
}

impl ToRedisArgs for Waiting {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(match self {
            Self::NotYet => b"0",
            Self::Waited => b"1",
            Self::Never => b"-",
        });
    }
}

/// Whether the owner of a release may be queued as a fair waiter (one that gives up, or whose
/// attempt's outcome is unknown), which then leaves the keys' queues too: `RELEASE`'s ARGV[2].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queued {
    /// Not queued: a lease's owner. Sent as `0`.
    No,
    /// Maybe queued. Sent as `1`.
    Maybe,
}

impl ToRedisArgs for Queued {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(match self {
            Self::No => b"0",
            Self::Maybe => b"1",
        });
    }
}

/// Which releases announce themselves on the key's channel: `RELEASE`'s ARGV[4].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// Only that of a key marked as waited on (see the module docs). Sent as `0`.
    WaitedOn,
    /// Every release, as though every key were marked (a quorum's: see `Route::announces`).
    /// Sent as `1`.
    Always,
}

impl ToRedisArgs for Announce {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg(match self {
            Self::WaitedOn => b"0",
            Self::Always => b"1",
        });
    }
}

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

impl redis::FromRedisValue for Acquire {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        if let redis::Value::Int(_) | redis::Value::BulkString(_) = v {
            return Ok(Self::Acquired {
                fencing_token: redis::FromRedisValue::from_redis_value(v)?,
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
    fn the_flags_are_sent_as_the_values_the_scripts_tell_apart() {
        fn sent(flag: impl ToRedisArgs) -> Vec<Vec<u8>> {
            flag.to_redis_args()
        }
        assert_eq!(sent(Waiting::NotYet), [b"0"]);
        assert_eq!(sent(Waiting::Waited), [b"1"]);
        assert_eq!(sent(Waiting::Never), [b"-"]);
        assert_eq!(sent(Queued::No), [b"0"]);
        assert_eq!(sent(Queued::Maybe), [b"1"]);
        assert_eq!(sent(Announce::WaitedOn), [b"0"]);
        assert_eq!(sent(Announce::Always), [b"1"]);
    }
}
