//! The requester's side of a fair acquire: a new secret for every attempt that will wait,
//! Redis's clock at every attempt, and whether a hand-off it is given can be trusted, and from
//! when its lease counts.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::message::Handoff;
use super::queue::{FairAnswer, FairRequest};
use super::waiter::Sibling;
use crate::failed::Failed;
use crate::ids::id_text;
use crate::keys::LockKeys;
use crate::release::Leaving;
use crate::scripts::{Acquire, Waiting};
use crate::topology::Serial;
use crate::validity::validity;

/// How long the queue keeps a fair waiter's entry after it was last kept: twice the ttl, and at
/// least [`PRESENCE_FLOOR`]. The first fair waiter of a key in each process keeps its own entry
/// (by its attempts) and the others' (by [`FairAttempts::keep_queued`]) at least every third of
/// the shortest presence among them, so a live waiter stays queued however long it waits (an
/// election's candidate waits for ever), and a crashed one is dropped from the queue within its
/// presence instead of at the end of its wait.
pub(crate) fn presence(ttl: Duration) -> Duration {
    (ttl * 2).max(PRESENCE_FLOOR)
}

/// The least [`presence`]: a waiter asking for a short ttl behind a long-lived holder does not
/// keep its place more often than every 3 s or so.
const PRESENCE_FLOOR: Duration = Duration::from_secs(10);

/// How long the Redis time of a waiter's latest attempt dates a hand-off: a waiter that has
/// not attempted for longer (one kept queued by another waiter of its process) confirms a
/// hand-off by an attempt instead.
const CALIBRATION_FOR: Duration = Duration::from_secs(30);

/// The attempts of one fair request on one key.
pub(crate) struct FairAttempts {
    call: FairRequest,
    /// The first attempt's secret, drawn with the owner token.
    first_secret: Option<[u8; 16]>,
    /// The secret of the latest attempt: only a hand-off made after it carries its signature.
    secret: Option<Arc<str>>,
    /// When the latest queueing attempt was sent, and Redis's clock when it ran: dates a
    /// hand-off.
    calibration: Option<(Instant, u64)>,
    /// How long the queue keeps this waiter's entry after each attempt ([`presence`]).
    presence: Duration,
    /// When this waiter last kept the other fair waiters of its process queued.
    refreshed: Option<Instant>,
}

impl FairAttempts {
    /// The attempts on `keys` for a lease of `ttl`; the first stores `first_secret`.
    pub(crate) fn new(keys: &LockKeys, ttl: Duration, first_secret: [u8; 16]) -> Self {
        Self {
            call: FairRequest::new(keys, ttl),
            first_secret: Some(first_secret),
            secret: None,
            calibration: None,
            presence: presence(ttl),
            refreshed: None,
        }
    }

    /// Whether keeping the others queued may be due at `now`: not while a quarter of the least
    /// presence has not passed since it last was (a cheap look before they are gathered).
    pub(crate) fn may_keep_queued(&self, now: Instant) -> bool {
        self.since_refreshed(now) >= PRESENCE_FLOOR / 4
    }

    /// How long before `now` this waiter last kept the others queued (for ever if never).
    fn since_refreshed(&self, now: Instant) -> Duration {
        self.refreshed
            .map_or(Duration::MAX, |at| now.saturating_duration_since(at))
    }

    /// Keeps `siblings` (the other fair waiters of the key in this process) queued, when a
    /// quarter of the shortest presence among them and this waiter has passed since it last
    /// did: each entry then lasts its own presence (or the sibling's wait left, if shorter). The
    /// tokens of siblings no longer queued (handed the lock, or dropped), to be woken; none
    /// when Redis failed (the next wake tries again: this waiter wakes at the latest a third of
    /// that presence after its last attempt, so one failure never lets an entry lapse).
    pub(crate) async fn keep_queued(
        &mut self,
        redis: &Serial,
        siblings: &[Sibling],
        now: Instant,
    ) -> Vec<String> {
        let least = siblings
            .iter()
            .map(|s| s.presence)
            .fold(self.presence, Duration::min);
        if siblings.is_empty() || self.since_refreshed(now) < least / 4 {
            return Vec::new();
        }
        let keep = siblings
            .iter()
            .map(|s| {
                let left = s.deadline.saturating_duration_since(now).min(s.presence);
                (&*s.token, left)
            })
            .filter(|(_, left)| !left.is_zero());
        match self.call.refresh(redis, keep).await {
            Ok(gone) => {
                self.refreshed = Some(now);
                gone
            }
            Err(failed) => {
                tracing::debug!(error = %failed.error, "distlock could not keep its fair waiters queued; trying again at its next wake");
                Vec::new()
            }
        }
    }

    /// The secret the attempt about to be sent at `sent` stores in the queue: a new one while
    /// the request still waits, so that only a hand-off made after this attempt ran (by the
    /// release script, which alone can read it) is signed with it. The last attempt, at the
    /// deadline, stores nothing new: it keeps the secret before.
    pub(crate) fn next_secret(&mut self, sent: Instant, deadline: Instant) -> Arc<str> {
        match &self.secret {
            Some(secret) if sent >= deadline => Arc::clone(secret),
            _ => {
                let id = self
                    .first_secret
                    .take()
                    .unwrap_or_else(|| crate::ids::random_ids()[0]);
                let secret = id_text(id);
                self.secret = Some(Arc::clone(&secret));
                secret
            }
        }
    }

    /// One attempt by `token`, sent at `sent`, which waits until `deadline` and stores the
    /// secret [`next_secret`](Self::next_secret) gave: the key's first holder when it is
    /// queued behind one (`first_held` 0).
    pub(crate) async fn send(
        &mut self,
        redis: &Serial,
        token: &str,
        sent: Instant,
        deadline: Instant,
        waiting: Waiting,
    ) -> Result<Acquire, Failed> {
        let secret = self.secret.as_deref().unwrap_or_default();
        // The entry lasts until the wait ends, or until the presence has passed without another
        // attempt (a crashed waiter leaves the queue by itself).
        let wait_left = deadline.saturating_duration_since(sent).min(self.presence);
        let answer = self
            .call
            .send(redis, token, secret, wait_left, waiting)
            .await?;
        Ok(match answer {
            FairAnswer::Acquired { fencing_token } => Acquire::Acquired { fencing_token },
            FairAnswer::Queued {
                remaining,
                server_ms,
            } => {
                self.calibration = Some((sent, server_ms));
                // The waiter tries again by its presence itself (see `wait.rs`).
                Acquire::Held {
                    first_held: 0,
                    remaining,
                    unconfirmed: None,
                }
            }
        })
    }

    /// Whether the attempt sent at `sent`, which found the key held, marked its holder as waited
    /// on: it did when it queued, which it does with any wait left.
    pub(crate) fn marked(sent: Instant, deadline: Instant) -> bool {
        deadline.saturating_duration_since(sent).as_millis() > 0
    }

    /// When the lease `handoff` gives this request counts from, if it can be trusted to still be
    /// valid: dated through the Redis time of this request's latest queueing attempt, with the
    /// claim's validity not yet over. `None` (undated, or learned too late to trust): an attempt
    /// confirms the hand-off instead, or queues again if the claim lapsed.
    pub(crate) fn trust(&self, handoff: &Handoff) -> Option<Instant> {
        // An old calibration would carry the clocks' drift since: not trusted.
        let calibration = self
            .calibration
            .filter(|(sent, _)| sent.elapsed() <= CALIBRATION_FOR);
        handoff_start(calibration, handoff.server_ms).filter(|start| {
            *start + validity(handoff.claim) > Instant::now() + Duration::from_millis(1)
        })
    }

    /// How the release by token runs when this request ends without a lease: with an attempt
    /// still on its way (`in_flight`), which may queue the token again or take the key after a
    /// first release, it is repeated whatever it finds; else one release takes the waiter out
    /// of the queue and passes on a hand-off it was given.
    pub(crate) fn leaving(in_flight: bool) -> Leaving {
        if in_flight {
            Leaving::InFlightFair
        } else {
            Leaving::Queued
        }
    }
}

/// How a lease handed over for a `claim` shorter than its ttl gets to its ttl (point 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimRenewal {
    /// Its renewal extends it, a third of the claim after it began, like any lease: a body
    /// that ends sooner spends no round trip on it.
    ByRenewal,
    /// A lease without renewal is extended to its ttl once, at once.
    Once,
    /// The claim is the ttl already.
    Needless,
}

/// How a lease of `ttl` handed over for `claim` reaches its ttl, `renews` or not.
pub(crate) fn claim_renewal(renews: bool, claim: Duration, ttl: Duration) -> ClaimRenewal {
    match (renews, claim < ttl) {
        (true, _) => ClaimRenewal::ByRenewal,
        (false, true) => ClaimRenewal::Once,
        (false, false) => ClaimRenewal::Needless,
    }
}

/// The earliest moment (on this host's clock) a hand-off at Redis time `server_ms` can have
/// happened, from an attempt sent at `sent` that ran at Redis time `ran_ms`: Redis's clock has
/// advanced `server_ms - ran_ms` since a moment after `sent`. Allows 1% clock-rate drift and
/// 1 ms for the millisecond resolution. `None` without a dated attempt.
fn handoff_start(calibration: Option<(Instant, u64)>, server_ms: u64) -> Option<Instant> {
    let (sent, ran_ms) = calibration?;
    let start = if server_ms >= ran_ms {
        let elapsed = Duration::from_millis(server_ms - ran_ms);
        (sent + elapsed - elapsed / 100).checked_sub(Duration::from_millis(1))?
    } else {
        let before = Duration::from_millis(ran_ms - server_ms);
        sent.checked_sub(before + before / 100 + Duration::from_millis(1))?
    };
    Some(start.min(Instant::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_off_is_dated_no_later_than_redis_made_it() {
        let sent = Instant::now() - Duration::from_secs(5);
        // Redis ran the attempt at 1,000,000 ms and handed over 3,000 ms later on its clock:
        // at least 3 s less 1% drift and 1 ms resolution after the attempt was sent.
        let start = handoff_start(Some((sent, 1_000_000)), 1_003_000).unwrap();
        assert_eq!(start, sent + Duration::from_millis(3_000 - 30 - 1));
        // A hand-off dated before the attempt ran (another attempt's date) reaches back.
        let start = handoff_start(Some((sent, 1_000_000)), 999_000).unwrap();
        assert_eq!(start, sent - Duration::from_millis(1_000 + 10 + 1));
        // Never later than now, whatever Redis's clock says.
        let start = handoff_start(Some((sent, 1_000_000)), 1_000_000 + 60_000).unwrap();
        assert!(start <= Instant::now());
        assert!(handoff_start(None, 1_000_000).is_none());
    }

    #[test]
    fn every_attempt_that_still_waits_stores_a_new_secret_and_the_last_keeps_its_own() {
        let keys = LockKeys::new("distlock:", "k");
        let mut attempts = FairAttempts::new(&keys, Duration::from_secs(5), [7; 16]);
        let now = Instant::now();
        let deadline = now + Duration::from_secs(1);
        let first = attempts.next_secret(now, deadline);
        assert_eq!(first, id_text([7; 16]));
        let second = attempts.next_secret(now, deadline);
        assert_ne!(second, first);
        assert_eq!(attempts.next_secret(deadline, deadline), second);
    }

    #[test]
    fn a_claim_reaches_the_ttl_by_renewal_or_one_extension() {
        let (claim, ttl) = (Duration::from_secs(2), Duration::from_secs(30));
        assert_eq!(claim_renewal(true, claim, ttl), ClaimRenewal::ByRenewal);
        assert_eq!(claim_renewal(false, claim, ttl), ClaimRenewal::Once);
        assert_eq!(claim_renewal(false, claim, claim), ClaimRenewal::Needless);
    }
}
