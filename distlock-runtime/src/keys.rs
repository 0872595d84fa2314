//! The Redis keys of one lock: where a lock on a user's key lives.
//!
//! For the key `order:42` under the prefix `distlock:`:
//!
//! | Redis key | what it holds | lives |
//! |---|---|---|
//! | `distlock:lock:{order:42}` | the owner's token, `~`-prefixed once someone waits for it; `holders` while it is held shared or as permits (also the release notification channel) | the lease's ttl; with holders, until the last one's expiry |
//! | `distlock:fence:{order:42}` | the last fencing token drawn for it | the ttl after the last draw or renewal |
//! | `distlock:queue:{order:42}` | fair waiters' tokens, in arrival order | until the last waiter's wait ends, or its presence passes unkept (`fair/`) |
//! | `distlock:waiters:{order:42}` | each fair waiter's deadline, claim time, secret and mode | likewise |
//! | `distlock:holders:{order:42}` | the leases that hold it shared or as permits, each scored by its expiry | until the last one's expiry |
//!
//! Every key expires: nothing is left behind per lock name.
//!
//! **One slot per lock.** The user's key is wrapped in braces, a Redis Cluster hash tag, so every
//! key and the channel of one lock hash to the same cluster slot, and the scripts that touch them
//! together run on one node. Redis hashes the text between the first `{` and the first `}` after
//! it, so a key that itself starts with a braced part chooses its slot: `{user:7}:wallet` and
//! `{user:7}:cart` (the attribute's `"{{user:{id}}}:wallet"`) are stored as
//! `distlock:lock:{{user:7}:wallet}`, whose tag is `{user:7`, shared by both, so the two locks can
//! be taken in one atomic script. Interpolated values are escaped by the attribute, so a caller's
//! input never chooses a slot. A prefix should contain no `{`: the first one would make the tag.

use std::borrow::Cow;

use crate::mode::LockMode;

/// The Redis keys of the lock on one user key, in one buffer (one allocation for the five), and
/// the mode a request holds it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The five names back to back: lock, fence, queue, waiters, holders.
    names: String,
    /// Where each name ends in `names`.
    ends: [usize; 5],
    mode: LockMode,
    /// Where a permit sits among the key's holders (ignored in the other modes).
    seat: Seat,
}

/// Where a permit lease sits among a semaphore's holders (`scripts/holders.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seat {
    /// Counted: a server that sees every holder admits one while fewer than N hold the key.
    Counted,
    /// In whichever of the N slots its owner token holds, each slot an exclusive lock of its own:
    /// a quorum's permit, as its renewal and release name it (docs/modes.md, "Semaphores on a
    /// quorum").
    AnySlot,
    /// In slot `i` (of N): what one acquire round of a quorum's permit asks for.
    Slot(u32),
}

/// The kinds of key, in their order in [`LockKeys`], each with the Redis type distlock keeps
/// in it.
const KINDS: [(&str, &str); 5] = [
    ("lock:", "string"),
    ("fence:", "string"),
    ("queue:", "list"),
    ("waiters:", "hash"),
    ("holders:", "zset"),
];

impl LockKeys {
    /// The keys of the lock on `key` under `prefix`, held exclusively.
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let length: usize = KINDS.iter().map(|(kind, _)| kind.len()).sum();
        let mut names = String::with_capacity(5 * (prefix.len() + key.len() + 2) + length);
        let mut ends = [0; 5];
        for (end, (kind, _)) in ends.iter_mut().zip(KINDS) {
            names.push_str(prefix);
            names.push_str(kind);
            names.push('{');
            names.push_str(key);
            names.push('}');
            *end = names.len();
        }
        Self {
            names,
            ends,
            mode: LockMode::Exclusive,
            seat: Seat::Counted,
        }
    }

    /// The same keys, held in `mode`.
    pub(crate) fn held(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// The same keys, a permit held in a slot: whichever its token holds, or `Slot(i)`.
    pub(crate) fn seated(mut self, seat: Seat) -> Self {
        self.seat = seat;
        self
    }

    /// The mode a request holds the key in.
    pub(crate) fn mode(&self) -> LockMode {
        self.mode
    }

    /// Where a permit sits.
    pub(crate) fn seat(&self) -> Seat {
        self.seat
    }

    /// The word the scripts read for the mode (`scripts/holders.lua`): the mode's
    /// ([`LockMode::word`]), or for a permit in a slot `N/i`, or `N/*` for whichever slot.
    pub(crate) fn word(&self) -> Cow<'static, str> {
        match (self.mode, self.seat) {
            (LockMode::Permits(n), Seat::Slot(i)) => Cow::Owned(format!("{n}/{i}")),
            (LockMode::Permits(n), Seat::AnySlot) => Cow::Owned(format!("{n}/*")),
            (mode, _) => mode.word(),
        }
    }

    /// The key a renewal extends: the lock key when held exclusively, the holders otherwise.
    pub(crate) fn lease_key(&self) -> &str {
        match self.mode {
            LockMode::Exclusive => self.lock(),
            LockMode::Shared | LockMode::Permits(_) => self.holders(),
        }
    }

    fn name(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.names[start..self.ends[i]]
    }

    /// The lock itself: its value is the owner's token (marked `~` once waited on), its PTTL
    /// the lease's expiry.
    pub(crate) fn lock(&self) -> &str {
        self.name(0)
    }

    /// The lock's fencing counter.
    pub(crate) fn fence(&self) -> &str {
        self.name(1)
    }

    /// The fair queue: waiting owner tokens in arrival order.
    pub(crate) fn queue(&self) -> &str {
        self.name(2)
    }

    /// The fair queue's entries: token -> "deadline_ms claim_ms secret mode".
    pub(crate) fn waiters(&self) -> &str {
        self.name(3)
    }

    /// The leases holding the key shared or as permits: a sorted set of members (a token,
    /// `N token`, or `N/i token` in a quorum's slot i) scored by expiry.
    pub(crate) fn holders(&self) -> &str {
        self.name(4)
    }

    /// Which of a lock's keys the Redis key `name` is, by the kind before its braced part
    /// (a prefix holds no `{`): the kind's word (`fence:`) and the Redis type distlock keeps
    /// there (`string`); `None` for a name of no lock.
    pub(crate) fn kind_of(name: &str) -> Option<(&'static str, &'static str)> {
        let head = &name[..name.find('{')?];
        KINDS.into_iter().find(|(kind, _)| head.ends_with(kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_lock_sits_under_the_prefix_beside_the_others() {
        let keys = LockKeys::new("app:", "order:42");
        assert_eq!(keys.lock(), "app:lock:{order:42}");
        assert_eq!(keys.fence(), "app:fence:{order:42}");
        assert_eq!(keys.queue(), "app:queue:{order:42}");
        assert_eq!(keys.waiters(), "app:waiters:{order:42}");
        assert_eq!(keys.holders(), "app:holders:{order:42}");
        assert_eq!(
            LockKeys::kind_of(keys.holders()),
            Some(("holders:", "zset"))
        );
        assert_eq!(LockKeys::kind_of(keys.queue()), Some(("queue:", "list")));
        assert_eq!(LockKeys::kind_of(keys.fence()), Some(("fence:", "string")));
        // The user's key may hold the kinds' words; the prefix decides.
        let tricky = LockKeys::new("app:", "lock:{queue:}");
        assert_eq!(
            LockKeys::kind_of(tricky.waiters()),
            Some(("waiters:", "hash"))
        );
        assert_eq!(LockKeys::kind_of("unrelated"), None);
    }

    #[test]
    fn a_permit_in_a_slot_is_named_by_its_slot_or_any_slot() {
        let keys = LockKeys::new("app:", "pool").held(LockMode::Permits(3));
        assert_eq!(keys.word(), "3");
        assert_eq!(keys.clone().seated(Seat::AnySlot).word(), "3/*");
        assert_eq!(keys.clone().seated(Seat::Slot(2)).word(), "3/2");
        // The other modes have no slots.
        let shared = LockKeys::new("app:", "doc").held(LockMode::Shared);
        assert_eq!(shared.seated(Seat::AnySlot).word(), "r");
    }
}
