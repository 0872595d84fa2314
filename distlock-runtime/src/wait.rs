//! How long a request waits ([`Wait`]), and how a waiter learns when to try a held lock again
//! ([`Waiter`]).
//!
//! The one seam between the acquire loop and the waiting strategy: [`Waiter::wait`] sleeps until
//! the next attempt is worth making, or says the caller's deadline has passed. With release
//! notifications (a manager built from a URL), the first wait subscribes to the held key and
//! tries again at once (so a release in between is not missed); later waits sleep until this
//! waiter is handed a notification, the holder's lease would expire (expiry publishes nothing),
//! or the deadline. Without notifications (or while the subscriber connection is down), jittered
//! exponential backoff: 1 ms doubling to 50 ms, never past the holder's expiry or the deadline.
//! One last attempt is always made at the deadline.
//!
//! A fair waiter is queued in Redis by its attempt, and is woken by the hand-off that makes it
//! the owner (no further attempt needed), or, when it watches the current hand-off, at the end
//! of its claim (in case that recipient is gone), besides the deadline and the holder's expiry.
//! Only the first fair waiter of a key in each process wakes at the holder's expiry (and, since
//! its attempt then renews its own place in the queue, renews the others' too: see `fair/`);
//! the others sleep until a hand-off, a notification or that first waiter's leaving wakes them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::fair::{self, ClaimWatch, Handoff, HolderWatch, Sibling};
use crate::notify::{Notifications, Ticket};
use crate::retry::Retry;

/// With notifications, how long to sleep on a held key that has no expiry before looking again.
const NO_EXPIRY_CHECK: Duration = Duration::from_secs(1);

/// How long a request waits: from when it started, for how long. Zero is a try-lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    pub(crate) started: Instant,
    pub(crate) limit: Duration,
}

impl Wait {
    pub(crate) fn new(started: Instant, limit: Duration) -> Self {
        Self { started, limit }
    }

    /// When the wait runs out (a century away for an endless one).
    pub(crate) fn deadline(&self) -> Instant {
        self.started
            .checked_add(self.limit)
            .unwrap_or_else(|| self.started + Duration::from_secs(100 * 365 * 86_400))
    }

    /// A try-lock: one look, no waiting.
    pub(crate) fn is_try(&self) -> bool {
        self.limit.is_zero()
    }
}

/// What ended a wait.
#[derive(Debug)]
pub(crate) enum Wake {
    /// Try to acquire again.
    Retry,
    /// A release handed the lock to this (fair) waiter.
    Handed(Handoff),
    /// The deadline has passed.
    Deadline,
}

/// Paces one caller's attempts on a held lock.
pub(crate) struct Waiter<'a> {
    deadline: Instant,
    /// Backoff pauses so far (see [`Retry::waiting`]).
    paused: u32,
    notifications: Option<&'a Notifications>,
    /// The owner token of a fair waiter, and how long its queue entry lasts once kept.
    fair: Option<(Arc<str>, Duration)>,
    /// The secret of the fair waiter's latest attempt.
    secret: Option<Arc<str>>,
    ticket: Option<Ticket>,
    /// The claim of a hand-off this (fair) waiter watches, if any.
    claims: ClaimWatch,
}

impl<'a> Waiter<'a> {
    /// A waiter that gives up at `deadline`, woken by `notifications` when there are some;
    /// `fair` is the owner token of a fair waiter, which hand-offs name, and its presence (how
    /// long its queue entry lasts once kept).
    pub(crate) fn new(
        deadline: Instant,
        notifications: Option<&'a Notifications>,
        fair: Option<(Arc<str>, Duration)>,
    ) -> Self {
        Self {
            deadline,
            paused: 0,
            notifications,
            fair,
            secret: None,
            ticket: None,
            claims: ClaimWatch::default(),
        }
    }

    /// Called before each attempt on `key`, with a fair attempt's `secret`: a fair waiter
    /// whose manager already receives the key's notifications takes its place among the local
    /// waiters first, so a hand-off made right after its attempt queues it (and published before
    /// the attempt's answer is read) finds it. From now on only a hand-off showing `secret` is
    /// accepted.
    pub(crate) fn before_attempt(&mut self, key: &str, secret: Option<Arc<str>>) {
        self.secret = secret;
        if let Some(ticket) = &self.ticket {
            ticket.expect_secret(self.secret.clone());
        }
        if let (Some(notifications), Some(fair)) = (self.notifications, &self.fair) {
            if self.ticket.is_none() && notifications.subscribed(key) {
                self.ticket = Some(notifications.enqueue(
                    key,
                    Some(fair.clone()),
                    self.secret.clone(),
                    self.deadline,
                ));
            }
        }
    }

    /// After an attempt that took the keys: a release announcement this waiter took was used,
    /// unless it took them `shared` (or as a permit): others waiting here may fit beside it,
    /// so the announcement goes on to the next waiter when this one leaves.
    pub(crate) fn took(&self, shared: bool) {
        if let Some(ticket) = self.ticket.as_ref().filter(|_| !shared) {
            ticket.discharge();
        }
    }

    /// After an attempt that found the lock key `key` held and, if `marked`, marked its holder
    /// as waited on: a release announcement this waiter took for `key` was used (that holder's
    /// release will be announced). One for another key, or an attempt that marked nothing,
    /// leaves it owed: the waiter passes it on when it leaves the key.
    pub(crate) fn found_held(&self, key: &str, marked: bool) {
        if let Some(ticket) = self
            .ticket
            .as_ref()
            .filter(|t| marked && t.channel() == key)
        {
            ticket.discharge();
        }
    }

    /// Sleeps until the next attempt on the held lock key `key` (its Redis name), or until a
    /// release hands the lock to this fair waiter. `holder_remaining` is the holder's remaining
    /// lifetime, if Redis reported one; `sent` is when the attempt that found the key held was
    /// sent.
    pub(crate) async fn wait(
        &mut self,
        key: &str,
        holder_remaining: Option<Duration>,
        sent: Instant,
    ) -> Wake {
        // A hand-off that came counts, also at the deadline.
        if let Some(handoff) = self.ticket.as_ref().and_then(Ticket::take_handed) {
            return Wake::Handed(handoff);
        }
        let now = Instant::now();
        if now >= self.deadline {
            return Wake::Deadline;
        }
        let Some(notifications) = self.notifications else {
            return self.back_off(holder_remaining).await;
        };
        if self.ticket.as_ref().is_none_or(|t| t.channel() != key) {
            self.ticket = None;
            self.ticket = Some(notifications.enqueue(
                key,
                self.fair.clone(),
                self.secret.clone(),
                self.deadline,
            ));
        }
        let Some(ticket) = &self.ticket else {
            return self.back_off(holder_remaining).await;
        };
        match ticket.subscribed_since() {
            None => {
                // Waiting for the subscription never outlasts this wait, nor the holder's expiry.
                let until = holder_remaining.map_or(self.deadline, |r| {
                    (now + r + Duration::from_millis(1)).min(self.deadline)
                });
                if ticket.subscribe(until).await {
                    // Subscribed now: try again at once, so a release (or hand-off) just before
                    // is not missed.
                    return Wake::Retry;
                }
                return self.back_off(holder_remaining).await;
            }
            // Subscribed (by another waiter) only after the attempt went out: a release in
            // between reached nobody, so try once more.
            Some(since) if since >= sent => return Wake::Retry,
            // A release announced after the attempt went out, before this waiter joined the
            // key's waiters: nobody took it for this waiter, so try once more.
            Some(_) if ticket.message_since(sent) => return Wake::Retry,
            Some(_) => {}
        }
        let holder_until = holder_remaining
            .map_or(now + NO_EXPIRY_CHECK, |r| {
                now + r + Duration::from_millis(1)
            })
            .min(self.deadline);
        self.sleep_on(holder_until, sent).await
    }

    /// Sleeps on the ticket until a hand-off, a notification, or the holder's expiry
    /// (`holder_until`, or the deadline for a fair waiter behind another of this process).
    async fn sleep_on(&mut self, holder_until: Instant, sent: Instant) -> Wake {
        let Some(ticket) = &self.ticket else {
            return Wake::Retry;
        };
        loop {
            if let Some(handoff) = ticket.take_handed() {
                return Wake::Handed(handoff);
            }
            // A fair waiter behind another of this process sleeps through the holder's expiry:
            // the first one tries then, and keeps it queued (it is woken when that one leaves).
            // The first tries at the latest a third of the shortest presence among them after
            // its last attempt, which keeps its own place and theirs.
            let watching = ticket.among_fair(|me, waiters| fair::watching(me, waiters));
            let expiry = match watching.unwrap_or(HolderWatch::Holder { keep_within: None }) {
                HolderWatch::Behind => self.deadline,
                HolderWatch::Holder {
                    keep_within: Some(presence),
                } => holder_until.min(sent + presence / 3),
                HolderWatch::Holder { keep_within: None } => holder_until,
            };
            let (until, watched) = self.claims.wake_at(ticket.watch(), expiry);
            tokio::select! {
                plain = ticket.woken() => if plain {
                    // A release may hand this waiter the key and announce itself at once (it
                    // let readers in): the hand-off, which needs no attempt, comes first.
                    if let Some(handoff) = ticket.take_handed() {
                        return Wake::Handed(handoff);
                    }
                    return Wake::Retry;
                },
                () = tokio::time::sleep_until(until) => {
                    let now = Instant::now();
                    if self.claims.woke(watched, ticket.watch(), now, expiry) {
                        return Wake::Retry;
                    }
                }
            }
        }
    }

    /// The other fair waiters of the key this waiter waits for in this process, when it is the
    /// first of them and so keeps them queued; else none.
    pub(crate) fn fair_siblings(&self) -> Vec<Sibling> {
        self.ticket
            .as_ref()
            .and_then(|ticket| ticket.among_fair(|me, waiters| fair::siblings(me, waiters)))
            .unwrap_or_default()
    }

    /// Wakes the fair waiters of this process whose owner tokens are `tokens` (no longer
    /// queued) to try again.
    pub(crate) fn wake_fair(&self, tokens: &[String]) {
        if let Some(ticket) = &self.ticket {
            ticket.among_fair(|_, waiters| fair::wake(tokens, waiters));
        }
    }

    async fn back_off(&mut self, holder_remaining: Option<Duration>) -> Wake {
        let Some(delay) = self.next_delay(Instant::now(), holder_remaining) else {
            return Wake::Deadline;
        };
        tokio::time::sleep(delay).await;
        Wake::Retry
    }

    /// The pause before the next attempt ([`Retry::waiting`]), or `None` once `now` is at or
    /// past the deadline.
    fn next_delay(&mut self, now: Instant, holder_remaining: Option<Duration>) -> Option<Duration> {
        let delay = Retry::waiting(self.deadline).pause(self.paused + 1, now)?;
        self.paused += 1;
        // The holder's lease ends then even if it never releases: be there when it does.
        Some(holder_remaining.map_or(delay, |r| delay.min(r + Duration::from_millis(1))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_the_cap_and_stay_within_jitter_bounds() {
        let now = Instant::now();
        let mut waiter = Waiter::new(now + Duration::from_secs(60), None, None);
        let policy = Retry::waiting(waiter.deadline);
        let mut expected = policy.base;
        for _ in 0..12 {
            let delay = waiter.next_delay(now, None).unwrap();
            assert!(
                delay >= expected / 2 && delay <= expected,
                "{delay:?} vs {expected:?}"
            );
            expected = (expected * 2).min(policy.cap);
        }
        // And there it stays.
        let delay = waiter.next_delay(now, None).unwrap();
        assert!(delay >= policy.cap / 2 && delay <= policy.cap, "{delay:?}");
    }

    #[test]
    fn never_sleeps_past_the_holders_expiry_or_the_deadline() {
        let now = Instant::now();
        let mut waiter = Waiter::new(now + Duration::from_millis(30), None, None);
        // At the cap (50 ms).
        waiter.paused = 6;
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
        let mut waiter = Waiter::new(now + Duration::from_millis(5), None, None);
        assert!(waiter
            .next_delay(now + Duration::from_millis(5), None)
            .is_none());
        assert!(waiter
            .next_delay(now + Duration::from_secs(1), None)
            .is_none());
    }
}
