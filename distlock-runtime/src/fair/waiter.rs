//! The waiter's side of a fair lock: which local waiter a hand-off reaches, who watches its
//! claim, and when a watcher wakes for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::message::Handoff;
use super::HANDOFF_CLAIM;
use crate::sync::lock;

/// What a local fair waiter keeps for the subscriber to find: its token (hand-offs name it),
/// its attempts' secrets (a real hand-off shows one) and the news hand-offs brought it.
pub(crate) struct FairWaiter {
    /// Its token, when its wait ends (its queue entry is never kept past it) and how long its
    /// entry lasts once kept (see `request.rs`, [`presence`](super::presence)).
    entry: Sibling,
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
            entry: Sibling {
                token,
                deadline,
                presence,
            },
            secrets: Mutex::new(Secrets {
                latest: secret,
                earlier: None,
            }),
            news: Mutex::new(News::default()),
        }
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
        if handoff.signed_with(secrets.latest.as_deref()) {
            Shown::Latest
        } else if handoff.signed_with(secrets.earlier.as_deref()) {
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
/// waiters of the key, oldest first.
///
/// A hand-off reaches its recipient only if it is signed with the secret of the recipient's
/// latest attempt. One signed with the attempt before is genuine but stale (made before the
/// latest attempt ran, which then finds the lock already the waiter's): its claim is watched,
/// and the recipient learns of it from that attempt. One signed with neither is forged: dropped
/// with a warning. A hand-off to a waiter of another process cannot be checked here; watchers
/// take its claim as at most [`HANDOFF_CLAIM`], so a forged one delays them by little.
pub(crate) fn deliver<'a, L: Local<'a>>(
    channel: &str,
    handoff: Handoff,
    mut waiters: impl Iterator<Item = L> + Clone,
) {
    let mut recipient = waiters
        .clone()
        .find(|w| *w.waiter().entry.token == *handoff.token);
    if let Some(local) = recipient {
        match local.waiter().check(&handoff) {
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
    if let Some(watcher) = waiters.find(|w| *w.waiter().entry.token != *handoff.token) {
        // A watcher already sleeping until an earlier watch finds this one when it wakes; only
        // one without a watch needs waking to take it into account.
        if watcher.waiter().start_watch(until) {
            watcher.nudge();
        }
    }
    if let Some(recipient) = recipient {
        lock(&recipient.waiter().news).handed = Some(handoff);
        recipient.nudge();
    }
}

/// Whether a waiter watches its key's holder for this process.
pub(crate) enum HolderWatch {
    /// A fair waiter behind another fair waiter of this process: that one watches for it.
    Behind,
    /// It watches the holder; the first fair waiter keeps the process's fair waiters queued
    /// within the shortest presence among them (`None`: not a fair waiter).
    Holder { keep_within: Option<Duration> },
}

/// One of this process's fair waiters of a key, as the notifier holds it (`notify/`): its state,
/// and how to wake it. The rules below take a key's, oldest first.
pub(crate) trait Local<'a>: Copy {
    fn waiter(self) -> &'a FairWaiter;
    /// Wakes it to look again at what it waits for (hand-off news, its watch).
    fn nudge(self);
    /// Wakes it to try again, as a release announcement does.
    fn notify(self);
}

/// Whether `local` is `me`.
fn is<'a>(local: impl Local<'a>, me: &FairWaiter) -> bool {
    std::ptr::eq(local.waiter(), me)
}

/// `newcomer` joined `waiters`: the first keeps it queued, and looks again at when it must next
/// do so if its entry lasts less than any it keeps.
pub(crate) fn joined<'a, L: Local<'a>>(
    newcomer: &FairWaiter,
    waiters: impl Iterator<Item = L> + Clone,
) {
    let Some(first) = waiters.clone().next() else {
        return;
    };
    let presence = newcomer.entry.presence;
    let shortest = waiters
        .filter(|&w| !is(w, newcomer))
        .all(|w| presence < w.waiter().entry.presence);
    if !is(first, newcomer) && shortest {
        first.nudge();
    }
}

/// Whether `me` watches its key's holder for this process among `waiters`, and for the first,
/// the shortest presence among those it keeps queued.
pub(crate) fn watching<'a, L: Local<'a>>(
    me: &FairWaiter,
    mut waiters: impl Iterator<Item = L> + Clone,
) -> HolderWatch {
    let keep_within = waiters.clone().map(|w| w.waiter().entry.presence).min();
    match waiters.next() {
        Some(first) if !is(first, me) => HolderWatch::Behind,
        _ => HolderWatch::Holder { keep_within },
    }
}

/// The other fair waiters, when `me` is the first of `waiters` (it keeps them queued); else
/// none.
pub(crate) fn siblings<'a, L: Local<'a>>(
    me: &FairWaiter,
    mut waiters: impl Iterator<Item = L>,
) -> Vec<Sibling> {
    if !waiters.next().is_some_and(|first| is(first, me)) {
        return Vec::new();
    }
    waiters.map(|w| w.waiter().entry.clone()).collect()
}

/// Wakes those of `waiters` whose owner tokens are `tokens` to try again (they are no longer
/// queued).
pub(crate) fn wake<'a, L: Local<'a>>(tokens: &[String], waiters: impl Iterator<Item = L>) {
    for waiter in waiters.filter(|w| tokens.iter().any(|t| **t == *w.waiter().entry.token)) {
        waiter.notify();
    }
}

/// `me` leaves `waiters` (still among them): the next watches the holder (and keeps the others
/// queued) if `me` was the first, and inherits the claim `me` watched, if not yet over, so that
/// it does not go unwatched.
pub(crate) fn leaving<'a, L: Local<'a>>(me: &FairWaiter, waiters: impl Iterator<Item = L>) {
    let mut waiters = waiters.peekable();
    let was_first = waiters.peek().is_some_and(|&first| is(first, me));
    let Some(next) = waiters.find(|&w| !is(w, me)) else {
        return;
    };
    if was_first {
        next.nudge();
    }
    if let Some(until) = me.watch().filter(|&until| until > Instant::now()) {
        next.waiter().inherit_watch(until);
        next.nudge();
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

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::super::message::mac;
    use super::*;

    /// A local fair waiter in a test: the waiter, and counts of its nudges and notifications.
    #[derive(Clone, Copy)]
    struct Test<'a>(&'a FairWaiter, &'a AtomicUsize, &'a AtomicUsize);

    impl<'a> Local<'a> for Test<'a> {
        fn waiter(self) -> &'a FairWaiter {
            self.0
        }
        fn nudge(self) {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
        fn notify(self) {
            self.2.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn waiter(token: &str, presence_s: u64) -> FairWaiter {
        let presence = Duration::from_secs(presence_s);
        FairWaiter::new(token.into(), None, Instant::now(), presence)
    }

    /// Three waiters, oldest first, with their counters.
    struct Three {
        waiters: [FairWaiter; 3],
        nudged: [AtomicUsize; 3],
        notified: [AtomicUsize; 3],
    }

    impl Three {
        fn new(presences: [u64; 3]) -> Self {
            Self {
                waiters: [
                    waiter("a", presences[0]),
                    waiter("b", presences[1]),
                    waiter("c", presences[2]),
                ],
                nudged: Default::default(),
                notified: Default::default(),
            }
        }

        fn local(&self) -> impl Iterator<Item = Test<'_>> + Clone {
            (0..3).map(|i| Test(&self.waiters[i], &self.nudged[i], &self.notified[i]))
        }

        fn nudged(&self) -> [usize; 3] {
            self.nudged.each_ref().map(|n| n.load(Ordering::Relaxed))
        }
    }

    #[test]
    fn the_first_fair_waiter_watches_and_keeps_the_others_queued() {
        let three = Three::new([20, 10, 30]);
        let [a, b, _] = &three.waiters;
        assert!(matches!(
            watching(a, three.local()),
            HolderWatch::Holder { keep_within: Some(d) } if d == Duration::from_secs(10)
        ));
        assert!(matches!(watching(b, three.local()), HolderWatch::Behind));
        let kept: Vec<String> = siblings(a, three.local())
            .iter()
            .map(|s| s.token.to_string())
            .collect();
        assert_eq!(kept, ["b", "c"]);
        assert!(siblings(b, three.local()).is_empty());
    }

    #[test]
    fn a_newcomer_with_a_shorter_presence_wakes_the_first_to_keep_it_in_time() {
        // `c` joined last: shorter than any other, so the first (`a`) looks again.
        let three = Three::new([20, 10, 5]);
        joined(&three.waiters[2], three.local());
        assert_eq!(three.nudged(), [1, 0, 0]);
        let three = Three::new([20, 10, 15]);
        joined(&three.waiters[2], three.local());
        assert_eq!(three.nudged(), [0, 0, 0]);
        // The first joining wakes nobody.
        let three = Three::new([5, 10, 15]);
        joined(&three.waiters[0], three.local().take(1));
        assert_eq!(three.nudged(), [0, 0, 0]);
    }

    #[test]
    fn the_first_leaving_hands_its_duties_to_the_next() {
        let three = Three::new([20, 10, 30]);
        leaving(&three.waiters[0], three.local());
        assert_eq!(three.nudged(), [0, 1, 0], "the next watches the holder now");
        let three = Three::new([20, 10, 30]);
        leaving(&three.waiters[1], three.local());
        assert_eq!(
            three.nudged(),
            [0, 0, 0],
            "one behind leaving changes nothing"
        );
        // Its watch goes to the oldest left.
        let three = Three::new([20, 10, 30]);
        let until = Instant::now() + Duration::from_secs(1);
        three.waiters[1].inherit_watch(until);
        leaving(&three.waiters[1], three.local());
        assert_eq!(three.waiters[0].watch(), Some(until));
        assert_eq!(three.nudged(), [1, 0, 0]);
    }

    #[test]
    fn waiters_no_longer_queued_are_woken_to_try_again() {
        let three = Three::new([20, 10, 30]);
        wake(&["c".to_owned(), "x".to_owned()], three.local());
        let notified = three.notified.each_ref().map(|n| n.load(Ordering::Relaxed));
        assert_eq!(notified, [0, 0, 1]);
    }

    #[test]
    fn only_a_hand_off_signed_with_the_latest_secret_reaches_its_waiter() {
        let waiter = FairWaiter::new(
            "w1".into(),
            Some("s1".into()),
            Instant::now(),
            Duration::ZERO,
        );
        let (nudged, notified) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let local = || std::iter::once(Test(&waiter, &nudged, &notified));
        let signed = "w1 7 1 2000";
        let handoff = |mac: String| Handoff::parse(format!("h {signed} {mac}").as_bytes());
        // Forged: the secret is unknown to the sender, or the signed fields were changed.
        deliver("k", handoff("0".repeat(40)).unwrap(), local());
        let altered = Handoff::parse(format!("h w1 9 1 2000 {}", mac("s1", signed)).as_bytes());
        deliver("k", altered.unwrap(), local());
        assert!(waiter.take_handed().is_none());
        waiter.expect_secret(Some("s2".into()));
        // Made before the latest attempt ran: that attempt finds the lock handed over.
        deliver("k", handoff(mac("s1", signed)).unwrap(), local());
        assert!(waiter.take_handed().is_none());
        deliver("k", handoff(mac("s2", signed)).unwrap(), local());
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
}
