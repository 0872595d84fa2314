//! The hand-off message a release publishes on the key's channel, and its signature.

use std::time::Duration;

/// A hand-off message: the lock was given to `token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handoff {
    /// The waiter the lock was handed to.
    pub(crate) token: String,
    pub(crate) fencing_token: u64,
    /// Redis server time of the hand-off, in ms.
    pub(crate) server_ms: u64,
    /// How long the lock is held for the waiter before it must be extended.
    pub(crate) claim: Duration,
    /// The fields the signature covers, as published.
    pub(crate) signed: String,
    /// `sha1hex(secret + " " + signed + " " + secret)`, with the secret of the recipient's
    /// attempt: only the release script, which reads the secret in the queue, can make it.
    pub(crate) mac: String,
}

impl Handoff {
    /// Parses a message from the release channel: `None` for a plain release (empty) or
    /// anything not a hand-off.
    pub(crate) fn parse(message: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(message).ok()?.strip_prefix("h ")?;
        let (signed, mac) = text.rsplit_once(' ')?;
        let [token, fencing_token, server_ms, claim] = signed.split(' ').collect::<Vec<_>>()[..]
        else {
            return None;
        };
        Some(Self {
            token: token.to_owned(),
            fencing_token: fencing_token.parse().ok()?,
            server_ms: server_ms.parse().ok()?,
            claim: Duration::from_millis(claim.parse().ok()?),
            signed: signed.to_owned(),
            mac: mac.to_owned(),
        })
    }

    /// Whether `secret` (if there is one) signed this message.
    pub(super) fn signed_with(&self, secret: Option<&str>) -> bool {
        secret.is_some_and(|secret| !secret.is_empty() && mac(secret, &self.signed) == self.mac)
    }
}

/// The signature a hand-off with `signed` fields carries for a waiter whose attempt stored
/// `secret`: the same as the release script's `redis.sha1hex(secret .. ' ' .. signed .. ' ' ..
/// secret)` (the secret on both sides, so the message cannot be extended).
pub(super) fn mac(secret: &str, signed: &str) -> String {
    let mut sha1 = sha1_smol::Sha1::new();
    for part in [secret, " ", signed, " ", secret] {
        sha1.update(part.as_bytes());
    }
    sha1.digest().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_off_messages_parse_and_plain_releases_do_not() {
        let handoff = Handoff::parse(b"h 0af3 17 1795000000123 2000 5e5e").unwrap();
        assert_eq!(
            handoff,
            Handoff {
                token: "0af3".into(),
                fencing_token: 17,
                server_ms: 1_795_000_000_123,
                claim: Duration::from_secs(2),
                signed: "0af3 17 1795000000123 2000".into(),
                mac: "5e5e".into(),
            }
        );
        assert!(Handoff::parse(b"").is_none());
        assert!(Handoff::parse(b"h a x 2 3 5e").is_none());
        // The old form, with a next waiter's field: not a hand-off of this version.
        assert!(Handoff::parse(b"h a 1 2 3  5e").is_none());
        assert!(Handoff::parse(b"h a 1 2 3 b c 5e").is_none());
    }

    #[test]
    fn signatures_match_redis_sha1hex() {
        // redis-cli EVAL "return redis.sha1hex('s1 w1 7 1 2000  s1')" 0
        assert_eq!(
            mac("s1", "w1 7 1 2000 "),
            "5e1b258a7c4e17ba261433113442e4cb1d3dbc04"
        );
    }
}
