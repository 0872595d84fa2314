//! Where one channel (a lock key) stands, as a pure state machine: its local waiters, its
//! subscription on the subscriber connection, and the command in flight for it. No I/O, no
//! clock, no tasks: each method is an event (a waiter joins, asks, leaves; a `SUBSCRIBE` or
//! `UNSUBSCRIBE` is answered, refused or never answered; the connection ends; the server ends
//! the subscription; a message comes) and returns what the hub must do about it (send a
//! command, close the connection, wake the waiters, or nothing). The hub performs that and
//! reports the outcome back.
//!
//! What it guarantees (the model tests below drive it through random sequences of events and
//! check each after every step):
//! - a waiter counts only on a subscription Redis confirmed on the connection that is up now,
//!   never on one being removed (an `UNSUBSCRIBE` out) or made on an older connection;
//! - at most one command is in flight for the channel, so a `SUBSCRIBE` and an `UNSUBSCRIBE`
//!   never cross;
//! - once nobody waits and the commands out are answered (or given up on), nothing stays
//!   subscribed and nothing is in flight: the last waiter's leaving unsubscribes, also when
//!   its `SUBSCRIBE` was still out;
//! - a command on the current connection that got no answer (it may still have been applied)
//!   closes that connection, which drops everything it held;
//! - a refusal makes waiters poll: nothing is subscribed while Redis refuses (the hub's
//!   [`Conditions::refused`]) or for a while after the channel's own `SUBSCRIBE` failed;
//! - a connection or subscription that ended wakes the waiters, and the next one to ask
//!   subscribes anew.
//!
//! One gap, by choice: an `UNSUBSCRIBE` Redis refuses (an ACL without `+unsubscribe`, which
//! the documented ACL has) is taken as done, so the server keeps sending that channel's
//! messages (ignored) until the connection ends; asking again would only be refused again.

use std::collections::VecDeque;
use std::time::Instant;

/// One channel: its waiters (of type `W`, oldest first) and its subscription on the subscriber
/// connection (named by `C`: two values are equal when they name the same connection).
pub(super) struct Channel<W, C> {
    waiters: VecDeque<W>,
    subscription: Subscription<C>,
    /// Redis failed this channel's `SUBSCRIBE` (its slot is moving, say): not tried again
    /// before then.
    retry_after: Option<Instant>,
    /// When the last message (a release or a hand-off) arrived on the channel: a waiter whose
    /// attempt went out before then, and that joined after, may have missed it.
    last_message: Option<Instant>,
}

/// Where the channel's subscription stands, and the command in flight, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subscription<C> {
    /// Not subscribed on the current connection, nothing in flight.
    Unsubscribed,
    /// A `SUBSCRIBE` is out on `on`. `ended`: a push said the subscription ended meanwhile
    /// (the `SUBSCRIBE` was applied, then a cluster slot moved; or the push was an earlier
    /// subscription's, crossing this command), so its answer confirms nothing. `unsure`: the
    /// server may hold the subscription already (after such a push), so a refusal leaves it
    /// [`Held::Unsure`].
    Subscribing { on: C, ended: bool, unsure: bool },
    /// Redis confirmed the subscription on `on` at `since`.
    Subscribed { on: C, since: Instant },
    /// An `UNSUBSCRIBE` is out on `on`: nobody may count on the subscription any more.
    Unsubscribing { on: C },
}

/// What the server may hold for the channel on the current connection once a command is
/// answered: what to send next depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    No,
    /// Maybe, maybe not: nobody counts on it, and it is made again or removed to be sure.
    Unsure,
    /// Confirmed: [`Subscription::Subscribed`].
    Yes,
}

/// What the hub knows beyond the channel when an event happens.
#[derive(Debug, Clone)]
pub(super) struct Conditions<C> {
    /// The subscriber connection that is up, if one is.
    pub(super) connection: Option<C>,
    /// Redis refused a `SUBSCRIBE` a moment ago (no channel rights): nothing is subscribed.
    pub(super) refused: bool,
    pub(super) now: Instant,
}

/// A command for the hub to send on connection `on`, and then to report with
/// [`Channel::answered`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Command<C> {
    pub(super) kind: Kind,
    pub(super) on: C,
}

/// `SUBSCRIBE` or `UNSUBSCRIBE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Subscribe,
    Unsubscribe,
}

/// What the hub does after an event.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Action<C> {
    Nothing,
    Send(Command<C>),
    /// Close connection `on`: a command on it went unanswered, so it may hold anything.
    Close(C),
}

/// Whether the channel's waiters must be woken (to try again: what they counted on is gone).
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Wake {
    Nobody,
    All,
}

/// What a waiter that asks for the subscription does next.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Request<C> {
    /// Notifications arrive, since then.
    Subscribed(Instant),
    /// Wait for the command in flight to be answered.
    Wait,
    /// Send this command (the hub does), then wait for its answer.
    Send(Command<C>),
    /// Not now (Redis refused, the `SUBSCRIBE` failed a moment ago, or no connection): poll.
    Poll,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Redis confirmed it.
    Done,
    /// Redis refused it for want of rights (`NOPERM`): the hub says so in
    /// [`Conditions::refused`] for a while.
    Refused,
    /// Redis failed it otherwise (a cluster slot moving, say): no `SUBSCRIBE` before
    /// `retry_after`.
    Failed { retry_after: Instant },
    /// No answer in time, a broken connection, or the task sending it went away: it may still
    /// have been applied.
    Unanswered,
}

impl<W, C: Clone + PartialEq> Default for Channel<W, C> {
    fn default() -> Self {
        Self {
            waiters: VecDeque::new(),
            subscription: Subscription::Unsubscribed,
            retry_after: None,
            last_message: None,
        }
    }
}

impl<W, C: Clone + PartialEq> Channel<W, C> {
    /// The waiters, oldest first.
    pub(super) fn waiters(&self) -> std::collections::vec_deque::Iter<'_, W> {
        self.waiters.iter()
    }

    /// Whether the channel can be forgotten: nobody waits, nothing is subscribed or in flight.
    pub(super) fn idle(&self) -> bool {
        self.waiters.is_empty() && self.subscription == Subscription::Unsubscribed
    }

    /// Since when notifications reach this process over `connection` (the one up now), if
    /// they do.
    pub(super) fn subscribed_since(&self, connection: Option<&C>) -> Option<Instant> {
        match &self.subscription {
            Subscription::Subscribed { on, since } if Some(on) == connection => Some(*since),
            _ => None,
        }
    }

    /// Whether a message came at or after `sent` but before `joined`.
    pub(super) fn message_since(&self, sent: Instant, joined: Instant) -> bool {
        self.last_message
            .is_some_and(|at| (sent..joined).contains(&at))
    }

    /// A message came on the channel at `at`.
    pub(super) fn message(&mut self, at: Instant) {
        self.last_message = Some(at);
    }

    /// A waiter joins (last in line). It asks for the subscription with
    /// [`request`](Self::request) when it needs it.
    pub(super) fn join(&mut self, waiter: W) {
        self.waiters.push_back(waiter);
    }

    /// A waiter asks to be notified: says whether it can count on that, and what to do.
    pub(super) fn request(&mut self, at: &Conditions<C>) -> Request<C> {
        if let Some(since) = self.subscribed_since(at.connection.as_ref()) {
            return Request::Subscribed(since);
        }
        if at.refused || self.failed(at.now) || at.connection.is_none() {
            return Request::Poll;
        }
        if self.in_flight().is_some() {
            return Request::Wait;
        }
        match self.next(at) {
            Action::Send(command) => Request::Send(command),
            // Nobody waits (so nobody asked), or nothing to send.
            Action::Nothing | Action::Close(_) => Request::Poll,
        }
    }

    /// The waiters for which `leaving` holds leave; the last one to go unsubscribes (once the
    /// command in flight, if any, is answered).
    pub(super) fn leave(&mut self, leaving: impl Fn(&W) -> bool, at: &Conditions<C>) -> Action<C> {
        self.waiters.retain(|waiter| !leaving(waiter));
        if self.waiters.is_empty() && self.in_flight().is_none() {
            self.next(at)
        } else {
            Action::Nothing
        }
    }

    /// The command in flight ended with `outcome`: what to do next.
    pub(super) fn answered(&mut self, outcome: Outcome, at: &Conditions<C>) -> Action<C> {
        let (on, subscribe, ended, unsure) =
            match std::mem::replace(&mut self.subscription, Subscription::Unsubscribed) {
                Subscription::Subscribing { on, ended, unsure } => (on, true, ended, unsure),
                Subscription::Unsubscribing { on } => (on, false, false, false),
                // Nothing was in flight: nothing to answer.
                settled => {
                    self.subscription = settled;
                    return Action::Nothing;
                }
            };
        if let Outcome::Failed { retry_after } = outcome {
            self.retry_after = Some(retry_after);
        }
        if at.connection.as_ref() != Some(&on) {
            // Its connection is gone, and everything it held with it.
            return self.settle(Held::No, at);
        }
        let held = match outcome {
            // It may have been applied: only closing the connection makes sure of what it
            // holds (nothing).
            Outcome::Unanswered => return Action::Close(on),
            Outcome::Done if subscribe && !ended => {
                self.subscription = Subscription::Subscribed { on, since: at.now };
                Held::Yes
            }
            Outcome::Done if subscribe => Held::Unsure,
            Outcome::Refused | Outcome::Failed { .. } if subscribe && unsure => Held::Unsure,
            // Done, or not applied; an UNSUBSCRIBE refused is taken as done (asking again
            // would be refused again).
            Outcome::Done | Outcome::Refused | Outcome::Failed { .. } => Held::No,
        };
        self.settle(held, at)
    }

    /// Connection `on` ended (lost, or closed by the hub): what was subscribed on it is gone.
    /// A command out on it stays in flight until answered (its answer confirms nothing).
    pub(super) fn lost(&mut self, on: &C) -> Wake {
        if matches!(&self.subscription, Subscription::Subscribed { on: at, .. } if at == on) {
            self.subscription = Subscription::Unsubscribed;
        }
        self.wake_all()
    }

    /// The server ended the subscription (its cluster slot moved): the waiters ask again, and
    /// subscribe where the key lives now.
    pub(super) fn ended(&mut self) -> Wake {
        match &mut self.subscription {
            Subscription::Subscribed { .. } => self.subscription = Subscription::Unsubscribed,
            Subscription::Subscribing { ended, .. } => *ended = true,
            Subscription::Unsubscribed | Subscription::Unsubscribing { .. } => {}
        }
        self.wake_all()
    }

    fn wake_all(&self) -> Wake {
        if self.waiters.is_empty() {
            Wake::Nobody
        } else {
            Wake::All
        }
    }

    fn failed(&self, now: Instant) -> bool {
        self.retry_after.is_some_and(|until| now < until)
    }

    /// The connection a command is out on, if one is.
    fn in_flight(&self) -> Option<&C> {
        match &self.subscription {
            Subscription::Subscribing { on, .. } | Subscription::Unsubscribing { on } => Some(on),
            Subscription::Unsubscribed | Subscription::Subscribed { .. } => None,
        }
    }

    /// Whether the channel should be subscribed: someone waits, and Redis lets it.
    fn wanted(&self, at: &Conditions<C>) -> bool {
        !self.waiters.is_empty() && !at.refused && !self.failed(at.now)
    }

    /// With nothing in flight: the command that makes the subscription match whether it is
    /// [wanted](Self::wanted), if one is needed.
    fn next(&mut self, at: &Conditions<C>) -> Action<C> {
        let held = self.subscribed_since(at.connection.as_ref());
        self.settle(held.map_or(Held::No, |_| Held::Yes), at)
    }

    /// With nothing in flight and `held` on the current connection: the command that makes
    /// the subscription match whether it is [wanted](Self::wanted), if one is needed.
    fn settle(&mut self, held: Held, at: &Conditions<C>) -> Action<C> {
        if held != Held::Yes {
            // Made on a connection that is gone, if at all.
            self.subscription = Subscription::Unsubscribed;
        }
        let Some(on) = at.connection.clone() else {
            return Action::Nothing;
        };
        match (self.wanted(at), held) {
            (true, Held::Yes) | (false, Held::No) => Action::Nothing,
            (true, Held::No | Held::Unsure) => self.send(Kind::Subscribe, on, held),
            (false, Held::Yes | Held::Unsure) => self.send(Kind::Unsubscribe, on, held),
        }
    }

    /// Puts `kind` in flight on `on`, where the server holds `held`.
    fn send(&mut self, kind: Kind, on: C, held: Held) -> Action<C> {
        self.subscription = match kind {
            Kind::Subscribe => Subscription::Subscribing {
                on: on.clone(),
                ended: false,
                unsure: held == Held::Unsure,
            },
            // From now on no waiter may count on it: a release may go unheard as soon as the
            // server applies the UNSUBSCRIBE.
            Kind::Unsubscribe => Subscription::Unsubscribing { on: on.clone() },
        };
        Action::Send(Command { kind, on })
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::time::Duration;

    use super::*;

    /// How long the hub polls after a refusal, and after a failed `SUBSCRIBE`.
    const REFUSED_FOR: Duration = Duration::from_secs(30);
    const RETRY_AFTER: Duration = Duration::from_secs(1);

    /// What the server holds for the channel on the current connection (the model's own
    /// record, apart from the channel's [`Held`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Holds {
        No,
        Yes,
        /// A command out may or may not have been applied yet.
        Maybe,
    }

    /// A command out, as the server sees it.
    #[derive(Debug)]
    struct Out {
        command: Command<u64>,
        /// What the server held before it.
        before: Holds,
        /// The server ended the subscription the `SUBSCRIBE` made before its answer came.
        ended: bool,
    }

    /// One event of a sequence.
    #[derive(Debug, Clone, Copy)]
    enum Event {
        Join,
        /// The waiter at this place (modulo their number) leaves.
        Leave(usize),
        /// A waiter asks for the subscription.
        Ask,
        /// The command out ends so.
        Answer(Answered),
        /// The hub opens a connection (when none is up).
        Connect,
        /// The connection ends.
        Lose,
        /// The server ends the subscription it holds.
        End,
        /// A push saying a subscription ended that is not this one's end: one that crossed a
        /// command (an earlier subscription's), or came when the server holds nothing.
        StrayEnd,
        /// Time passes (milliseconds).
        Tick(u64),
    }

    #[derive(Debug, Clone, Copy)]
    enum Answered {
        Done,
        Refused,
        Failed,
        Unanswered,
    }

    /// One channel in a world of its own: the hub around it (the connection, Redis's refusal),
    /// and the server (what it holds, which command is out), kept apart from what the channel
    /// believes, so each step can be checked against it.
    struct World {
        channel: Channel<u32, u64>,
        now: Instant,
        connection: Option<u64>,
        opened: u64,
        refused_until: Option<Instant>,
        retry_after: Option<Instant>,
        waiters: Vec<u32>,
        joined: u32,
        held: Holds,
        /// The subscription Redis confirmed on the current connection and since when, with
        /// nothing sent or happened since that could have ended it.
        confirmed: Option<(u64, Instant)>,
        out: Option<Out>,
        /// Redis refused an `UNSUBSCRIBE` on the current connection: the server keeps the
        /// subscription, which the channel takes as gone (the hub cannot do better short of
        /// closing the connection).
        kept: bool,
        log: String,
    }

    impl World {
        fn new(header: String) -> Self {
            Self {
                channel: Channel::default(),
                now: Instant::now(),
                connection: None,
                opened: 0,
                refused_until: None,
                retry_after: None,
                waiters: Vec::new(),
                joined: 0,
                held: Holds::No,
                confirmed: None,
                out: None,
                kept: false,
                log: header,
            }
        }

        fn at(&self) -> Conditions<u64> {
            Conditions {
                connection: self.connection,
                refused: self.refused_until.is_some_and(|until| self.now < until),
                now: self.now,
            }
        }

        fn failed(&self) -> bool {
            self.retry_after.is_some_and(|until| self.now < until)
        }

        /// Fails with the sequence so far.
        #[track_caller]
        fn check(&self, ok: bool, what: &str) {
            assert!(
                ok,
                "{what}\nchannel: {:?}, server: {:?}, confirmed: {:?}, out: {:?}, connection: {:?}, waiters: {:?}\nevents:{}",
                self.channel.subscription,
                self.held,
                self.confirmed,
                self.out,
                self.connection,
                self.waiters,
                self.log
            );
        }

        fn step(&mut self, event: Event) {
            let _ = write!(self.log, "\n  {event:?}");
            match event {
                Event::Join => {
                    self.joined += 1;
                    self.channel.join(self.joined);
                    self.waiters.push(self.joined);
                }
                Event::Leave(_) if self.waiters.is_empty() => {}
                Event::Leave(place) => {
                    let gone = self.waiters.remove(place % self.waiters.len());
                    let action = self.channel.leave(|&w| w == gone, &self.at());
                    self.perform(action);
                }
                Event::Ask if self.waiters.is_empty() => {}
                Event::Ask => self.ask(),
                Event::Answer(answered) => self.answer(answered),
                Event::Connect if self.connection.is_none() => {
                    self.opened += 1;
                    self.connection = Some(self.opened);
                }
                Event::Connect => {}
                Event::Lose => {
                    if let Some(on) = self.connection {
                        self.lose(on);
                    }
                }
                Event::End if self.held == Holds::No => {}
                Event::End => {
                    self.held = Holds::No;
                    self.confirmed = None;
                    if let Some(out) = self.out.as_mut().filter(|out| {
                        out.command.kind == Kind::Subscribe
                            && Some(out.command.on) == self.connection
                    }) {
                        out.ended = true;
                    }
                    let wake = self.channel.ended();
                    self.check_wake(wake, "the end of a subscription");
                }
                Event::StrayEnd if self.out.is_none() && self.held != Holds::No => {}
                Event::StrayEnd => {
                    let wake = self.channel.ended();
                    self.check_wake(wake, "a stray end of a subscription");
                }
                Event::Tick(ms) => self.now += Duration::from_millis(ms),
            }
            self.check_invariants();
        }

        fn ask(&mut self) {
            let at = self.at();
            match self.channel.request(&at) {
                Request::Subscribed(since) => {
                    let confirmed = self
                        .confirmed
                        .filter(|&(on, at)| Some(on) == self.connection && at <= since);
                    self.check(
                        confirmed.is_some() && self.held == Holds::Yes,
                        "a waiter was told to count on a subscription not confirmed on the current connection",
                    );
                }
                Request::Wait => self.check(
                    self.out.is_some(),
                    "a waiter was told to wait while nothing is in flight",
                ),
                Request::Send(command) => self.perform(Action::Send(command)),
                Request::Poll => self.check(
                    at.refused || self.failed() || self.connection.is_none(),
                    "a waiter was told to poll for no reason",
                ),
            }
        }

        fn answer(&mut self, answered: Answered) {
            let Some(out) = self.out.take() else {
                return;
            };
            let current = Some(out.command.on) == self.connection;
            let subscribe = out.command.kind == Kind::Subscribe;
            let outcome = match answered {
                Answered::Done => Outcome::Done,
                Answered::Refused => {
                    self.refused_until = Some(self.now + REFUSED_FOR);
                    Outcome::Refused
                }
                Answered::Failed => {
                    let retry_after = self.now + RETRY_AFTER;
                    self.retry_after = Some(retry_after);
                    Outcome::Failed { retry_after }
                }
                Answered::Unanswered => Outcome::Unanswered,
            };
            if current {
                match outcome {
                    Outcome::Done if subscribe && !out.ended => {
                        self.held = Holds::Yes;
                        self.confirmed = Some((out.command.on, self.now));
                    }
                    Outcome::Done => self.held = Holds::No,
                    Outcome::Refused | Outcome::Failed { .. } => {
                        self.held = if out.ended { Holds::No } else { out.before };
                        self.kept |= !subscribe && self.held == Holds::Yes;
                    }
                    Outcome::Unanswered => {}
                }
            }
            let action = self.channel.answered(outcome, &self.at());
            if current && outcome == Outcome::Unanswered {
                self.check(
                    action == Action::Close(out.command.on),
                    "an unanswered command did not close its connection",
                );
            }
            self.perform(action);
        }

        fn lose(&mut self, on: u64) {
            self.connection = None;
            self.held = Holds::No;
            self.confirmed = None;
            self.kept = false;
            let wake = self.channel.lost(&on);
            self.check_wake(wake, "a lost connection");
        }

        fn check_wake(&self, wake: Wake, what: &str) {
            let expected = if self.waiters.is_empty() {
                Wake::Nobody
            } else {
                Wake::All
            };
            self.check(wake == expected, &format!("{what} woke {wake:?}"));
        }

        fn perform(&mut self, action: Action<u64>) {
            match action {
                Action::Nothing => {}
                Action::Send(command) => {
                    self.check(self.out.is_none(), "two commands in flight for one channel");
                    self.check(
                        Some(command.on) == self.connection,
                        "a command for a connection that is not up",
                    );
                    let before = self.held;
                    match command.kind {
                        Kind::Subscribe => {
                            self.check(
                                !self.waiters.is_empty() && !self.at().refused && !self.failed(),
                                "a SUBSCRIBE with nobody waiting, or while Redis refuses",
                            );
                            if self.held == Holds::No {
                                self.held = Holds::Maybe;
                            }
                        }
                        Kind::Unsubscribe => {
                            self.confirmed = None;
                            if self.held == Holds::Yes {
                                self.held = Holds::Maybe;
                            }
                        }
                    }
                    self.out = Some(Out {
                        command,
                        before,
                        ended: false,
                    });
                }
                Action::Close(on) => {
                    self.check(
                        Some(on) == self.connection,
                        "closing a connection that is not up",
                    );
                    self.lose(on);
                }
            }
        }

        fn check_invariants(&self) {
            self.check(
                self.channel.in_flight() == self.out.as_ref().map(|out| &out.command.on),
                "the channel's command in flight is not the one out",
            );
            self.check(
                self.channel.waiters().eq(self.waiters.iter()),
                "the channel's waiters are not the ones waiting",
            );
            if let Subscription::Subscribed { on, since } = &self.channel.subscription {
                self.check(
                    Some(*on) == self.connection,
                    "a subscription made on an older connection still stands",
                );
                let confirmed = self
                    .confirmed
                    .filter(|&(at_on, at)| at_on == *on && at <= *since);
                self.check(
                    confirmed.is_some() && self.held == Holds::Yes,
                    "the channel counts on a subscription Redis did not confirm, or that is being removed",
                );
            }
            if self.waiters.is_empty() && self.out.is_none() {
                self.check(
                    self.channel.idle(),
                    "nobody waits and nothing is out, yet the channel is not idle",
                );
                self.check(
                    self.connection.is_none() || self.held == Holds::No || self.kept,
                    "nobody waits and nothing is out, yet the server holds the subscription",
                );
            }
        }

        /// Everybody leaves and every command out is answered: nothing may stay behind.
        fn drain(&mut self, rng: &mut fastrand::Rng) {
            while !self.waiters.is_empty() {
                self.step(Event::Leave(0));
            }
            for _ in 0..4 {
                if self.out.is_none() {
                    break;
                }
                self.step(Event::Answer(answered(rng)));
            }
            self.check(
                self.out.is_none(),
                "commands still out after everybody left",
            );
            self.check(
                self.channel.idle(),
                "the channel is not idle after everybody left",
            );
        }
    }

    fn answered(rng: &mut fastrand::Rng) -> Answered {
        match rng.u32(0..100) {
            0..70 => Answered::Done,
            70..75 => Answered::Refused,
            75..85 => Answered::Failed,
            _ => Answered::Unanswered,
        }
    }

    fn event(rng: &mut fastrand::Rng) -> Event {
        match rng.u32(0..100) {
            0..15 => Event::Join,
            15..27 => Event::Leave(rng.usize(0..8)),
            27..47 => Event::Ask,
            47..72 => Event::Answer(answered(rng)),
            72..80 => Event::Connect,
            80..84 => Event::Lose,
            84..88 => Event::End,
            88..92 => Event::StrayEnd,
            _ => Event::Tick(rng.u64(0..2_500)),
        }
    }

    #[test]
    fn random_sequences_keep_every_invariant() {
        for seed in 0..3_000 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut world = World::new(format!("seed {seed}:"));
            for _ in 0..120 {
                world.step(event(&mut rng));
            }
            world.drain(&mut rng);
        }
    }

    /// A world with a connection up and one waiter that asked: its `SUBSCRIBE` is out.
    fn subscribing() -> World {
        let mut world = World::new("by hand:".to_owned());
        world.step(Event::Connect);
        world.step(Event::Join);
        world.step(Event::Ask);
        assert!(world.out.is_some());
        world
    }

    #[test]
    fn a_waiter_leaving_while_its_subscribe_is_out_is_unsubscribed_once_it_is_answered() {
        let mut world = subscribing();
        world.step(Event::Leave(0));
        // Nothing more until the SUBSCRIBE is answered: the two must not cross.
        assert!(world
            .out
            .as_ref()
            .is_some_and(|o| o.command.kind == Kind::Subscribe));
        world.step(Event::Answer(Answered::Done));
        let out = world.out.as_ref().map(|o| o.command.clone());
        assert_eq!(
            out,
            Some(Command {
                kind: Kind::Unsubscribe,
                on: 1
            })
        );
        assert_eq!(world.channel.subscribed_since(Some(&1)), None);
        world.step(Event::Answer(Answered::Done));
        assert!(world.channel.idle());
        assert_eq!(world.held, Holds::No);
    }

    #[test]
    fn a_waiter_joining_while_an_unsubscribe_is_out_waits_for_it_then_subscribes_again() {
        let mut world = subscribing();
        world.step(Event::Answer(Answered::Done));
        world.step(Event::Leave(0));
        assert!(world
            .out
            .as_ref()
            .is_some_and(|o| o.command.kind == Kind::Unsubscribe));
        world.step(Event::Join);
        assert_eq!(world.channel.request(&world.at()), Request::Wait);
        world.step(Event::Answer(Answered::Done));
        // The answer itself sends the SUBSCRIBE: the waiter only watches.
        assert!(world
            .out
            .as_ref()
            .is_some_and(|o| o.command.kind == Kind::Subscribe));
        world.step(Event::Tick(5));
        world.step(Event::Answer(Answered::Done));
        assert_eq!(
            world.channel.request(&world.at()),
            Request::Subscribed(world.now)
        );
    }

    #[test]
    fn an_answer_that_comes_after_its_connection_was_replaced_confirms_nothing() {
        let mut world = subscribing();
        world.step(Event::Lose);
        world.step(Event::Connect);
        // Still out on the old connection: no second command beside it.
        assert_eq!(world.channel.request(&world.at()), Request::Wait);
        world.step(Event::Answer(Answered::Done));
        assert_eq!(world.channel.subscribed_since(Some(&1)), None);
        assert_eq!(world.channel.subscribed_since(Some(&2)), None);
        // Made again on the new one, for the waiter still there.
        let out = world.out.as_ref().map(|o| o.command.clone());
        assert_eq!(
            out,
            Some(Command {
                kind: Kind::Subscribe,
                on: 2
            })
        );
        // And an unanswered command on the old connection closes nothing.
        world.step(Event::Lose);
        world.step(Event::Connect);
        world.step(Event::Answer(Answered::Unanswered));
        assert_eq!(world.connection, Some(3));
    }

    #[test]
    fn a_subscription_the_server_ended_before_its_subscribe_was_answered_is_not_counted() {
        let mut world = subscribing();
        world.step(Event::End);
        world.step(Event::Answer(Answered::Done));
        assert_eq!(world.channel.subscribed_since(Some(&1)), None);
        // Subscribed anew at once: the waiter is still there.
        assert!(world
            .out
            .as_ref()
            .is_some_and(|o| o.command.kind == Kind::Subscribe));
    }

    #[test]
    fn a_push_that_crossed_a_subscribe_whose_waiter_left_is_followed_by_an_unsubscribe() {
        let mut world = subscribing();
        // Say, the push of an earlier UNSUBSCRIBE, handled after this SUBSCRIBE went out.
        world.step(Event::StrayEnd);
        world.step(Event::Leave(0));
        world.step(Event::Answer(Answered::Done));
        // The server may hold it (it does here): nobody counts on it, and it is removed.
        assert_eq!(world.channel.subscribed_since(Some(&1)), None);
        assert!(world
            .out
            .as_ref()
            .is_some_and(|o| o.command.kind == Kind::Unsubscribe));
        world.step(Event::Answer(Answered::Done));
        assert!(world.channel.idle());
        assert_eq!(world.held, Holds::No);
    }

    #[test]
    fn an_unanswered_command_closes_its_connection_and_wakes_the_waiters() {
        let mut world = subscribing();
        let action = world.channel.answered(Outcome::Unanswered, &world.at());
        assert_eq!(action, Action::Close(1));
        assert_eq!(world.channel.lost(&1), Wake::All);
    }

    #[test]
    fn a_refused_subscribe_makes_waiters_poll_until_the_refusal_passes() {
        let mut world = subscribing();
        world.step(Event::Answer(Answered::Refused));
        assert!(world.out.is_none());
        assert_eq!(world.channel.request(&world.at()), Request::Poll);
        world.step(Event::Tick(REFUSED_FOR.as_millis() as u64));
        world.step(Event::Ask);
        assert!(world
            .out
            .as_ref()
            .is_some_and(|o| o.command.kind == Kind::Subscribe));
    }
}
