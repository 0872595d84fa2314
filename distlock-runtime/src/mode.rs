//! The modes a lease holds a key in ([`LockMode`]), and how the scripts are told them.

use std::borrow::Cow;
use std::fmt;

use redis::{RedisWrite, ToRedisArgs};

/// How a lease holds a key: alone, shared with other readers, or as one of a semaphore's
/// permits.
///
/// A request may mix exclusive and shared keys
/// ([`LockRequest::read_keys`](crate::LockRequest::read_keys)); a semaphore is one key
/// ([`LockRequest::permits`](crate::LockRequest::permits)). Whatever its mode, a lease is renewed,
/// released and fenced on its own.
///
/// | a lease in this mode | is granted when the key is held by |
/// |---|---|
/// | `Exclusive` | nobody |
/// | `Shared` | nobody exclusively, and no fair waiter is queued for the key |
/// | `Permits(n)` | nobody exclusively, fewer than `n` shared or permit leases (on a quorum: by nobody in one of `n` slots), and no fair waiter is queued |
///
/// A key is meant to be used in one way: exclusive and shared (a read-write lock), or permits
/// (a semaphore; see [`LockRequest::permits`](crate::LockRequest::permits) for callers that
/// disagree on `n`). `docs/modes.md` in the repository says how the modes are served in order,
/// and what unfair requests do.
///
/// Not `#[non_exhaustive]`: a `match` on the three modes needs no wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// One holder, and nobody else (a mutex, or a read-write lock's writer).
    Exclusive,
    /// Any number of holders, none exclusive (a read-write lock's readers).
    Shared,
    /// One of at most `n` holders (a semaphore of `n` permits).
    Permits(u32),
}

impl LockMode {
    /// Whether a body holding a key in this mode may run a nested call for the key in `asked`
    /// (see `reentrancy.rs`): an exclusive hold covers every mode, a shared or permit hold only
    /// its own (a permit whatever its `n`: the nested call holds the same permit).
    pub(crate) fn covers(self, asked: Self) -> bool {
        matches!(
            (self, asked),
            (Self::Exclusive, _)
                | (Self::Shared, Self::Shared)
                | (Self::Permits(_), Self::Permits(_))
        )
    }

    /// Its name in metrics and logs: `exclusive`, `shared`, `permits`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
            Self::Permits(_) => "permits",
        }
    }

    /// The word the scripts read for it: `x` exclusive, `r` shared, the digits of `n` for one
    /// of `n` permits.
    pub(crate) fn word(self) -> Cow<'static, str> {
        match self {
            Self::Exclusive => Cow::Borrowed("x"),
            Self::Shared => Cow::Borrowed("r"),
            Self::Permits(n) => Cow::Owned(n.to_string()),
        }
    }

    /// The mode a script's word names (see [`word`](Self::word), and a permit's slot `N/i`,
    /// `scripts/holders.lua`), if any.
    pub(crate) fn from_word(word: &str) -> Option<Self> {
        match word {
            "x" => Some(Self::Exclusive),
            "r" => Some(Self::Shared),
            word => {
                let digits = word.split_once('/').map_or(word, |(n, _)| n);
                digits.parse().ok().filter(|&n| n > 0).map(Self::Permits)
            }
        }
    }
}

impl fmt::Display for LockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Permits(n) => write!(f, "{n} permits"),
            mode => f.write_str(mode.name()),
        }
    }
}

/// A request's keys (sorted, de-duplicated) and the mode each is held in, side by side.
pub(crate) type KeyModes = (std::sync::Arc<[String]>, std::sync::Arc<[LockMode]>);

/// The modes of a script's keys, one word each, space-separated (`scripts/holders.lua`): `x`
/// exclusive, `r` shared, the digits of `n` for one of `n` permits (`n/i` in a slot: see
/// `LockKeys::word`).
pub(crate) struct Words<I>(pub(crate) I);

impl<I: Iterator<Item = Cow<'static, str>> + Clone> ToRedisArgs for Words<I> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut words = self.0.clone();
        match (words.next(), words.next()) {
            // The common case, without joining.
            (Some(word), None) => out.write_arg(word.as_bytes()),
            _ => {
                let words: Vec<_> = self.0.clone().collect();
                out.write_arg(words.join(" ").as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(modes: &[LockMode]) -> Vec<u8> {
        Words(modes.iter().map(|m| m.word()))
            .to_redis_args()
            .concat()
    }

    #[test]
    fn modes_are_sent_as_the_words_the_scripts_read() {
        assert_eq!(sent(&[LockMode::Exclusive]), b"x");
        assert_eq!(sent(&[LockMode::Shared]), b"r");
        assert_eq!(sent(&[LockMode::Permits(8)]), b"8");
        assert_eq!(
            sent(&[LockMode::Exclusive, LockMode::Shared, LockMode::Permits(12)]),
            b"x r 12"
        );
        for mode in [LockMode::Exclusive, LockMode::Shared, LockMode::Permits(3)] {
            let word = String::from_utf8(sent(&[mode])).unwrap();
            assert_eq!(LockMode::from_word(&word), Some(mode));
        }
        assert_eq!(LockMode::from_word("0"), None);
        // A permit in a quorum's slot reads as its semaphore's mode.
        assert_eq!(LockMode::from_word("3/2"), Some(LockMode::Permits(3)));
        assert_eq!(LockMode::from_word("0/1"), None);
    }

    #[test]
    fn an_exclusive_hold_covers_every_mode_and_others_only_their_own() {
        use LockMode::*;
        assert!(Exclusive.covers(Shared) && Exclusive.covers(Permits(2)));
        assert!(Shared.covers(Shared) && !Shared.covers(Exclusive));
        assert!(Permits(2).covers(Permits(5)) && !Permits(2).covers(Exclusive));
        assert!(!Shared.covers(Permits(2)) && !Permits(2).covers(Shared));
    }
}
