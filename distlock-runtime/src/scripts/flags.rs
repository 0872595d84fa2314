//! The flags the Rust side sends the scripts, as types that turn into their Redis arguments.

use redis::{RedisWrite, ToRedisArgs};

/// Whether a request waits, and whether it has waited: `ACQUIRE`'s `ARGV[3]`, `ACQUIRE_FAIR`'s
/// `ARGV[7]`. It says whether an attempt marks a held key as waited on (see the module docs), and
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
/// attempt's outcome is unknown), which then leaves the keys' queues too: `RELEASE`'s `ARGV[2]`.
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

/// Which releases announce themselves on the key's channel: `RELEASE`'s `ARGV[4]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// Only that of a key marked as waited on (see the module docs). Sent as `0`.
    WaitedOn,
    /// Every release, as though every key were marked (a quorum's: see `Deployment::announce`).
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
