//! The waiter's side of a fair lock: which local waiter a hand-off reaches, who watches its
//! claim, and when a watcher wakes for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::message::Handoff;
use super::HANDOFF_CLAIM;
use crate::sync::lock;

/// What a local fair waiter keeps for the subscriber to find: its token (hand-offs name it),
/// its attempts' secrets (a real hand-off shows one) and the news hand-offs brought it.
pub(crate) struct FairWaiter {
    token: Arc<str>,
    /// When its wait ends: its queue entry is never kept past it.
    deadline: Instant,
    /// How long its queue entry lasts once kept (see `request.rs`, [`presence`](super::presence)).
    presence: Duration,
    secrets: Mutex<Secrets>,
    news: Mutex<News>,
}

/// The secrets of a fair waiter's latest two attempts.
#[derive(Default)]
struct Secrets {
    latest: Option<Arc<str>>,
    earlier: Option<Arc<str>>,
}

/// A fair waiter that the first fair waiter of its key in this process keeps queued: its owner
/// token, when its wait ends, and how long its entry lasts once kept.
#[derive(Debug, Clone)]
pub(crate) struct Sibling {
    pub(crate) token: Arc<str>,
    pub(crate) deadline: Instant,
    pub(crate) presence: Duration,
}

/// Which attempt's secret a hand-off showed.
enum Shown {
    Latest,
    Earlier,
    Unknown,
}

/// What a fair waiter learned from hand-off messages.
#[derive(Default)]
struct News {
    /// The lock was handed to this waiter.
    handed: Option<Handoff>,
    /// This waiter watches the latest hand-off: try again once its claim would have lapsed, in
    /// case its recipient is gone.
    watch_until: Option<Instant>,
}

impl FairWaiter {
    /// The waiter of `token`, whose latest attempt stored `secret`, which waits until
    /// `deadline` and whose queue entry lasts `presence` once kept.
    pub(crate) fn new(
        token: Arc<str>,
        secret: Option<Arc<str>>,
        deadline: Instant,
        presence: Duration,
    ) -> Self {
        Self {
            token,
            deadline,
            presence,
            secrets: Mutex::new(Secrets {
                latest: secret,
                earlier: None,
            }),
            news: Mutex::new(News::default()),
        }
    }

    /// What the first fair waiter of its process needs to keep it queued.
    pub(crate) fn sibling(&self) -> Sibling {
        Sibling {
            token: Arc::clone(&self.token),
            deadline: self.deadline,
            presence: self.presence,
        }
    }

    /// How long its queue entry lasts once kept.
    pub(crate) fn presence(&self) -> Duration {
        self.presence
    }

    /// Whether its owner token is one of `tokens`.
    pub(crate) fn is_one_of(&self, tokens: &[String]) -> bool {
        tokens.iter().any(|t| **t == *self.token)
    }

    /// From now on, a hand-off must be signed with `secret` (a new attempt stored it); one
    /// signed with the secret before is still recognised as genuine.
    pub(crate) fn expect_secret(&self, secret: Option<Arc<str>>) {
        let mut secrets = lock(&self.secrets);
        if secrets.latest != secret {
            secrets.earlier = std::mem::replace(&mut secrets.latest, secret);
        }
    }

    fn check(&self, handoff: &Handoff) -> Shown {
        let secrets = lock(&self.secrets);
        let signed = |secret: &Option<Arc<str>>| {
            secret
                .as_deref()
                .is_some_and(|secret| handoff.signed_with(secret))
        };
        if signed(&secrets.latest) {
            Shown::Latest
        } else if signed(&secrets.earlier) {
            Shown::Earlier
        } else {
            Shown::Unknown
        }
    }

    /// Takes a hand-off to this waiter, if one came.
    pub(crate) fn take_handed(&self) -> Option<Handoff> {
        lock(&self.news).handed.take()
    }

    /// When this waiter should look at the latest hand-off's claim, if it watches one.
    pub(crate) fn watch(&self) -> Option<Instant> {
        lock(&self.news).watch_until
    }

    /// Takes over a watch of a waiter that left (keeping the later of the two).
    pub(crate) fn inherit_watch(&self, until: Instant) {
        let mut news = lock(&self.news);
        news.watch_until = news.watch_until.max(Some(until));
    }

    /// Starts watching until `until`; whether this waiter watched nothing before (and so must
    /// be woken to take it into account).
    fn start_watch(&self, until: Instant) -> bool {
        lock(&self.news).watch_until.replace(until).is_none()
    }
}

/// Gives a hand-off published on `channel` to its recipient, if it waits in this process, and
/// has the claim watched by this process's oldest other fair waiter (every subscribed process
/// has one, so the claim stays watched whichever processes are gone). A watcher tries again once the claim would have
/// lapsed; a newer hand-off replaces the one it watched. `waiters` are this process's fair
/// waiters of the key, oldest first, each with the `Notify` that wakes it.
///
/// A hand-off reaches its recipient only if it is signed with the secret of the recipient's
/// latest attempt. One signed with the attempt before is genuine but stale (made before the
/// latest attempt ran, which then finds the lock already the waiter's): its claim is watched,
/// and the recipient learns of it from that attempt. One signed with neither is forged: dropped
/// with a warning. A hand-off to a waiter of another process cannot be checked here; watchers
/// take its claim as at most [`HANDOFF_CLAIM`], so a forged one delays them by little.
pub(crate) fn deliver(channel: &str, handoff: Handoff, waiters: &[(&FairWaiter, &Notify)]) {
    let named = |name: &str| waiters.iter().find(|(w, _)| &*w.token == name);
    let mut recipient = named(&handoff.token);
    if let Some((waiter, _)) = recipient {
        match waiter.check(&handoff) {
            Shown::Latest => {}
            Shown::Earlier => recipient = None,
            Shown::Unknown => {
                tracing::warn!(
                    %channel,
                    "distlock ignored a hand-off message that its waiter's secret did not sign: \
                     it was not published by distlock's release script"
                );
                return;
            }
        }
    }
    // Some slack past the claim: the recipient's extension may be on its way.
    let claim = handoff.claim.min(HANDOFF_CLAIM);
    let until = Instant::now() + claim + claim / 4;
    let oldest = waiters.iter().find(|(w, _)| *w.token != *handoff.token);
    if let Some((watcher, wake)) = oldest {
        // A watcher already sleeping until an earlier watch finds this one when it wakes; only
        // one without a watch needs waking to take it into account.
        if watcher.start_watch(until) {
            wake.notify_one();
        }
    }
    if let Some((waiter, wake)) = recipient {
        lock(&waiter.news).handed = Some(handoff);
        wake.notify_one();
    }
}

/// Passes the watch of a fair waiter that `leaves` (if it watches a claim not yet over) to the
/// oldest of `heirs`, this process's fair waiters of the key still waiting, oldest first, each
/// with the `Notify` that wakes it: the claim it watched does not go unwatched.
pub(crate) fn pass_on_watch<'a>(
    leaves: Option<&FairWaiter>,
    mut heirs: impl Iterator<Item = (&'a FairWaiter, &'a Notify)>,
) {
    let Some(until) = leaves
        .and_then(FairWaiter::watch)
        .filter(|&until| until > Instant::now())
    else {
        return;
    };
    if let Some((heir, wake)) = heirs.next() {
        heir.inherit_watch(until);
        wake.notify_one();
    }
}

/// When a waiting fair waiter wakes for the claim it watches, besides the holder's expiry, and
/// which claim's end it already woke for (it tries once per claim).
#[derive(Debug, Default)]
pub(crate) struct ClaimWatch {
    woke_for: Option<Instant>,
}

impl ClaimWatch {
    /// When to wake: at `holder_until`, or sooner at `watch` (the end of the claim the waiter
    /// watches now, if any) unless it woke for that one already; and the watch it wakes for.
    pub(crate) fn wake_at(
        &self,
        watch: Option<Instant>,
        holder_until: Instant,
    ) -> (Instant, Option<Instant>) {
        let watch = watch.filter(|w| Some(*w) != self.woke_for);
        (watch.map_or(holder_until, |w| holder_until.min(w)), watch)
    }

    /// After sleeping until [`wake_at`](Self::wake_at) said, for `watched`: `false` when a
    /// newer hand-off's claim (`watch` now) replaced the one watched, to sleep again until that;
    /// `true` to try the lock now (the claim, or the holder's lease, may be over).
    pub(crate) fn woke(
        &mut self,
        watched: Option<Instant>,
        watch: Option<Instant>,
        now: Instant,
        holder_until: Instant,
    ) -> bool {
        if now < holder_until && watch.is_some_and(|w| w > now) {
            return false;
        }
        if watched.is_some_and(|w| w <= now) {
            self.woke_for = watched;
        }
        true
    }
}

#[cfg(test)]
mod tests {

    use super::super::message::mac;
    use super::*;

    #[test]
    fn only_a_hand_off_signed_with_the_latest_secret_reaches_its_waiter() {
        let waiter = FairWaiter::new(
            "w1".into(),
            Some("s1".into()),
            Instant::now(),
            Duration::ZERO,
        );
        let wake = Notify::new();
        let signed = "w1 7 1 2000";
        let handoff = |mac: String| Handoff::parse(format!("h {signed} {mac}").as_bytes());
        // Forged: the secret is unknown to the sender, or the signed fields were changed.
        deliver("k", handoff("0".repeat(40)).unwrap(), &[(&waiter, &wake)]);
        let altered = Handoff::parse(format!("h w1 9 1 2000 {}", mac("s1", signed)).as_bytes());
        deliver("k", altered.unwrap(), &[(&waiter, &wake)]);
        assert!(waiter.take_handed().is_none());
        waiter.expect_secret(Some("s2".into()));
        // Made before the latest attempt ran: that attempt finds the lock handed over.
        deliver(
            "k",
            handoff(mac("s1", signed)).unwrap(),
            &[(&waiter, &wake)],
        );
        assert!(waiter.take_handed().is_none());
        deliver(
            "k",
            handoff(mac("s2", signed)).unwrap(),
            &[(&waiter, &wake)],
        );
        assert_eq!(waiter.take_handed().map(|h| h.fencing_token), Some(7));
    }

    #[test]
    fn a_watcher_tries_once_per_claim_and_follows_a_newer_one() {
        let now = Instant::now();
        let holder_until = now + Duration::from_secs(10);
        let mut claims = ClaimWatch::default();
        let claim = now + Duration::from_secs(2);
        assert_eq!(claims.wake_at(None, holder_until), (holder_until, None));
        assert_eq!(
            claims.wake_at(Some(claim), holder_until),
            (claim, Some(claim))
        );
        // Woken at the claim's end: try, and never wake for that claim again.
        assert!(claims.woke(Some(claim), Some(claim), claim, holder_until));
        assert_eq!(
            claims.wake_at(Some(claim), holder_until),
            (holder_until, None)
        );
        // A newer hand-off replaced the one watched before it ended: sleep until that one.
        let newer = claim + Duration::from_secs(2);
        assert!(!claims.woke(Some(claim), Some(newer), claim, holder_until));
        // Past the holder's expiry, try whatever is watched.
        assert!(claims.woke(
            None,
            Some(newer + newer.duration_since(now)),
            holder_until,
            holder_until
        ));
    }

    #[test]
    fn a_leaving_watcher_passes_its_watch_to_the_oldest_waiter_left() {
        let (leaving, heir, other) = (
            FairWaiter::new("a".into(), None, Instant::now(), Duration::ZERO),
            FairWaiter::new("b".into(), None, Instant::now(), Duration::ZERO),
            FairWaiter::new("c".into(), None, Instant::now(), Duration::ZERO),
        );
        let wake = Notify::new();
        let until = Instant::now() + Duration::from_secs(1);
        pass_on_watch(Some(&leaving), [(&heir, &wake)].into_iter());
        assert_eq!(heir.watch(), None, "nothing watched, nothing passed on");
        leaving.inherit_watch(until);
        pass_on_watch(
            Some(&leaving),
            [(&heir, &wake), (&other, &wake)].into_iter(),
        );
        assert_eq!(heir.watch(), Some(until));
        assert_eq!(other.watch(), None);
    }
}
