//! The Lua that Redis runs, one `.lua` file per script or shared function in this folder, and
//! the scripts that take, release and extend locks.
//!
//! **Files.** Each script's file starts with its contract (KEYS, ARGV, what it returns) and is
//! composed at compile time ([`lua!`]) after its first line (`#!lua` and its flags, which Redis
//! reads only there) and the shared functions it calls, each defined once in a file of its own
//! and taking everything it uses as arguments: `draw.lua` (a fencing token, see `fence.rs`),
//! `mark.lua` (`is_marked`), and the fair queue's `fair_pop_live.lua`, `fair_hand.lua` and
//! `fair_serve.lua` (see `fair.rs`). The fair queue's files are named `fair_*.lua`, its scripts
//! too. A script that needs shared functions in one branch only has them put there instead
//! ([`lua_spliced!`]): Redis creates a closure for every function definition a run of the
//! script reaches, and defining the release's four up front made a release that hands nothing
//! over cost about 13% more server time (0.67 µs of 5.1 µs per call: the median of 40 paired
//! runs, by `INFO commandstats`). Each script's static sits
//! beside the Rust that builds its calls (`ACQUIRE_FAIR` in `fair.rs`, `RAISE` in `fence.rs`,
//! `INSPECT` and `FORCE_RELEASE` in `inspect.rs`, `CHECK` in `diagnose.rs`, `TYPES` in
//! `refusal.rs`); [`all`] lists them, and a unit test pins each one's SHA1 so that an accidental
//! change shows. The flags the Rust side sends are types ([`Waiting`], [`Queued`],
//! [`Announce`]); each script names the values it tells apart once, as local constants.
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

/// A script's text, composed at compile time: `first_line` (`#!lua` and its flags), then the
/// named files of this folder in order, the shared functions before the script that calls
/// them. Without a first line, a script is run without flags, as Redis ran scripts before 7.0.
macro_rules! lua {
    ($first_line:literal; $($file:literal),+ $(,)?) => {
        concat!($first_line, "\n", $crate::scripts::lua!($($file),+))
    };
    ($($file:literal),+ $(,)?) => {
        concat!($(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/scripts/", $file))),+)
    };
}
pub(crate) use lua;

/// [`lua!`] for a script that needs the shared `files` in one branch only: they are put in
/// place of the marker `at` (a Lua comment, such as `--[[ draw pop_live hand serve ]]`), which
/// must occur exactly once in the script, instead of before the script. A run of the script
/// that does not reach that branch creates none of their closures.
macro_rules! lua_spliced {
    ($first_line:literal; $script:literal at $marker:literal; $($file:literal),+ $(,)?) => {{
        const SCRIPT: &str = $crate::scripts::lua!($first_line; $script);
        const SHARED: &str = $crate::scripts::lua!($($file),+);
        const MARKER: &str = $marker;
        const BYTES: [u8; SCRIPT.len() - MARKER.len() + SHARED.len()] =
            $crate::scripts::splice(SCRIPT, MARKER, SHARED);
        const TEXT: &str = match ::core::str::from_utf8(&BYTES) {
            Ok(text) => text,
            Err(_) => panic!("a spliced script is not UTF-8"),
        };
        TEXT
    }};
}
pub(crate) use lua_spliced;

/// `script` with `shared` in place of `marker`, which occurs exactly once in it (else the
/// build fails); `N` is the result's length. For [`lua_spliced!`], at compile time.
pub(crate) const fn splice<const N: usize>(script: &str, marker: &str, shared: &str) -> [u8; N] {
    let (script, marker, shared) = (script.as_bytes(), marker.as_bytes(), shared.as_bytes());
    assert!(N + marker.len() == script.len() + shared.len());
    let at = find_once(script, marker);
    let mut spliced = [0; N];
    let mut i = 0;
    while i < N {
        spliced[i] = if i < at {
            script[i]
        } else if i < at + shared.len() {
            shared[i - at]
        } else {
            script[i - shared.len() + marker.len()]
        };
        i += 1;
    }
    spliced
}

/// Where `part` starts in `text`, where it occurs exactly once.
const fn find_once(text: &[u8], part: &[u8]) -> usize {
    let mut found = None;
    let mut i = 0;
    while i + part.len() <= text.len() {
        let mut j = 0;
        while j < part.len() && text[i + j] == part[j] {
            j += 1;
        }
        if j == part.len() {
            assert!(
                found.is_none(),
                "the splice marker occurs twice in the script"
            );
            found = Some(i);
        }
        i += 1;
    }
    match found {
        Some(at) => at,
        None => panic!("the splice marker is missing from the script"),
    }
}

/// Takes every lock key at once, or none: `acquire.lua`.
//
// `#!lua` (Redis 7.0): Redis checks memory and key permissions before the script runs, so an
// acquire it refuses has written nothing; an acquire that fails after it wrote is released by
// token (see `acquire.rs`, "in doubt").
pub(crate) static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(lua!("#!lua"; "mark.lua", "draw.lua", "acquire.lua")));

/// Releases the lock keys this owner still holds, handing marked ones to fair waiters:
/// `release.lua`.
//
// `allow-oom`: a release frees memory overall, and must complete under memory pressure rather
// than stop half way through a hand-off.
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua_spliced!(
        "#!lua flags=allow-oom";
        "release.lua" at "--[[ draw pop_live hand serve ]]";
        "draw.lua", "fair_pop_live.lua", "fair_hand.lua", "fair_serve.lua"
    ))
});

/// Extends several leases in one call, each only if its owner still holds every one of its
/// keys: `extend.lua`.
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| Lua::new(lua!("extend.lua")));

/// Every script distlock sends, by the name of its file (without `.lua`).
pub(crate) fn all() -> [(&'static str, &'static Lua); 9] {
    [
        ("acquire", &ACQUIRE),
        ("release", &RELEASE),
        ("extend", &EXTEND),
        ("fair_acquire", &crate::fair::ACQUIRE_FAIR),
        ("raise", &crate::fence::RAISE),
        ("inspect", &crate::inspect::INSPECT),
        ("force_release", &crate::inspect::FORCE_RELEASE),
        ("check", &crate::diagnose::CHECK),
        ("key_types", &crate::refusal::TYPES),
    ]
}

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

    /// The SHA1 of every composed script, as `EVALSHA` names it: a change to a script's text
    /// shows here, and is made on purpose.
    const PINNED: [(&str, &str); 9] = [
        ("acquire", "26122cd3198bac0aa9e56ccad111b823bda9e749"),
        ("release", "4474f2149be05fee10fbef1b1f0e11bf247c6ce7"),
        ("extend", "4842bb4b1e7ff5d8764a5c04d5a5eabda64d1143"),
        ("fair_acquire", "f2216ec857dbfadf51a450ef00e51c623ba245f3"),
        ("raise", "ae177c3820fd89219691cdc41181d774fa6ba1f1"),
        ("inspect", "c479cc1e79557892583874f7046c332b181e18ab"),
        ("force_release", "e514598b34134b6c4d92a0f1228c0c752e92cf06"),
        ("check", "7a1905a9b3b1fad732ec7c809c11de91bdd30380"),
        ("key_types", "00d627e5d25e9f0a0926f15eacbf237f1e0a175d"),
    ];

    #[test]
    fn every_composed_script_has_its_pinned_sha1() {
        let scripts = all();
        let changed: Vec<String> = scripts
            .iter()
            .filter(|(name, lua)| !PINNED.contains(&(*name, lua.hash())))
            .map(|(name, lua)| format!("(\"{name}\", \"{}\"),", lua.hash()))
            .collect();
        assert!(
            changed.is_empty(),
            "the composed text of these scripts changed (a `.lua` file they are made of, or \
             their composition). If that was on purpose, run `cargo test -p distlock-tests \
             --test scripts`, then set their pins in `PINNED` (distlock-runtime/src/scripts/\
             mod.rs) to:\n{}",
            changed.join("\n")
        );
        for (name, _) in PINNED {
            assert!(
                scripts.iter().any(|(script, _)| *script == name),
                "`PINNED` names `{name}`, which `all()` does not list"
            );
        }
    }

    #[test]
    fn the_first_line_stays_first_and_no_splice_marker_is_left() {
        for (name, lua) in all() {
            let code = lua.code();
            assert!(
                !code.contains("#!") || code.starts_with("#!lua"),
                "{name}: a `#!` line that is not the first"
            );
            assert!(
                !code.contains("--[[ draw"),
                "{name}: a splice marker left in"
            );
        }
    }

    #[test]
    fn a_splice_puts_the_shared_text_in_place_of_the_marker() {
        const SPLICED: [u8; 9] = splice("a\n--[[ x ]]\nb\n", "--[[ x ]]", "f()\n");
        assert_eq!(&SPLICED, b"a\nf()\n\nb\n");
    }

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
        // And each script names the values it tells apart once.
        assert!(ACQUIRE.code().contains("local WAITED, NEVER = '1', '-'"));
        assert!(crate::fair::ACQUIRE_FAIR
            .code()
            .contains("local WAITED = '1'"));
        assert!(RELEASE.code().contains("local QUEUED, ALWAYS = '1', '1'"));
    }
}
