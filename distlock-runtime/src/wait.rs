//! How a waiter learns when to try a held lock again.
//!
//! The one seam between the acquire loop and the waiting strategy: [`Waiter::wait`] sleeps until
//! the next attempt is worth making, or says the caller's deadline has passed. Today that is
//! jittered exponential backoff (1 ms doubling to 50 ms), never sleeping past the holder's
//! remaining lifetime (its lock may expire) or past the caller's deadline (one last attempt is
//! made exactly at the deadline).

use std::time::Duration;

use tokio::time::Instant;

/// First backoff step.
const FIRST: Duration = Duration::from_millis(1);
/// Longest backoff step.
const CAP: Duration = Duration::from_millis(50);

/// Paces one caller's attempts on a held lock.
#[derive(Debug)]
pub(crate) struct Waiter {
    deadline: Instant,
    step: Duration,
}

impl Waiter {
    /// A waiter that gives up at `deadline`.
    pub(crate) fn new(deadline: Instant) -> Self {
        Self {
            deadline,
            step: FIRST,
        }
    }

    /// Sleeps until the next attempt. `holder_remaining` is the held lock's remaining lifetime, if
    /// Redis reported one. Returns `false` without sleeping when the deadline has passed.
    pub(crate) async fn wait(&mut self, holder_remaining: Option<Duration>) -> bool {
        match self.next_delay(Instant::now(), holder_remaining) {
            Some(delay) => {
                tokio::time::sleep(delay).await;
                true
            }
            None => false,
        }
    }

    /// The pause before the next attempt, or `None` once `now` is at or past the deadline.
    fn next_delay(&mut self, now: Instant, holder_remaining: Option<Duration>) -> Option<Duration> {
        let left = self.deadline.checked_duration_since(now)?;
        if left.is_zero() {
            return None;
        }
        let step = self.step;
        self.step = (step * 2).min(CAP);
        // "Equal jitter": half the step fixed, half random, so waiters spread out without
        // ever retrying in a tight loop.
        let half = step / 2;
        let jitter = Duration::from_nanos(fastrand::u64(0..=half.as_nanos() as u64));
        let mut delay = half + jitter;
        if let Some(remaining) = holder_remaining {
            // The holder's lease ends then even if it never releases: be there when it does.
            delay = delay.min(remaining + Duration::from_millis(1));
        }
        Some(delay.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_the_cap_and_stay_within_jitter_bounds() {
        let now = Instant::now();
        let mut waiter = Waiter::new(now + Duration::from_secs(60));
        let mut expected = FIRST;
        for _ in 0..12 {
            let delay = waiter.next_delay(now, None).unwrap();
            assert!(
                delay >= expected / 2 && delay <= expected,
                "{delay:?} vs {expected:?}"
            );
            expected = (expected * 2).min(CAP);
        }
        assert_eq!(waiter.step, CAP);
    }

    #[test]
    fn never_sleeps_past_the_holders_expiry_or_the_deadline() {
        let now = Instant::now();
        let mut waiter = Waiter::new(now + Duration::from_millis(30));
        waiter.step = CAP;
        let delay = waiter
            .next_delay(now, Some(Duration::from_millis(3)))
            .unwrap();
        assert!(delay <= Duration::from_millis(4), "{delay:?}");
        let delay = waiter
            .next_delay(now + Duration::from_millis(29), None)
            .unwrap();
        assert!(delay <= Duration::from_millis(1), "{delay:?}");
    }

    #[test]
    fn gives_up_at_the_deadline() {
        let now = Instant::now();
        let mut waiter = Waiter::new(now + Duration::from_millis(5));
        assert!(waiter
            .next_delay(now + Duration::from_millis(5), None)
            .is_none());
        assert!(waiter
            .next_delay(now + Duration::from_secs(1), None)
            .is_none());
    }
}
