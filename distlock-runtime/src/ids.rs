//! Identifiers: owner tokens and fair secrets from the OS random source, and process-unique
//! numbers.

use std::sync::Arc;

/// A process-wide unique number (connection generations, manager identities).
pub(crate) fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Two random 128-bit ids from the OS random source, in one call: a request's owner token and
/// its first fair secret. Not from a seeded per-thread generator: a fork, a restored VM snapshot
/// or a call that reseeds such a generator would repeat its tokens, and an acquire that finds
/// its own token counts as success.
pub(crate) fn random_ids() -> [[u8; 16]; 2] {
    let mut ids = [[0; 16]; 2];
    // As `uuid::Uuid::new_v4` does: without an OS random source no token is safe to use.
    getrandom::fill(ids.as_flattened_mut()).expect("distlock: the OS random source failed");
    ids
}

/// An id as a uuid v4 in 32 hex digits.
pub(crate) fn id_text(random: [u8; 16]) -> Arc<str> {
    let mut digits = [0; uuid::fmt::Simple::LENGTH];
    let id = uuid::Builder::from_random_bytes(random).into_uuid();
    Arc::from(&*id.simple().encode_lower(&mut digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_uuid_v4_hex_and_distinct() {
        let [a, b] = random_ids().map(id_text);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a.as_bytes()[12], b'4', "version 4: {a}");
        assert_ne!(a, b);
    }
}
