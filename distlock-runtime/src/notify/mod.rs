//! Release notifications: the release script `PUBLISH`es (`SPUBLISH` on a cluster) on each
//! lock key it deletes (the channel is the key's name), and one subscriber connection per
//! manager (opened through the deployment's [`Subscribe`], over RESP3) hands each notification to one
//! local waiter of that key, oldest first, from the connection's own push handler (no task in
//! between, so a hand-off reaches its waiter with one wake-up). A release that hands the lock to
//! a fair waiter publishes a hand-off message instead, which `fair/` routes (to its recipient,
//! and to the waiters that watch its claim). This module knows no fair rule: which fair waiter
//! watches the holder, keeps the others queued or inherits a watch is decided by `fair/`, over
//! the key's local fair waiters ([`FairWaiters`]) it is given.
//!
//! A waiter takes a [`Ticket`] (its place in the key's queue) and makes sure the manager is
//! subscribed to the key before its next attempt, so a release between an attempt and the
//! subscription cannot be missed (nor one before a subscription that another waiter made after
//! this waiter's attempt went out: [`Ticket::subscribed_since`] tells, nor one announced after
//! the attempt went out but before the waiter joined: [`Ticket::message_since`] tells). A
//! subscription is shared by all local waiters of a key and dropped with the last of them.
//!
//! **Never past a waiter's deadline.** No waiter connects or subscribes itself: the subscriber
//! connection is opened by one background task for all waiters, and each key's `SUBSCRIBE` /
//! `UNSUBSCRIBE` is sent by a background task (one at a time per key, so the two cannot cross),
//! while waiters only watch for the outcome until their own deadline. A waiter that gives up
//! leaves the work to finish without it.
//!
//! **No leaked subscriptions.** A key whose last waiter left is unsubscribed, also when its
//! `SUBSCRIBE` was still out. A `SUBSCRIBE` or `UNSUBSCRIBE` that gets no answer within the
//! connect and response timeouts (on a cluster it may open its node's connection first; it may
//! still have been applied) closes the subscriber connection, which drops every subscription it
//! held on the server; the next waiter connects anew.
//!
//! **Failovers.** A subscription the server ends (a cluster slot moved) wakes the key's waiters
//! and is made again where the key lives now; a subscriber connection that ends (a node lost, a
//! Sentinel switch) wakes every waiter, and the next one opens a new connection.
//!
//! **Fallbacks.** While there is no subscriber connection, or Redis refuses `SUBSCRIBE` (an ACL
//! user without channel rights), waiters poll with backoff (see `wait.rs`). When the subscriber
//! connection breaks, every waiter is woken to try again. A lost notification costs latency
//! (waiters also wake at the holder's expiry), never a hang.
//!
//! **Forced releases.** A forced release (`LockManager::force_release`) also `PUBLISH`es the
//! tokens of the holders it freed on one channel per key prefix (see `forced.rs`), which a
//! cluster carries to every node. While a manager holds leases, its renewal driver keeps that
//! channel subscribed ([`Forced::listen`]) and ends each lease named there at once.
//!
//! Where each key stands (its waiters, its subscription, the command in flight) is a pure state
//! machine, [`channel::Channel`]: every event goes to it, and this module does what it decides
//! (sends the command, closes the connection, wakes the waiters).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fair::{self, FairWaiter, Handoff};
use crate::sync::lock;
use crate::topology::Timeouts;
use crate::topology::{Channels, Ended, Message, OnMessage, Scope, Subscribe};

mod channel;

use channel::{Action, Command, Conditions, Kind, Outcome, Request, Wake};

/// The notification side of one manager: dropped with the manager, it closes the subscriber
/// connection.
pub(crate) struct Notifications {
    hub: Arc<Hub>,
}

impl Drop for Notifications {
    fn drop(&mut self) {
        self.hub.closed.cancel();
    }
}

struct Hub {
    subscriber: Arc<dyn Subscribe>,
    timeouts: Timeouts,
    /// The channel of the manager's prefix that forced releases are told on.
    forced: String,
    state: Mutex<State>,
    /// Notified (all waiters) whenever the connection or a subscription changes.
    changed: Notify,
    /// Cancelled when the manager (and so this hub) is dropped: closes the subscriber connection.
    closed: CancellationToken,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// After a failed connect, how long waiters poll before the subscriber connection is tried again.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// How often an open subscriber connection is checked with a `PING`: a connection whose
/// server hangs, or whose network path broke without closing it, would otherwise go unnoticed
/// while every release it should carry is lost (waiters would wake only at holders' expiries).
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// After Redis refused a `SUBSCRIBE` (no channel rights), how long waiters poll before one is
/// tried again.
const REFUSED_FOR: Duration = Duration::from_secs(30);

/// A key's state: its waiters, each subscribed on a [`Link`].
type Channel = channel::Channel<Arc<Slot>, Arc<Link>>;

#[derive(Default)]
struct State {
    connection: Connection,
    /// Counts connections opened: names each [`Link`].
    opened: u64,
    channels: HashMap<String, Channel>,
    /// Redis refused a `SUBSCRIBE` (ACL): waiters poll until then.
    refused_until: Option<Instant>,
    /// Redis refused the `SUBSCRIBE` of the forced-release channel, which alone is not tried
    /// again for a while (said once).
    forced_refused: bool,
}

impl State {
    /// What the channels need to know of the rest at `now`.
    fn conditions(&self, now: Instant) -> Conditions<Arc<Link>> {
        Conditions {
            connection: match &self.connection {
                Connection::Up(link) => Some(Arc::clone(link)),
                _ => None,
            },
            refused: self.refused_until.is_some_and(|until| now < until),
            now: now.into_std(),
        }
    }
}

/// The subscriber connection.
#[derive(Default)]
enum Connection {
    /// None; a waiter starts connecting once `retry_after` (if any) has passed.
    #[default]
    Down,
    /// A connect failed: none is tried again before then.
    Failed {
        retry_after: Instant,
    },
    /// The background task is connecting.
    Connecting,
    Up(Arc<Link>),
}

/// An open subscriber connection; a subscription made on an older one is gone.
struct Link {
    /// Which connection this is (they are counted).
    id: u64,
    sink: Arc<dyn Channels>,
    /// Ends the connection, and with it every subscription it holds.
    close: CancellationToken,
    /// When it was opened.
    since: Instant,
}

impl PartialEq for Link {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

/// One waiting caller.
struct Slot {
    wake: Notify,
    /// A plain notification was handed to this waiter and not yet taken.
    woken: AtomicBool,
    role: Role,
}

/// What a ticket's holder is to its key's notifications.
enum Role {
    /// A plain waiter: each release announcement wakes one, oldest first.
    Waiter,
    /// A fair waiter: as a plain one, and what it keeps for hand-offs, which `fair/` routes.
    Fair(Box<FairWaiter>),
    /// An observer (an election's watch), not a waiter: woken by every message on the key,
    /// it never takes a notification meant for a waiter. A listener is also handed each
    /// message's payload.
    Observer(Option<Listener>),
}

/// Takes the payload of each message on a channel, on the subscriber connection's own task
/// (see [`OnMessage`]): it must not block.
pub(crate) type Listener = Arc<dyn Fn(&[u8]) + Send + Sync>;

impl Slot {
    fn fair(&self) -> Option<&FairWaiter> {
        match &self.role {
            Role::Fair(fair) => Some(fair),
            _ => None,
        }
    }

    /// Hands it a notification to take: it tries again.
    fn notify(&self) {
        self.woken.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

/// A fair waiter of a key in this process, for the rules of `fair/`.
#[derive(Clone, Copy)]
pub(crate) struct LocalFair<'a> {
    waiter: &'a FairWaiter,
    slot: &'a Slot,
}

impl<'a> fair::Local<'a> for LocalFair<'a> {
    fn waiter(self) -> &'a FairWaiter {
        self.waiter
    }

    fn nudge(self) {
        self.slot.wake.notify_one();
    }

    fn notify(self) {
        self.slot.notify();
    }
}

/// The fair waiters of a key in this process, oldest first.
#[derive(Clone)]
pub(crate) struct FairWaiters<'a>(std::collections::vec_deque::Iter<'a, Arc<Slot>>);

impl<'a> Iterator for FairWaiters<'a> {
    type Item = LocalFair<'a>;

    fn next(&mut self) -> Option<LocalFair<'a>> {
        self.0.by_ref().find_map(|slot| {
            Some(LocalFair {
                waiter: slot.fair()?,
                slot,
            })
        })
    }
}

/// A waiter's place in a key's queue; leaving it (drop) passes on a notification it did not
/// take and unsubscribes with the last waiter.
pub(crate) struct Ticket {
    hub: Arc<Hub>,
    channel: String,
    slot: Arc<Slot>,
    /// When this waiter joined the key's waiters: messages after it reach it.
    joined: Instant,
    /// This waiter took a release announcement and has not yet done what it owes the waiters
    /// behind it: an attempt that takes the key, or marks its new holder as waited on (see
    /// `scripts/mod.rs`). Until then, leaving passes the announcement on, as an unused one is.
    owed: AtomicBool,
}

impl Notifications {
    /// Notifications through `subscriber`, for the locks under `prefix`.
    pub(crate) fn new(subscriber: Arc<dyn Subscribe>, timeouts: Timeouts, prefix: &str) -> Self {
        Self {
            hub: Arc::new(Hub {
                subscriber,
                timeouts,
                forced: crate::forced::channel(prefix),
                state: Mutex::new(State::default()),
                changed: Notify::new(),
                closed: CancellationToken::new(),
            }),
        }
    }

    /// Joins the queue of waiters for the lock key `channel`, until `deadline`; a fair waiter
    /// gives its owner `token` and how long its queue entry lasts once kept (`presence`), and
    /// its latest attempt's `secret`, so hand-off messages naming it (and showing the secret)
    /// reach it.
    pub(crate) fn enqueue(
        &self,
        channel: &str,
        fair: Option<(Arc<str>, Duration)>,
        secret: Option<Arc<str>>,
        deadline: Instant,
    ) -> Ticket {
        let role = fair.map_or(Role::Waiter, |(token, presence)| {
            Role::Fair(Box::new(FairWaiter::new(token, secret, deadline, presence)))
        });
        self.join(channel, role)
    }

    /// Starts observing the lock key `channel`: the ticket keeps the key subscribed, and is
    /// woken by every message on it (a release, a hand-off), while the key's waiters still
    /// get every notification as if it were not there.
    pub(crate) fn observe(&self, channel: &str) -> Ticket {
        self.join(channel, Role::Observer(None))
    }

    /// A handle on the forced-release notices of this manager, which does not keep it alive.
    pub(crate) fn forced(&self) -> Forced {
        Forced {
            hub: Arc::downgrade(&self.hub),
        }
    }

    /// Joins the waiters of `channel` (last in line) as `role`.
    fn join(&self, channel: &str, role: Role) -> Ticket {
        join(&self.hub, channel, role)
    }

    /// Whether notifications for the lock key `channel` reach this manager now.
    pub(crate) fn subscribed(&self, channel: &str) -> bool {
        self.hub.subscribed_since(channel).is_some()
    }
}

/// The forced-release notices of one manager, for its renewal driver (which knows its leases).
pub(crate) struct Forced {
    hub: Weak<Hub>,
}

impl Forced {
    /// Keeps the manager's forced-release channel subscribed while the returned
    /// [`Listening`] lives (from a task of its own, so no lock request ever waits for it), and
    /// hands each notice's payload to `on_notice`. `None` once the manager is gone.
    pub(crate) fn listen(&self, on_notice: Listener) -> Option<Listening> {
        let hub = self.hub.upgrade()?;
        let closed = hub.closed.clone();
        let ticket = join(&hub, &hub.forced.clone(), Role::Observer(Some(on_notice)));
        drop(hub);
        let task = tokio::spawn(keep_subscribed(ticket, closed));
        Some(Listening(task))
    }
}

/// Subscribed to a manager's forced-release channel until dropped.
pub(crate) struct Listening(tokio::task::JoinHandle<()>);

impl Drop for Listening {
    fn drop(&mut self) {
        // The task's ticket leaves the channel's waiters, the last one unsubscribing it.
        self.0.abort();
    }
}

/// How often [`keep_subscribed`] looks at its subscription when nothing told it of a change.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Keeps `ticket`'s channel subscribed: subscribes it, and again whenever the connection or the
/// subscription changed (a connection lost, Redis refusing), until `closed` (the manager is
/// gone) or the task is aborted.
async fn keep_subscribed(ticket: Ticket, closed: CancellationToken) {
    let hub = Arc::clone(&ticket.hub);
    loop {
        let changed = hub.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let until = Instant::now() + hub.timeouts.connect + hub.timeouts.response;
        let subscribed = tokio::select! {
            subscribed = ticket.subscribe(until) => subscribed,
            () = closed.cancelled() => return,
        };
        tokio::select! {
            () = changed, if subscribed => {}
            () = tokio::time::sleep(LOOK_EVERY) => {}
            () = closed.cancelled() => return,
        }
    }
}

/// Joins the waiters of `channel` at `hub` (last in line) as `role`.
fn join(hub: &Arc<Hub>, channel: &str, role: Role) -> Ticket {
    let slot = Arc::new(Slot {
        wake: Notify::new(),
        woken: AtomicBool::new(false),
        role,
    });
    let mut state = lock(&hub.state);
    let waiters = state.channels.entry(channel.to_owned()).or_default();
    waiters.join(Arc::clone(&slot));
    if let Some(newcomer) = slot.fair() {
        fair::joined(newcomer, FairWaiters(waiters.waiters()));
    }
    drop(state);
    Ticket {
        hub: Arc::clone(hub),
        channel: channel.to_owned(),
        slot,
        joined: Instant::now(),
        owed: AtomicBool::new(false),
    }
}

impl Ticket {
    /// The key this ticket waits for.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Since when notifications for the key reach this manager, if they do now.
    pub(crate) fn subscribed_since(&self) -> Option<tokio::time::Instant> {
        self.hub.subscribed_since(&self.channel)
    }

    /// Whether a message came on the key's channel after `sent` but before this waiter joined
    /// the key's waiters: it may have announced a release that nobody took for this waiter.
    /// (Messages after it joined reach it, or an older waiter that takes the lock first.)
    pub(crate) fn message_since(&self, sent: Instant) -> bool {
        lock(&self.hub.state)
            .channels
            .get(&self.channel)
            .is_some_and(|channel| channel.message_since(sent.into_std(), self.joined.into_std()))
    }

    /// Makes sure the manager is subscribed to the key, connecting first if needed; waits for
    /// that (done by background tasks) until `until` at the latest. Returns whether
    /// notifications now arrive; `false` means: poll.
    pub(crate) async fn subscribe(&self, until: Instant) -> bool {
        let hub = &self.hub;
        loop {
            let changed = hub.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match hub.advance(&self.channel) {
                Request::Subscribed(_) => return true,
                Request::Poll => return false,
                Request::Wait | Request::Send(_) => {}
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(until) => return false,
            }
        }
    }

    /// Waits for a notification or hand-off news for this waiter (or one that came before it
    /// started waiting). Takes a plain notification and says whether there was one; hand-off
    /// news stays for [`Ticket::take_handed`] and [`Ticket::watch`].
    pub(crate) async fn woken(&self) -> bool {
        self.slot.wake.notified().await;
        let plain = self.slot.woken.swap(false, Ordering::SeqCst);
        if plain && !matches!(self.slot.role, Role::Observer(_)) {
            self.owed.store(true, Ordering::SeqCst);
        }
        plain
    }

    /// The attempt after a release announcement took the key, or marked its holder: the waiters
    /// behind this one will hear of that holder's release themselves.
    pub(crate) fn discharge(&self) {
        self.owed.store(false, Ordering::SeqCst);
    }

    /// From now on, accepts only hand-offs that show `secret` (a new attempt stored it).
    pub(crate) fn expect_secret(&self, secret: Option<Arc<str>>) {
        if let Some(fair) = self.slot.fair() {
            fair.expect_secret(secret);
        }
    }

    /// Takes a hand-off to this waiter, if one came.
    pub(crate) fn take_handed(&self) -> Option<Handoff> {
        self.slot.fair()?.take_handed()
    }

    /// What `decide` (a rule of `fair/`) makes of this fair waiter among its key's fair waiters
    /// in this process; `None` when it is no fair waiter.
    pub(crate) fn among_fair<R>(
        &self,
        decide: impl FnOnce(&FairWaiter, FairWaiters<'_>) -> R,
    ) -> Option<R> {
        let me = self.slot.fair()?;
        let state = lock(&self.hub.state);
        let channel = state.channels.get(&self.channel)?;
        Some(decide(me, FairWaiters(channel.waiters())))
    }

    /// When this waiter should look at the latest hand-off's claim, if it watches one.
    pub(crate) fn watch(&self) -> Option<tokio::time::Instant> {
        self.slot.fair()?.watch()
    }
}

/// The waiter leaves the waiters of its key: a notification it did not use (or one it owed the
/// waiters behind it) goes to the next, a fair waiter's duties to the other fair waiters (see
/// `fair/`), and the last waiter to leave a subscribed key unsubscribes it.
impl Drop for Ticket {
    fn drop(&mut self) {
        let (slot, owed) = (&self.slot, self.owed.load(Ordering::SeqCst));
        self.hub.update(&self.channel, |waiters, at| {
            if let Some(fair) = slot.fair() {
                fair::leaving(fair, FairWaiters(waiters.waiters()));
            }
            let action = waiters.leave(|s| Arc::ptr_eq(s, slot), at);
            if slot.woken.load(Ordering::SeqCst) || owed {
                wake_one(waiters);
            }
            action
        });
    }
}

impl Hub {
    fn subscribed_since(&self, channel: &str) -> Option<tokio::time::Instant> {
        let state = lock(&self.state);
        let up = state.conditions(Instant::now()).connection;
        let since = state.channels.get(channel)?.subscribed_since(up.as_ref())?;
        Some(Instant::from_std(since))
    }

    /// Moves `channel`'s subscription on (starting a connect or a `SUBSCRIBE` in the
    /// background when none runs) and says where it stands: subscribed, to wait for the
    /// background work (never [`Request::Send`]), or to poll.
    fn advance(self: &Arc<Self>, channel: &str) -> Request<Arc<Link>> {
        let mut state = lock(&self.state);
        let now = Instant::now();
        if state.refused_until.is_some_and(|until| now < until) {
            return Request::Poll;
        }
        match &state.connection {
            Connection::Up(_) => {}
            Connection::Connecting => return Request::Wait,
            Connection::Failed { retry_after } if now < *retry_after => return Request::Poll,
            Connection::Down | Connection::Failed { .. } => {
                state.connection = Connection::Connecting;
                drop(state);
                tokio::spawn(connect(Connecting {
                    hub: Arc::clone(self),
                    next: Connection::Down,
                    ran: false,
                }));
                return Request::Wait;
            }
        }
        let at = state.conditions(now);
        let Some(entry) = state.channels.get_mut(channel) else {
            return Request::Poll;
        };
        match entry.request(&at) {
            Request::Send(command) => {
                drop(state);
                self.start(channel, Some(command));
                Request::Wait
            }
            request => request,
        }
    }

    /// Hands an event to `channel`'s state machine (`event`, given the channel and the
    /// conditions now) and does what it decides: a command is started once the state is
    /// unlocked. Forgets the channel once it is idle.
    fn update(
        self: &Arc<Self>,
        channel: &str,
        event: impl FnOnce(&mut Channel, &Conditions<Arc<Link>>) -> Action<Arc<Link>>,
    ) {
        let mut state = lock(&self.state);
        let at = state.conditions(Instant::now());
        let Some(entry) = state.channels.get_mut(channel) else {
            return;
        };
        let command = match event(entry, &at) {
            Action::Nothing => None,
            Action::Send(command) => Some(command),
            Action::Close(link) => {
                let retry_after = Instant::now() + RECONNECT_AFTER;
                self.close(&mut state, link.id, Connection::Failed { retry_after });
                None
            }
        };
        if state.channels.get(channel).is_some_and(Channel::idle) {
            state.channels.remove(channel);
        }
        drop(state);
        self.start(channel, command);
    }

    /// Starts a task for `command` (the state must not be locked: a task dropped at once, its
    /// runtime shutting down, reports itself unanswered). Without a runtime to run it on (a
    /// waiter left outside one), the command counts as unanswered.
    fn start(self: &Arc<Self>, channel: &str, command: Option<Command<Arc<Link>>>) {
        let Some(command) = command else {
            return;
        };
        let out = InFlight {
            hub: Arc::clone(self),
            channel: channel.to_owned(),
            outcome: Outcome::Unanswered,
        };
        // Without a runtime, `out` is dropped here: unanswered.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(out.send(command));
        }
    }

    /// Closes the subscriber connection `id` (if it is still the current one): every
    /// subscription it held ends with it on the server. Wakes every waiter to try again.
    fn close(&self, state: &mut State, id: u64, next: Connection) {
        let link = match std::mem::replace(&mut state.connection, next) {
            Connection::Up(link) if link.id == id => link,
            other => {
                state.connection = other;
                return;
            }
        };
        link.close.cancel();
        state.channels.retain(|_, channel| {
            if channel.lost(&link) == Wake::All {
                wake_all(channel);
            }
            !channel.idle()
        });
        self.changed.notify_waiters();
    }
}

/// A connect under way: dropped, it ends, and the connection becomes `next`. Dropped before it
/// set `next` (its task dropped with its runtime half way), it leaves the connection down: the
/// next waiter connects anew. Dropped before it ever ran (spawned on a runtime shutting down,
/// which drops a new task at once), it leaves the connection failed for [`RECONNECT_AFTER`]:
/// the caller that spawned it, woken by that, would otherwise spawn the next one at once,
/// again and again within one poll, and never let its runtime finish shutting down.
struct Connecting {
    hub: Arc<Hub>,
    next: Connection,
    /// The connect's task ran.
    ran: bool,
}

impl Drop for Connecting {
    fn drop(&mut self) {
        let mut state = lock(&self.hub.state);
        // Only the connect under way moves the connection on from `Connecting`.
        if matches!(state.connection, Connection::Connecting) {
            state.connection = if self.ran {
                std::mem::take(&mut self.next)
            } else {
                Connection::Failed {
                    retry_after: Instant::now() + RECONNECT_AFTER,
                }
            };
        }
        drop(state);
        self.hub.changed.notify_waiters();
    }
}

/// Opens the subscriber connection (whose push handler hands out its messages, see [`receive`])
/// and starts the task that notices its end.
async fn connect(mut connecting: Connecting) {
    connecting.ran = true;
    let hub = Arc::clone(&connecting.hub);
    let weak = Arc::downgrade(&hub);
    let on_message: OnMessage = Arc::new(move |message| {
        if let Some(hub) = weak.upgrade() {
            receive(&hub, message);
        }
    });
    let opened = tokio::time::timeout(hub.timeouts.connect, hub.subscriber.open(on_message))
        .await
        .map_err(|_| format!("no answer within {:?}", hub.timeouts.connect))
        .and_then(|opened| opened.map_err(|error| error.to_string()));
    let watch = match opened {
        Ok((sink, ended)) => {
            let mut state = lock(&hub.state);
            state.opened += 1;
            if state.opened > 1 {
                crate::telemetry::subscriber_reconnect();
            }
            let link = Arc::new(Link {
                id: state.opened,
                sink,
                close: hub.closed.child_token(),
                since: Instant::now(),
            });
            connecting.next = Connection::Up(Arc::clone(&link));
            Some((link, ended))
        }
        Err(error) => {
            tracing::debug!(%error, "distlock could not open its subscriber connection; waiters poll");
            let retry_after = Instant::now() + RECONNECT_AFTER;
            connecting.next = Connection::Failed { retry_after };
            None
        }
    };
    // Sets the connection, and wakes the waiters.
    drop(connecting);
    if let Some((link, ended)) = watch {
        // Made here, so that the connection is closed even if the task never runs.
        let watching = Watching {
            hub: Arc::downgrade(&hub),
            id: link.id,
        };
        tokio::spawn(watch_end(watching, link, ended, hub.timeouts.response));
    }
}

/// The channel whose command a task has out: it hears the outcome once, when this is dropped
/// (unanswered if the task is dropped half way, with its runtime), so it is never left with a
/// command in flight for good.
struct InFlight {
    hub: Arc<Hub>,
    channel: String,
    /// How the command ended: unanswered until an answer came.
    outcome: Outcome,
}

impl InFlight {
    /// Sends `command` and reports how it ended.
    async fn send(mut self, command: Command<Arc<Link>>) {
        let channel = self.channel.as_str();
        let scope = if channel == self.hub.forced {
            Scope::Everywhere
        } else {
            Scope::Key
        };
        let request = match command.kind {
            Kind::Subscribe => command.on.sink.subscribe(channel, scope),
            Kind::Unsubscribe => command.on.sink.unsubscribe(channel, scope),
        };
        // On a cluster, a subscription may open its node's connection first.
        let timeouts = &self.hub.timeouts;
        let answer = tokio::time::timeout(timeouts.connect + timeouts.response, request).await;
        let outcome = match answer {
            Ok(Ok(())) => Outcome::Done,
            Ok(Err(error)) if error.code() == Some("NOPERM") && scope == Scope::Everywhere => {
                // Refused the forced-release channel only (a grant narrower than the prefix's
                // channels; on a cluster, the sharded commands without the plain ones): the
                // locks' own channels are not refused for it.
                let mut state = lock(&self.hub.state);
                if !std::mem::replace(&mut state.forced_refused, true) {
                    tracing::warn!(%error, %channel, "distlock may not subscribe to forced-release notices (the ACL user has no rights on this channel); a holder learns of a forced release at its next renewal");
                }
                Outcome::Failed {
                    retry_after: (Instant::now() + REFUSED_FOR).into_std(),
                }
            }
            Ok(Err(error)) if error.code() == Some("NOPERM") => {
                // Refused for want of rights: waiters poll for a while.
                let mut state = lock(&self.hub.state);
                if state.refused_until.is_none() {
                    tracing::warn!(%error, "distlock may not subscribe to release notifications (the ACL user has no channel rights); waiters poll instead, and a renewing holder learns of a forced release at its next renewal");
                }
                state.refused_until = Some(Instant::now() + REFUSED_FOR);
                Outcome::Refused
            }
            Ok(Err(error))
                if crate::error::Reply::of(&error) != crate::error::Reply::Connection =>
            {
                tracing::debug!(%channel, %error, "distlock could not subscribe to release notifications; waiters poll");
                Outcome::Failed {
                    retry_after: (Instant::now() + RECONNECT_AFTER).into_std(),
                }
            }
            // No answer (it may still be applied) or a broken connection: closing the
            // connection drops whatever it holds on the server.
            _ => {
                tracing::debug!(%channel, "distlock subscriber connection did not answer; reconnecting");
                Outcome::Unanswered
            }
        };
        self.outcome = outcome;
    }
}

/// The command ended: the channel hears how, and does what it decides next.
impl Drop for InFlight {
    fn drop(&mut self) {
        let outcome = self.outcome;
        self.hub
            .update(&self.channel, |entry, at| entry.answered(outcome, at));
        self.hub.changed.notify_waiters();
    }
}

/// Waits for the subscriber connection `link` to end (lost, its server no longer the primary,
/// or no answer to a `PING` within `response`: see [`CHECK_EVERY`]), then marks it closed, so
/// the next waiter connects anew: every waiter is woken to try again. Stops (closing the
/// connection) when the manager is dropped.
async fn watch_end(_watching: Watching, link: Arc<Link>, ended: Ended, response: Duration) {
    tokio::pin!(ended);
    loop {
        tokio::select! {
            () = &mut ended => break,
            () = link.close.cancelled() => return,
            () = tokio::time::sleep(CHECK_EVERY) => {
                if !matches!(tokio::time::timeout(response, link.sink.check()).await, Ok(Ok(()))) {
                    tracing::debug!("distlock subscriber connection stopped answering; reconnecting");
                    break;
                }
            }
        }
    }
    tracing::debug!("distlock subscriber connection closed; waiters will resubscribe");
}

/// Hands a notification to the oldest waiter of its key that has none pending (a plain
/// release), or to its fair recipient and watchers (a hand-off): called on the subscriber
/// connection's own task, for each message.
fn receive(hub: &Arc<Hub>, message: Message) {
    let (name, payload) = match message {
        Message::Published { channel, payload } => (channel, payload),
        Message::Dropped { channel } => {
            // The server ended the subscription (its slot moved): its waiters try again,
            // and subscribe anew where the slot lives now.
            hub.update(&channel, |entry, _| {
                if entry.ended() == Wake::All {
                    wake_all(entry);
                }
                Action::Nothing
            });
            hub.changed.notify_waiters();
            return;
        }
    };
    let handoff = Handoff::parse(&payload);
    let mut state = lock(&hub.state);
    let Some(channel) = state.channels.get_mut(&name) else {
        return;
    };
    channel.message(Instant::now().into_std());
    let mut listeners = Vec::new();
    for observer in channel.waiters() {
        if let Role::Observer(listener) = &observer.role {
            observer.wake.notify_one();
            listeners.extend(listener.clone());
        }
    }
    match handoff {
        None => wake_one(channel),
        Some(handoff) => fair::deliver(&name, handoff, FairWaiters(channel.waiters())),
    }
    drop(state);
    // Called unlocked: a listener may take locks of its own.
    for listener in listeners {
        listener(&payload);
    }
}

/// Marks the subscriber connection `id` closed when its `watch_end` task ends, however it
/// ends (the connection ended, the manager closed it, or the task was dropped with its runtime,
/// or before it ever ran). A connection that ended within [`RECONNECT_AFTER`] of opening is not
/// reopened before that much time has passed again.
struct Watching {
    hub: Weak<Hub>,
    id: u64,
}

impl Drop for Watching {
    fn drop(&mut self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let mut state = lock(&hub.state);
        let next = match &state.connection {
            Connection::Up(link) if link.since.elapsed() < RECONNECT_AFTER => Connection::Failed {
                retry_after: Instant::now() + RECONNECT_AFTER,
            },
            _ => Connection::Down,
        };
        hub.close(&mut state, self.id, next);
    }
}

/// Wakes every waiter of `channel`, each with a notification to take: they try again.
fn wake_all(channel: &Channel) {
    for slot in channel.waiters() {
        slot.notify();
    }
}

/// Wakes the oldest waiter of `channel` that has no notification pending (observers aside).
fn wake_one(channel: &Channel) {
    if let Some(slot) = channel
        .waiters()
        .find(|s| !matches!(s.role, Role::Observer(_)) && !s.woken.load(Ordering::SeqCst))
    {
        slot.notify();
    }
}
