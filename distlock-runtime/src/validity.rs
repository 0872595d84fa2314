//! How long a lease is trusted, and whether it was lost: [`LeaseState`], shared by a lease, its
//! acquire and its renewal.
//!
//! A lease's validity is counted from before the request that set its expiry was sent, less a
//! margin for the drift between this host's clock and Redis's, so this process gives a lease up
//! before Redis expires it. What the monotonic clock cannot see (a host suspended, some VM
//! pauses) it cannot give up in time: fencing tokens are what make such a holder harmless.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::LockError;
use crate::sync::lock;

/// The shortest lease accepted: below this the clock-drift margin eats the whole lease.
///
/// ```
/// use std::time::Duration;
/// use distlock_runtime::{LockError, LockManager, MIN_TTL};
///
/// let too_short = LockManager::builder()
///     .url("redis://127.0.0.1:6379")
///     .default_ttl(MIN_TTL - Duration::from_millis(1))
///     .build();
/// assert!(matches!(too_short, Err(LockError::InvalidConfig { what: "ttl", .. })));
/// ```
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest lease accepted (one year); longer is surely a mistake, and would overflow clocks.
///
/// ```
/// use std::time::Duration;
/// use distlock_runtime::{MAX_TTL, MIN_TTL};
///
/// // A ttl read from configuration, kept in the accepted range.
/// let configured = Duration::from_secs(10 * 365 * 24 * 60 * 60);
/// assert_eq!(configured.clamp(MIN_TTL, MAX_TTL), MAX_TTL);
/// ```
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// What a lease and its renewal share: until when it is valid, its ttl, and whether (and why)
/// it was lost.
pub(crate) struct LeaseState {
    /// Cancelled once the lease is lost: what waits for the loss.
    lost: CancellationToken,
    /// Whether the lease was asked to be renewed.
    renews: bool,
    inner: Mutex<Inner>,
}

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// Its validity ran out before a renewal got through (or, without renewal, its ttl
    /// passed).
    Expired,
    /// Redis said the lock is gone or someone else's.
    Taken,
    /// A forced release told this manager that it freed the lease.
    Forced,
}

struct Inner {
    validity: Validity,
    /// Set once, for good: a lost lease never comes back.
    loss: Option<Loss>,
}

#[derive(Clone, Copy)]
struct Validity {
    until: Instant,
    ttl: Duration,
    /// When the request that set this expiry was sent: an answer to an older request (a
    /// renewal overtaken by a manual `extend`, say) must not overwrite it.
    sent: Instant,
}

impl Validity {
    /// Set by a request sent at `sent` that gave the keys `expiry`, renewed to `ttl`.
    fn new(sent: Instant, expiry: Duration, ttl: Duration) -> Self {
        let until = sent + validity(expiry);
        Self { until, ttl, sent }
    }
}

impl LeaseState {
    /// A lease being requested with `ttl`; valid from when [`LeaseState::acquired`] is called.
    pub(crate) fn new(ttl: Duration, renews: bool) -> Self {
        Self {
            lost: CancellationToken::new(),
            renews,
            inner: Mutex::new(Inner {
                validity: Validity::new(Instant::now(), Duration::ZERO, ttl),
                loss: None,
            }),
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        lock(&self.inner).validity.ttl
    }

    pub(crate) fn valid_until(&self) -> Instant {
        lock(&self.inner).validity.until
    }

    /// The acquire request sent at `sent` took the keys with `ttl`.
    pub(crate) fn acquired(&self, sent: Instant, ttl: Duration) {
        lock(&self.inner).validity = Validity::new(sent, ttl, ttl);
    }

    /// A release handed the key over with `claim` as its expiry, at a moment known to be no
    /// earlier than `start` on this host's clock; renewals (the first one due at once when
    /// `claim` is shorter) extend it to `ttl`.
    pub(crate) fn handed(&self, start: Instant, claim: Duration, ttl: Duration) {
        lock(&self.inner).validity = Validity::new(start, claim, ttl);
    }

    /// Redis set the keys' expiry to `ttl` by a request sent at `sent`. Returns whether this
    /// answer now defines the lease (false for an answer older than the current one). A lease
    /// once lost, or whose validity ran out before this answer, stays lost: there was a moment
    /// when this owner could not know it held the lock.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
        let mut inner = lock(&self.inner);
        if self.expired(&mut inner) || sent < inner.validity.sent {
            return false;
        }
        inner.validity = Validity::new(sent, ttl, ttl);
        true
    }

    /// Whether `inner` says the lease is lost, marking it so when its validity ran out.
    fn expired(&self, inner: &mut Inner) -> bool {
        if inner.loss.is_none() && inner.validity.until <= Instant::now() {
            inner.loss = Some(Loss::Expired);
            self.lost.cancel();
        }
        inner.loss.is_some()
    }

    /// Why the lease was lost, if it was marked lost (without checking the clock).
    pub(crate) fn loss(&self) -> Option<Loss> {
        lock(&self.inner).loss
    }

    /// Marks the lease lost (a first cause stays).
    pub(crate) fn lose(&self, loss: Loss) {
        lock(&self.inner).loss.get_or_insert(loss);
        self.lost.cancel();
    }

    /// Why the lease was lost, for a log line.
    pub(crate) fn cause(&self) -> &'static str {
        match self.loss() {
            Some(Loss::Taken) => "the lock was deleted or taken by another owner",
            Some(Loss::Forced) => "the lock was force-released (LockManager::force_release)",
            _ if self.renews => {
                "it expired before a renewal got through (Redis unreachable, hung or slow)"
            }
            _ => "it reached its ttl without renewal (renew = false)",
        }
    }

    /// Whether the lease is lost; running out of validity loses it for good.
    pub(crate) fn is_lost(&self) -> bool {
        // Under the lock, so a renewal cannot revive it in between.
        self.expired(&mut lock(&self.inner))
    }

    pub(crate) async fn lost(&self) {
        // Woken at the validity's end, checked again: a renewal may have moved it meanwhile.
        while !self.is_lost() {
            let until = self.valid_until();
            tokio::select! {
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

/// How long a lease of `ttl` is trusted, counted from when its request was sent: the ttl less a
/// margin for the drift between this host's clock and Redis's (1% + 2 ms, as in Redlock).
pub(crate) fn validity(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 100 + Duration::from_millis(2))
}

/// Refuses a ttl outside [`MIN_TTL`]..=[`MAX_TTL`].
pub(crate) fn check_ttl(ttl: Duration) -> Result<(), LockError> {
    let reason = if ttl > MAX_TTL {
        format!(
            "{ttl:?} is too long: a lease lasts at most {MAX_TTL:?}; use renewal for long \
             critical sections"
        )
    } else if ttl < MIN_TTL {
        format!(
            "{ttl:?} is too short: a lease must last at least {MIN_TTL:?} (give the longest \
             time the critical section may take, or a few seconds with renewal)"
        )
    } else {
        return Ok(());
    };
    Err(LockError::InvalidConfig {
        what: "ttl",
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_answer_never_overwrites_a_newer_one() {
        let state = LeaseState::new(Duration::from_secs(30), true);
        let start = Instant::now();
        state.acquired(start, Duration::from_secs(30));
        let early = start + Duration::from_millis(1);
        let late = start + Duration::from_millis(2);
        // A manual extend to 600 ms (sent late) is answered before a 30 s renewal sent earlier.
        assert!(state.renewed(late, Duration::from_millis(600)));
        assert!(!state.renewed(early, Duration::from_secs(30)));
        assert_eq!(state.ttl(), Duration::from_millis(600));
        // 600 ms less 1% (6 ms) and 2 ms, from when the extend was sent.
        assert_eq!(state.valid_until(), late + Duration::from_millis(592));
    }

    #[test]
    fn an_answer_sent_at_the_same_instant_as_the_current_one_defines_the_lease() {
        // Under tokio's paused clock (a `start_paused` test) an acquire and the extend right
        // after it are sent at one instant: the extend is not older, and its ttl counts.
        let state = LeaseState::new(Duration::from_secs(30), true);
        let sent = Instant::now();
        state.acquired(sent, Duration::from_secs(30));
        assert!(state.renewed(sent, Duration::from_secs(60)));
        assert_eq!(state.ttl(), Duration::from_secs(60));
        assert_eq!(state.valid_until(), sent + Duration::from_millis(59_398));
    }

    #[test]
    fn validity_is_the_ttl_less_one_percent_and_two_milliseconds() {
        // Expected values worked out by hand from the documented margin (1% + 2 ms).
        for (ttl, expected) in [
            (Duration::from_secs(10), Duration::from_millis(9_898)),
            (Duration::from_secs(30), Duration::from_millis(29_698)),
            (Duration::from_millis(1_500), Duration::from_millis(1_483)),
            (MIN_TTL, Duration::from_micros(7_900)),
            (MAX_TTL, Duration::from_millis(31_220_639_998)),
            // Nothing is left of a lease shorter than the margin.
            (Duration::from_millis(2), Duration::ZERO),
        ] {
            assert_eq!(validity(ttl), expected, "ttl {ttl:?}");
        }
    }

    #[test]
    fn an_acquired_or_handed_lease_is_valid_from_its_start_less_the_margin() {
        let sent = Instant::now();
        let state = LeaseState::new(Duration::from_secs(10), false);
        state.acquired(sent, Duration::from_secs(10));
        assert_eq!(state.valid_until(), sent + Duration::from_millis(9_898));
        // A hand-off's claim (2 s) counts until renewal moves the lease to its ttl.
        let state = LeaseState::new(Duration::from_secs(10), true);
        state.handed(sent, Duration::from_secs(2), Duration::from_secs(10));
        assert_eq!(state.valid_until(), sent + Duration::from_millis(1_978));
        assert_eq!(state.ttl(), Duration::from_secs(10));
    }

    #[test]
    fn a_lease_past_its_validity_stays_lost() {
        let state = LeaseState::new(Duration::from_millis(10), true);
        state.acquired(
            Instant::now() - Duration::from_secs(1),
            Duration::from_millis(10),
        );
        assert!(state.is_lost());
        assert!(!state.renewed(Instant::now(), Duration::from_secs(30)));
        assert!(state.is_lost());
    }

    #[test]
    fn ttls_under_the_minimum_are_refused() {
        assert!(check_ttl(MIN_TTL).is_ok());
        assert!(check_ttl(MIN_TTL - Duration::from_nanos(1)).is_err());
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(MAX_TTL).is_ok());
        assert!(check_ttl(Duration::MAX).is_err());
    }
}
