//! The Lua scripts (and one transaction) that make every lock operation atomic on the Redis
//! server.
//!
//! Each script is sent with `EVALSHA` and reloaded on `NOSCRIPT` (redis-rs's `invoke_async`), so a
//! `SCRIPT FLUSH` or a server restart costs one extra round trip, never a failure. A lock key holds
//! the owner's random token as its value and the lease's expiry as its PTTL.

use std::sync::LazyLock;

/// Takes every lock key at once, or none.
///
/// KEYS[1..n]: the lock keys, sorted and de-duplicated; KEYS[n+1]: the fencing counter.
/// ARGV[1]: the owner token; ARGV[2]: the ttl in milliseconds.
/// Returns `{1, fencing_token}` when every key was free (or already held by this token, so a
/// retried request after a lost answer is harmless) and is now set with `PX ttl`;
/// `{0, i, pttl}` when some key is held by another owner, where `i` is the 1-based index of the
/// first held key and `pttl` the longest remaining PTTL among the held keys in ms (-1 when a held
/// key has no expiry).
pub(crate) static ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local n = #KEYS - 1
local first, longest = 0, 0
for i = 1, n do
  local owner = redis.call('GET', KEYS[i])
  if owner and owner ~= ARGV[1] then
    if first == 0 then first = i end
    local pttl = redis.call('PTTL', KEYS[i])
    if pttl < 0 then longest = -1 elseif longest >= 0 and pttl > longest then longest = pttl end
  end
end
if first > 0 then return {0, first, longest} end
local fence = redis.call('INCR', KEYS[n + 1])
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return {1, fence}
",
    )
});

/// Takes one lock key without Lua: the common single-key acquire. Lua has a fixed cost per
/// call, and so does `MULTI`/`EXEC`; three plain commands in one write cost the least.
///
/// `SET key token NX PX ttl GET; INCR fence; PTTL key` (`NX` with `GET` needs Redis 7.0).
/// `SET` answers the key's previous value: none, so the key is now ours; our own token, so a
/// retried request already took it; anything else, so it is held and `PTTL` says for how long.
///
/// Why the fencing number needs no transaction: this connection's `INCR` runs after its `SET`
/// and before its reply. The lease is only used if that reply arrives within the lease's
/// validity (counted from before the send, see `LeaseState`), so the `INCR` ran before the key
/// could expire; the next owner's `SET`, and so its `INCR`, comes after this key is released or
/// expired, and draws a greater number. Failed attempts draw numbers too, leaving gaps only.
pub(crate) fn acquire_one(key: &str, fence_key: &str, token: &str, ttl_ms: u64) -> redis::Pipeline {
    // Sized up front: growing the argument buffers one push at a time costs more than the
    // rest of building the request.
    let mut set = redis::Cmd::with_capacity(7, 32 + key.len() + token.len());
    set.arg("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .arg("GET");
    let mut incr = redis::Cmd::with_capacity(2, 4 + fence_key.len());
    incr.arg("INCR").arg(fence_key);
    let mut pttl = redis::Cmd::with_capacity(2, 4 + key.len());
    pttl.arg("PTTL").arg(key);
    let mut pipe = redis::Pipeline::with_capacity(3);
    pipe.add_command(set).add_command(incr).add_command(pttl);
    pipe
}

/// What [`acquire_one`] answered, for the owner of `token`.
pub(crate) fn acquire_one_answer(
    (previous, fence, pttl): (Option<String>, i64, i64),
    token: &str,
) -> Result<Acquire, redis::ParsingError> {
    match previous {
        Some(owner) if owner != token => Ok(Acquire::Held {
            first_held: 0,
            remaining: u64::try_from(pttl)
                .ok()
                .map(std::time::Duration::from_millis),
        }),
        _ => Ok(Acquire::Acquired {
            fencing_token: u64::try_from(fence)
                .map_err(|_| redis::ParsingError::from("negative fencing token".to_owned()))?,
        }),
    }
}

/// Deletes the lock keys this owner still holds; never touches a key owned by someone else.
///
/// KEYS: the lock keys. ARGV[1]: the owner token.
/// Returns the number of keys deleted. A key that is not a string (overwritten by someone) is
/// not ours and is skipped (`pcall`), so it cannot keep the others from being released. Each
/// deleted key is announced with `PUBLISH` on the channel of the key's name, for waiters.
pub(crate) static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local deleted = 0
for i = 1, #KEYS do
  if redis.pcall('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    redis.call('PUBLISH', KEYS[i], '')
    deleted = deleted + 1
  end
end
return deleted
",
    )
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

impl redis::FromRedisValue for Acquire {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let fields: Vec<i64> = redis::FromRedisValue::from_redis_value(v)?;
        match fields.as_slice() {
            [1, fence] => Ok(Self::Acquired {
                fencing_token: u64::try_from(*fence)
                    .map_err(|_| redis::ParsingError::from("negative fencing token"))?,
            }),
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
