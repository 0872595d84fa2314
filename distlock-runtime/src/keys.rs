//! The Redis keys of one lock: where a lock on a user's key lives.
//!
//! For the key `order:42` under the prefix `distlock:`:
//!
//! | Redis key | what it holds | lives |
//! |---|---|---|
//! | `distlock:lock:{order:42}` | the owner's token (also the release notification channel) | the lease's ttl |
//! | `distlock:fence:{order:42}` | the last fencing token drawn for it | the ttl after the last draw |
//! | `distlock:queue:{order:42}` | fair waiters' tokens, in arrival order | until the last waiter's wait ends |
//! | `distlock:waiters:{order:42}` | each fair waiter's deadline, claim time and secret | likewise |
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

/// The Redis keys of the lock on one user key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    /// The lock itself: its value is the owner's token, its PTTL the lease's expiry.
    pub(crate) lock: String,
    /// The lock's fencing counter.
    pub(crate) fence: String,
    /// The fair queue: waiting owner tokens in arrival order.
    pub(crate) queue: String,
    /// The fair queue's entries: token -> "deadline_ms claim_ms secret".
    pub(crate) waiters: String,
}

impl LockKeys {
    /// The keys of the lock on `key` under `prefix`.
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let named = |kind: &str| {
            let mut name = String::with_capacity(prefix.len() + kind.len() + key.len() + 2);
            name.push_str(prefix);
            name.push_str(kind);
            name.push('{');
            name.push_str(key);
            name.push('}');
            name
        };
        Self {
            lock: named("lock:"),
            fence: named("fence:"),
            queue: named("queue:"),
            waiters: named("waiters:"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_lock_sits_under_the_prefix_beside_the_others() {
        let keys = LockKeys::new("app:", "order:42");
        assert_eq!(keys.lock, "app:lock:{order:42}");
        assert_eq!(keys.fence, "app:fence:{order:42}");
        assert_eq!(keys.queue, "app:queue:{order:42}");
        assert_eq!(keys.waiters, "app:waiters:{order:42}");
    }
}
