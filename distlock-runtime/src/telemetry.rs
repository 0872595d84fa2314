//! Metrics, through the `metrics` facade (cargo feature `metrics`, on by default): whatever
//! recorder the application installs (Prometheus, StatsD, ...) receives them; without one, or
//! without the feature, they cost nothing.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `distlock_acquisitions_total` | counter | `template`, `mode`, `outcome` | acquire requests by outcome: `acquired` (at once), `contended` (after waiting), `timed_out`, `not_acquired` (a try-lock that found it held), `error` |
//! | `distlock_wait_seconds` | histogram | `template`, `mode` | time from asking to holding (acquired and contended) |
//! | `distlock_hold_seconds` | histogram | `template`, `mode` | time a `run` body held the lock |
//! | `distlock_leases_lost_total` | counter | `template`, `mode` | leases lost while their body ran |
//! | `distlock_handoffs_total` | counter | `template`, `mode` | fair leases handed over by a release |
//! | `distlock_renewals_total` | counter | `outcome` (`ok`, `failed`) | renewal round trips |
//! | `distlock_subscriber_reconnects_total` | counter | | subscriber connections opened after the first |
//! | `distlock_terms_started_total` | counter | `election` | terms this process began leading ([`Election`](crate::Election)) |
//! | `distlock_terms_lost_total` | counter | `election` | terms lost while held (renewal failed past the validity, or the key was taken or force-released); a resigned or dropped term is not lost |
//!
//! `template` is the attribute's key template (`order:{order_id}`), or the label given to
//! [`LockRequest::metrics_label`](crate::LockRequest::metrics_label), else `manual`: never a
//! rendered key, which would make one series per order. `mode` is how the request holds its
//! keys: `exclusive`, `shared`, `permits`, or `mixed` (exclusive and shared keys in one
//! request). `election` is the election's name (a role, such as `scheduler`: few per fleet).

// Without the feature, nothing is recorded: the arguments and the labels go unused.
#![cfg_attr(not(feature = "metrics"), allow(unused_variables, dead_code))]

use std::time::Duration;

use crate::error::LockError;
use crate::mode::LockMode;

/// The label of requests that name no template.
pub(crate) const UNLABELLED: &str = "manual";

/// The labels of one request's series: its template and mode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tags {
    pub(crate) template: &'static str,
    pub(crate) mode: &'static str,
}

impl Tags {
    /// The labels of a request for keys in `modes` under `template`.
    pub(crate) fn new(template: &'static str, modes: &[LockMode]) -> Self {
        let mode = match modes.split_first() {
            Some((first, rest)) if rest.iter().all(|m| m.name() == first.name()) => first.name(),
            Some(_) => "mixed",
            None => LockMode::Exclusive.name(),
        };
        Self { template, mode }
    }
}

/// How an acquire ended, for `distlock_acquisitions_total`.
pub(crate) fn acquisition(tags: Tags, outcome: Result<Duration, &LockError>, waited: bool) {
    let outcome = match outcome {
        Ok(_) if waited => "contended",
        Ok(_) => "acquired",
        Err(LockError::Timeout { .. }) => "timed_out",
        Err(LockError::NotAcquired { .. }) => "not_acquired",
        Err(_) => "error",
    };
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_acquisitions_total", "template" => tags.template, "mode" => tags.mode, "outcome" => outcome)
        .increment(1);
}

/// How long an acquire took, for `distlock_wait_seconds`.
pub(crate) fn waited(tags: Tags, wait: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("distlock_wait_seconds", "template" => tags.template, "mode" => tags.mode)
        .record(wait.as_secs_f64());
}

/// How long a body held its lease, for `distlock_hold_seconds`.
pub(crate) fn held(tags: Tags, hold: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("distlock_hold_seconds", "template" => tags.template, "mode" => tags.mode)
        .record(hold.as_secs_f64());
}

/// A lease lost while its body ran.
pub(crate) fn lease_lost(tags: Tags) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_leases_lost_total", "template" => tags.template, "mode" => tags.mode)
        .increment(1);
}

/// A fair lease handed over by a release.
pub(crate) fn handed_over(tags: Tags) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_handoffs_total", "template" => tags.template, "mode" => tags.mode)
        .increment(1);
}

/// A term of the election `name` began in this process.
pub(crate) fn term_started(name: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_terms_started_total", "election" => name.to_owned()).increment(1);
}

/// A term of the election `name` held by this process was lost.
pub(crate) fn term_lost(name: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_terms_lost_total", "election" => name.to_owned()).increment(1);
}

/// One renewal round trip, and whether it failed.
pub(crate) fn renewal(ok: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_renewals_total", "outcome" => if ok { "ok" } else { "failed" })
        .increment(1);
}

/// A subscriber connection opened after the manager's first.
pub(crate) fn subscriber_reconnect() {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_subscriber_reconnects_total").increment(1);
}

/// A nested request inverted a lock order seen before (see `order.rs`).
pub(crate) fn lock_order_inversion() {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_lock_order_inversions_total").increment(1);
}

/// Rate-limits a warning that may repeat for every lock while Redis is away: the first is let
/// through at once, later ones at most once a [`Throttle::EVERY`], each with how many were held
/// back since the last.
pub(crate) struct Throttle {
    /// When the last one was let through.
    last: Option<tokio::time::Instant>,
    /// Held back since.
    held_back: u64,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new()
    }
}

impl Throttle {
    pub(crate) const EVERY: std::time::Duration = std::time::Duration::from_secs(1);

    /// None let through yet (`const`, for a `static`).
    pub(crate) const fn new() -> Self {
        Self {
            last: None,
            held_back: 0,
        }
    }

    /// Counts one more occurrence at `now`; `Some(held back since the last)` when it is to be
    /// logged.
    pub(crate) fn note(&mut self, now: tokio::time::Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now < last + Self::EVERY) {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(self.take_held_back())
    }

    /// How many were held back since the last one let through, counting afresh from now.
    pub(crate) fn take_held_back(&mut self) -> u64 {
        std::mem::take(&mut self.held_back)
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;
    use std::time::Duration;

    #[test]
    fn a_throttle_lets_one_through_a_second_and_counts_the_rest() {
        let start = tokio::time::Instant::now();
        let mut throttle = Throttle::default();
        assert_eq!(throttle.note(start), Some(0));
        for ms in [1, 500, 999] {
            assert_eq!(throttle.note(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(throttle.note(start + Duration::from_millis(1000)), Some(3));
        assert_eq!(throttle.note(start + Duration::from_millis(1001)), None);
    }
}
