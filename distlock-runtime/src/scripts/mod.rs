//! The Lua that Redis runs, one `.lua` file per script or shared function in this folder, and
//! the scripts that take, release and extend locks.
//!
//! **Files.** Each script's file starts with its contract (KEYS, ARGV, what it returns) and is
//! composed at compile time ([`lua!`]) after its first line (`#!lua` and its flags, which Redis
//! reads only there) and the shared functions it calls, each rule defined once, in one file,
//! taking everything it uses as arguments: `counter.lua` (how fencing tokens compare, and how
//! long a counter lives) and `draw.lua` (a fencing token, see `fence.rs`), `mark.lua`
//! (`is_marked`), `owner.lua` (`is_owner`), `holders.lua` (a shared or permit lease's member,
//! and whether a mode `fits` beside the holders), and the fair queue's `entry.lua` (a waiter's
//! entry, written and read), `head_live.lua`, `hand.lua` and `admit.lua`, which live with the
//! rest of the fair protocol in `fair/` (its acquire, `fair/acquire.lua`, too). A script that
//! needs shared functions in some branches only has them put there instead ([`lua_spliced!`]):
//! Redis creates a closure for every function definition a run of the script reaches, and
//! defining the release's four up front made a release that hands nothing over cost about 13%
//! more server time (0.67 µs of 5.1 µs per call: the median of 40 paired runs, by `INFO
//! commandstats`). Where a common path would pay for functions it calls once, it writes the
//! rule out instead, with the measured cost beside it (the one-key shared acquire, a shared
//! release). Each script's static sits beside the Rust that builds its calls (`ACQUIRE_FAIR`
//! and `REFRESH_FAIR` in `fair/queue.rs`, `RAISE` in `fence.rs`, `INSPECT` and `FORCE_RELEASE`
//! in `inspect.rs`, `CHECK` in `diagnose.rs`, `TYPES` in `refusal.rs`); `catalog.rs` lists
//! them, and pins each one's SHA1 so that an accidental change shows. The flags the Rust side
//! sends are types ([`Waiting`], [`Queued`], [`Announce`]); each script names the values it
//! tells apart once, as local constants.
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

use std::sync::{Arc, LazyLock};

use crate::call::{Confirm, ScriptCall, Taking};
use crate::keys::LockKeys;
use crate::mode::{LockMode, Words};
use crate::time::millis;

pub(crate) mod flags;
mod inspected;
pub(crate) mod lua;

pub(crate) use flags::{Announce, Queued, Waiting};
pub(crate) use inspected::Inspected;
pub(crate) use lua::{lua, lua_spliced, Lua};

/// Takes every lock key at once, or none: `acquire.lua`.
//
// `#!lua` (Redis 7.0): Redis checks memory and key permissions before the script runs, so an
// acquire it refuses has written nothing; an acquire that fails after it wrote is released by
// token (see `acquire/mod.rs`, "in doubt").
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua_spliced!(
        "#!lua";
        "scripts/shared.lua", "scripts/draw_now.lua", "scripts/join.lua", "scripts/acquire.lua"
        at "--[[ draw ]]"; lua!("scripts/counter.lua", "scripts/draw.lua"),
        at "--[[ owner ]]"; lua!("scripts/mark.lua", "scripts/owner.lua"),
        at "--[[ holders ]]"; lua!("scripts/holders.lua", "fair/entry.lua", "fair/head_live.lua")
    ))
});

/// Releases the lock keys this owner still holds, handing marked ones to fair waiters:
/// `release.lua`.
//
// `allow-oom`: a release frees memory overall, and must complete under memory pressure rather
// than stop half way through a hand-off.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua_spliced!(
        "#!lua flags=allow-oom";
        "scripts/shared.lua", "scripts/release.lua"
        at "--[[ owner ]]"; lua!("scripts/owner.lua"),
        at "--[[ queue functions ]]"; queue_functions!()
    ))
});

/// The functions a script that serves a fair queue defines (see `fair/admit.lua`), in the order
/// they call each other.
macro_rules! queue_functions {
    () => {
        concat!(
            $crate::scripts::lua!(
                "scripts/counter.lua",
                "scripts/draw.lua",
                "scripts/holders.lua"
            ),
            $crate::scripts::serving!()
        )
    };
}
pub(crate) use queue_functions;

/// The part of [`queue_functions!`] after `draw.lua` and `holders.lua` (which it calls): what a
/// script that needs those anyway adds where it serves the queue.
macro_rules! serving {
    () => {
        $crate::scripts::lua!(
            "fair/entry.lua",
            "fair/head_live.lua",
            "fair/hand.lua",
            "fair/admit.lua"
        )
    };
}
pub(crate) use serving;

/// Extends several leases in one call, each only if its owner still holds every one of its
/// keys: `extend.lua`.
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua!(
        "scripts/shared.lua",
        "scripts/owner.lua",
        "scripts/holders.lua",
        "scripts/extend.lua"
    ))
});

impl Taking {
    /// [`ACQUIRE`]'s call, an attempt of a wait that ends at `deadline` (none for a try-lock),
    /// marking as `waiting` says.
    pub(crate) fn call(
        self: &Arc<Self>,
        deadline: Option<tokio::time::Instant>,
        waiting: Waiting,
    ) -> ScriptCall {
        let keys = || self.indices.iter().map(|&i| &self.keys[i]);
        // The holders and queue keys only when some key is not taken exclusively: an exclusive
        // request never looks at them (a key held shared holds SHARED, `scripts/shared.lua`).
        let exclusive = keys().all(|k| k.mode() == LockMode::Exclusive);
        let kinds: &[fn(&LockKeys) -> &str] = if exclusive {
            &[LockKeys::lock, LockKeys::fence]
        } else {
            &[
                LockKeys::lock,
                LockKeys::fence,
                LockKeys::holders,
                LockKeys::queue,
                LockKeys::waiters,
            ]
        };
        let key_count = kinds.len() * self.indices.len();
        let mut call = ScriptCall::new(
            "acquire",
            &ACQUIRE,
            Confirm::Acquire(Arc::clone(self)),
            key_count,
        );
        for kind in kinds {
            for keys in keys() {
                call.key(kind(keys));
            }
        }
        let modes = Words(keys().map(LockKeys::word));
        call.arg(&*self.token)
            .arg(millis(self.ttl))
            .arg(waiting)
            .arg(modes);
        call.deadline = deadline;
        call
    }

    /// The release that undoes this acquire.
    pub(crate) fn undo(&self) -> ScriptCall {
        release_call(
            (self.publish, self.announce),
            self.indices.iter().map(|&i| &self.keys[i]),
            &self.token,
            Queued::No,
        )
    }
}

/// The release of `keys` (which share a shard) by `token`: [`RELEASE`]'s call, announced with
/// `publish` as `announce` says.
pub(crate) fn release_call<'a>(
    (publish, announce): (&'static str, Announce),
    keys: impl ExactSizeIterator<Item = &'a LockKeys> + Clone,
    token: &str,
    queued: Queued,
) -> ScriptCall {
    let mut call = ScriptCall::new("release", &RELEASE, Confirm::No, 5 * keys.len());
    for keys in keys.clone() {
        call.key(keys.lock())
            .key(keys.queue())
            .key(keys.waiters())
            .key(keys.fence())
            .key(keys.holders());
    }
    call.arg(token).arg(queued).arg(publish).arg(announce);
    // Without modes, the script holds every key exclusive: the common case sends none.
    if keys.clone().any(|k| k.mode() != LockMode::Exclusive) {
        call.arg(Words(keys.map(LockKeys::word)));
    }
    call
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
        /// With `min_replicas`: the attempt's `WAIT` was answered by fewer replicas than
        /// required (see `topology/replicas.rs`).
        unconfirmed: Option<Unconfirmed>,
    },
}

/// What one attempt of an acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) answer: Acquire,
    /// A place's acquire may still run and grant (a hung quorum node): the request must not
    /// send its owner token again.
    pub(crate) late: bool,
}

/// With `min_replicas`, an attempt that found a key held whose `WAIT` fewer replicas than
/// required answered: the replicas confirm nothing now, so the holder it found may itself be
/// an acquire waiting for them, and no acquire can count until they answer again. A wait that
/// ends on such an attempt fails with [`LockError::Replication`](crate::LockError::Replication),
/// not as contention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unconfirmed {
    /// How many replicas acknowledged.
    pub(crate) acked: usize,
    /// How many were required.
    pub(crate) needed: usize,
    /// How long they were waited for.
    pub(crate) within: std::time::Duration,
}

impl Unconfirmed {
    /// The acquire script's answer `held` (`{0, i, pttl}`) with this after it, as a deployment that
    /// waits for replicas answers such an attempt: `{0, i, pttl, acked, needed, within_ms}`.
    pub(crate) fn appended_to(self, held: redis::Value) -> redis::Value {
        let mut fields = match held {
            redis::Value::Array(fields) => fields,
            other => return other,
        };
        let count = |n: usize| redis::Value::Int(i64::try_from(n).unwrap_or(i64::MAX));
        fields.extend([
            count(self.acked),
            count(self.needed),
            redis::Value::Int(i64::try_from(self.within.as_millis()).unwrap_or(i64::MAX)),
        ]);
        redis::Value::Array(fields)
    }

    /// The error of an acquire that ends on this attempt.
    pub(crate) fn error(self) -> crate::LockError {
        crate::LockError::Replication {
            op: "acquire",
            acked: self.acked,
            needed: self.needed,
            within: self.within,
        }
    }
}

/// What a script that takes keys answered: a fencing token when it took them (a bare integer or
/// string, read without an array: the common case), else its array of integers.
pub(crate) enum Answered {
    /// It took the keys: their fencing token.
    Token(u64),
    /// It did not: its array.
    Fields(Vec<i64>),
}

/// Reads a taking script's answer (see [`Answered`]).
pub(crate) fn read_taking(v: redis::Value) -> Result<Answered, redis::ParsingError> {
    use redis::FromRedisValue;
    match v {
        redis::Value::Int(_) | redis::Value::BulkString(_) => {
            Ok(Answered::Token(u64::from_redis_value(v)?))
        }
        v => Ok(Answered::Fields(Vec::<i64>::from_redis_value(v)?)),
    }
}

impl redis::FromRedisValue for Acquire {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let fields = match read_taking(v)? {
            Answered::Token(fencing_token) => return Ok(Self::Acquired { fencing_token }),
            Answered::Fields(fields) => fields,
        };
        let (index, pttl, unconfirmed) = match fields.as_slice() {
            [0, index, pttl] => (index, pttl, None),
            [0, index, pttl, acked, needed, within] => {
                let count = |n: &i64| usize::try_from(*n).unwrap_or(0);
                let unconfirmed = Unconfirmed {
                    acked: count(acked),
                    needed: count(needed),
                    within: std::time::Duration::from_millis(u64::try_from(*within).unwrap_or(0)),
                };
                (index, pttl, Some(unconfirmed))
            }
            _ => return Err(redis::ParsingError::from("unexpected acquire script reply")),
        };
        Ok(Self::Held {
            first_held: usize::try_from(*index - 1)
                .map_err(|_| redis::ParsingError::from("bad key index"))?,
            remaining: u64::try_from(*pttl)
                .ok()
                .map(std::time::Duration::from_millis),
            unconfirmed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_splice_puts_the_shared_text_in_place_of_the_marker() {
        const SPLICED: [u8; 9] = lua::splice("a\n--[[ x ]]\nb\n", "--[[ x ]]", "f()\n");
        assert_eq!(&SPLICED, b"a\nf()\n\nb\n");
    }

    #[test]
    fn several_markers_are_spliced_in_turn() {
        const SPLICED: &str = lua::spliced!(
            "a\n--[[ x ]]\nb\n--[[ y ]]\n";
            "--[[ x ]]" => "f()\n",
            "--[[ y ]]" => "g()\n"
        );
        assert_eq!(SPLICED, "a\nf()\n\nb\ng()\n\n");
    }

    #[test]
    fn an_unconfirmed_held_answer_is_read_with_its_replicas() {
        use redis::FromRedisValue;
        let held = redis::Value::Array(vec![
            redis::Value::Int(0),
            redis::Value::Int(2),
            redis::Value::Int(1500),
        ]);
        let unconfirmed = Unconfirmed {
            acked: 0,
            needed: 1,
            within: std::time::Duration::from_millis(250),
        };
        let read = |value| Acquire::from_redis_value(value).unwrap();
        let remaining = Some(std::time::Duration::from_millis(1500));
        assert_eq!(
            read(held.clone()),
            Acquire::Held {
                first_held: 1,
                remaining,
                unconfirmed: None
            }
        );
        assert_eq!(
            read(unconfirmed.appended_to(held)),
            Acquire::Held {
                first_held: 1,
                remaining,
                unconfirmed: Some(unconfirmed)
            }
        );
        assert!(matches!(
            unconfirmed.error(),
            crate::LockError::Replication {
                op: "acquire",
                acked: 0,
                needed: 1,
                ..
            }
        ));
    }

    #[test]
    fn the_flags_are_sent_as_the_values_the_scripts_tell_apart() {
        fn sent(flag: impl redis::ToRedisArgs) -> Vec<Vec<u8>> {
            flag.to_redis_args()
        }
        assert_eq!(sent(Waiting::NotYet), [b"0"]);
        assert_eq!(sent(Waiting::Waited), [b"1"]);
        assert_eq!(sent(Waiting::Never), [b"-"]);
        assert_eq!(sent(Queued::No), [b"0"]);
        assert_eq!(sent(Queued::Maybe), [b"1"]);
        assert_eq!(sent(Announce::WaitedOn), [b"0"]);
        assert_eq!(sent(Announce::Always), [b"1"]);
        // And each script names the values it tells apart once.
        assert!(ACQUIRE
            .code()
            .contains("local WAITED, NEVER, EXCLUSIVE = '1', '-', 'x'"));
        assert!(crate::fair::ACQUIRE_FAIR
            .code()
            .contains("local WAITED, EXCLUSIVE = '1', 'x'"));
        assert!(RELEASE
            .code()
            .contains("local QUEUED, ALWAYS, EXCLUSIVE = '1', '1', 'x'"));
    }
}
