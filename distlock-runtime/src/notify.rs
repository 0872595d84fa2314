//! Release notifications: the release script `PUBLISH`es on each lock key it deletes (the
//! channel is the key's name), and one subscriber connection per manager hands each
//! notification to one local waiter of that key, oldest first. A release that hands the lock to
//! a fair waiter publishes a hand-off message instead, which `fair.rs` routes (to its recipient,
//! and to the waiters that watch its claim; a watcher that leaves passes its watch on).
//!
//! A waiter takes a [`Ticket`] (its place in the key's queue) and makes sure the manager is
//! subscribed to the key before its next attempt, so a release between an attempt and the
//! subscription cannot be missed (nor one before a subscription that another waiter made after
//! this waiter's attempt went out: [`Ticket::subscribed_since`] tells). A subscription is shared by all local waiters of a key and
//! dropped with the last of them. When the subscriber connection breaks, every waiter is woken
//! to try again, and the next one to wait connects anew; a lost notification costs latency
//! (waiters also wake at the holder's expiry), never a hang.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use redis::aio::PubSubSink;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::conn::{lock, Timeouts};
use crate::fair::{self, FairWaiter, Handoff};

/// The notification side of one manager.
pub(crate) struct Notifications {
    hub: Arc<Hub>,
}

struct Hub {
    client: redis::Client,
    timeouts: Timeouts,
    state: Mutex<State>,
    /// Serializes SUBSCRIBE / UNSUBSCRIBE, so a subscription and the removal of the previous
    /// one for the same key cannot cross.
    changes: tokio::sync::Mutex<()>,
    /// Cancelled when the manager (and so this hub) is dropped: closes the subscriber connection.
    closed: CancellationToken,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

#[derive(Default)]
struct State {
    /// The subscriber connection, while it is up.
    sink: Option<PubSubSink>,
    /// Counts connections; a subscription made on an older one is gone.
    connection: u64,
    channels: HashMap<String, Channel>,
}

#[derive(Default)]
struct Channel {
    waiters: VecDeque<Arc<Slot>>,
    /// The connection the channel is subscribed on, if any, and since when (after Redis
    /// confirmed the subscription).
    subscribed_on: Option<(u64, tokio::time::Instant)>,
}

/// One waiting caller.
#[derive(Default)]
struct Slot {
    wake: Notify,
    /// A plain notification was handed to this waiter and not yet taken.
    woken: AtomicBool,
    /// What a fair waiter keeps for hand-offs; `None` for other waiters.
    fair: Option<FairWaiter>,
}

/// A waiter's place in a key's queue; leaving it (drop) passes on a notification it did not
/// take and unsubscribes with the last waiter.
pub(crate) struct Ticket {
    hub: Arc<Hub>,
    channel: String,
    slot: Arc<Slot>,
}

impl Notifications {
    pub(crate) fn new(client: redis::Client, timeouts: Timeouts) -> Self {
        Self {
            hub: Arc::new(Hub {
                client,
                timeouts,
                state: Mutex::new(State::default()),
                changes: tokio::sync::Mutex::new(()),
                closed: CancellationToken::new(),
            }),
        }
    }

    /// Joins the queue of waiters for the lock key `channel`; a fair waiter gives its owner
    /// `token` and its latest attempt's `secret`, so hand-off messages naming it (and showing
    /// the secret) reach it.
    pub(crate) fn enqueue(
        &self,
        channel: &str,
        token: Option<Arc<str>>,
        secret: Option<Arc<str>>,
    ) -> Ticket {
        let slot = Arc::new(Slot {
            fair: token.map(|token| FairWaiter::new(token, secret)),
            ..Slot::default()
        });
        lock(&self.hub.state)
            .channels
            .entry(channel.to_owned())
            .or_default()
            .waiters
            .push_back(Arc::clone(&slot));
        Ticket {
            hub: Arc::clone(&self.hub),
            channel: channel.to_owned(),
            slot,
        }
    }
}

impl Notifications {
    /// Whether notifications for the lock key `channel` reach this manager now.
    pub(crate) fn subscribed(&self, channel: &str) -> bool {
        self.hub.subscribed_since(channel).is_some()
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

    /// Subscribes the manager to the key (connecting first if needed), bounded by the manager's
    /// timeouts. Returns whether notifications now arrive.
    pub(crate) async fn subscribe(&self) -> bool {
        let hub = &self.hub;
        let _changing = hub.changes.lock().await;
        if self.subscribed_since().is_some() {
            return true;
        }
        let (mut sink, connection) = match hub.connected() {
            Some(connected) => connected,
            None => match hub.connect().await {
                Some(connected) => connected,
                None => return false,
            },
        };
        let subscribed =
            tokio::time::timeout(hub.timeouts.response, sink.subscribe(&self.channel)).await;
        if !matches!(subscribed, Ok(Ok(()))) {
            tracing::debug!(channel = %self.channel, "distlock could not subscribe to release notifications");
            return false;
        }
        let mut state = lock(&hub.state);
        if state.connection != connection {
            return false;
        }
        if let Some(channel) = state.channels.get_mut(&self.channel) {
            channel.subscribed_on = Some((connection, tokio::time::Instant::now()));
        }
        true
    }

    /// Waits for a notification or hand-off news for this waiter (or one that came before it
    /// started waiting). Takes a plain notification and says whether there was one; hand-off
    /// news stays for [`Ticket::take_handed`] and [`Ticket::watch`].
    pub(crate) async fn woken(&self) -> bool {
        self.slot.wake.notified().await;
        self.slot.woken.swap(false, Ordering::SeqCst)
    }

    /// From now on, accepts only hand-offs that show `secret` (a new attempt stored it).
    pub(crate) fn expect_secret(&self, secret: Option<Arc<str>>) {
        if let Some(fair) = &self.slot.fair {
            fair.expect_secret(secret);
        }
    }

    /// Takes a hand-off to this waiter, if one came.
    pub(crate) fn take_handed(&self) -> Option<Handoff> {
        self.slot.fair.as_ref()?.take_handed()
    }

    /// When this waiter should look at the latest hand-off's claim, if it watches one.
    pub(crate) fn watch(&self) -> Option<tokio::time::Instant> {
        self.slot.fair.as_ref()?.watch()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = lock(&self.hub.state);
        let Some(channel) = state.channels.get_mut(&self.channel) else {
            return;
        };
        channel.waiters.retain(|s| !Arc::ptr_eq(s, &self.slot));
        if self.slot.woken.load(Ordering::SeqCst) {
            // This waiter leaves with a notification it did not use: the next one gets it.
            wake_one(channel);
        }
        let watch = self.slot.fair.as_ref().and_then(FairWaiter::watch);
        if let Some(until) = watch.filter(|&until| until > tokio::time::Instant::now()) {
            // Nor does the claim it watched go unwatched.
            let heir = channel
                .waiters
                .iter()
                .find_map(|s| Some((s.fair.as_ref()?, s)));
            if let Some((fair, heir)) = heir {
                fair.inherit_watch(until);
                heir.wake.notify_one();
            }
        }
        if channel.waiters.is_empty() {
            let was_subscribed = channel.subscribed_on.take().is_some();
            state.channels.remove(&self.channel);
            if was_subscribed {
                if let (Some(sink), Ok(runtime)) =
                    (state.sink.clone(), tokio::runtime::Handle::try_current())
                {
                    let hub = Arc::clone(&self.hub);
                    let channel = self.channel.clone();
                    runtime.spawn(async move { hub.unsubscribe(sink, channel).await });
                }
            }
        }
    }
}

impl Hub {
    fn subscribed_since(&self, channel: &str) -> Option<tokio::time::Instant> {
        let state = lock(&self.state);
        state.sink.as_ref()?;
        match state.channels.get(channel)?.subscribed_on {
            Some((connection, since)) if connection == state.connection => Some(since),
            _ => None,
        }
    }

    fn connected(&self) -> Option<(PubSubSink, u64)> {
        let state = lock(&self.state);
        state.sink.clone().map(|sink| (sink, state.connection))
    }

    /// Opens the subscriber connection and starts the task that hands out its messages.
    async fn connect(self: &Arc<Self>) -> Option<(PubSubSink, u64)> {
        let opened =
            tokio::time::timeout(self.timeouts.connect, self.client.get_async_pubsub()).await;
        let pubsub = match opened {
            Ok(Ok(pubsub)) => pubsub,
            _ => {
                tracing::debug!("distlock could not open its subscriber connection; waiters poll");
                return None;
            }
        };
        let (sink, stream) = pubsub.split();
        let connection = {
            let mut state = lock(&self.state);
            state.connection += 1;
            state.sink = Some(sink.clone());
            state.connection
        };
        tokio::spawn(deliver(
            Arc::downgrade(self),
            self.closed.clone(),
            stream,
            connection,
        ));
        Some((sink, connection))
    }

    async fn unsubscribe(&self, mut sink: PubSubSink, channel: String) {
        let _changing = self.changes.lock().await;
        // A waiter may have come back for this key meanwhile: then it stays subscribed.
        if lock(&self.state).channels.contains_key(&channel) {
            return;
        }
        let _ = tokio::time::timeout(self.timeouts.response, sink.unsubscribe(&channel)).await;
    }
}

/// Hands each notification to the oldest waiter of its key that has none pending; when the
/// connection ends, wakes every waiter so they try again. Holds the hub weakly, and stops (closing
/// the connection) when the manager is dropped.
async fn deliver(
    hub: Weak<Hub>,
    closed: CancellationToken,
    mut stream: redis::aio::PubSubStream,
    connection: u64,
) {
    use futures_core::Stream;
    loop {
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_next(cx));
        let message = tokio::select! {
            message = next => message,
            () = closed.cancelled() => return,
        };
        let Some(hub) = hub.upgrade() else { return };
        let Some(message) = message else { break };
        let handoff = Handoff::parse(message.get_payload_bytes());
        let mut state = lock(&hub.state);
        let Some(channel) = state.channels.get_mut(message.get_channel_name()) else {
            continue;
        };
        match handoff {
            None => wake_one(channel),
            Some(handoff) => {
                let fair_waiters: Vec<_> = channel
                    .waiters
                    .iter()
                    .filter_map(|s| Some((s.fair.as_ref()?, &s.wake)))
                    .collect();
                fair::deliver(message.get_channel_name(), handoff, &fair_waiters);
            }
        }
    }
    let Some(hub) = hub.upgrade() else { return };
    let mut state = lock(&hub.state);
    if state.connection == connection {
        state.sink = None;
        for channel in state.channels.values_mut() {
            channel.subscribed_on = None;
            for slot in &channel.waiters {
                slot.woken.store(true, Ordering::SeqCst);
                slot.wake.notify_one();
            }
        }
    }
    drop(state);
    tracing::debug!("distlock subscriber connection closed; waiters will resubscribe");
}

/// Wakes the oldest waiter of `channel` that has no notification pending.
fn wake_one(channel: &mut Channel) {
    if let Some(slot) = channel
        .waiters
        .iter()
        .find(|s| !s.woken.load(Ordering::SeqCst))
    {
        slot.woken.store(true, Ordering::SeqCst);
        slot.wake.notify_one();
    }
}
