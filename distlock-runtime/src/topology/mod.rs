//! How a command reaches Redis: one [`Deployment`], whose [`Grant`] has a variant per kind, one
//! file each.
//!
//! Everything above this layer (keys, tokens, validity, renewal, waiting, fairness,
//! re-entrancy) describes its work as [`ScriptCall`]s and asks the deployment for an operation
//! (an acquire, a release, an extension, a read of a lock); each reads its reply once into a
//! type:
//! - `one.rs`: one primary: a server (or a caller's pool), or the one Sentinel names
//!   (`sentinel.rs`: re-resolved on `READONLY`, a broken connection or `+switch-master`); every
//!   call on one multiplexed connection ([`Link`]).
//! - `cluster.rs`: a Redis Cluster; each call goes to the primary of its keys' slot.
//! - `quorum.rs`: Redlock over independent primaries: every operation runs on all nodes at
//!   once, and a majority decides. It is the only file that knows a quorum.
//!
//! One primary and a cluster hold each key on one server at a time ([`Serial`]): their
//! acquires take each slot's keys in turn, every slot granting (`acquire/places.rs`), and only
//! they can run a fair queue, whose hand-off is made by one script on one server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use futures_util::FutureExt;
use redis::{FromRedisValue, Value};

use crate::call::{BoxFuture, ScriptCall};
use crate::error::LockError;
use crate::failed::{Failed, Reached};
use crate::keys::LockKeys;
use crate::scripts::{Announce, Inspected};

pub(crate) mod cluster;
mod connect;
mod link;
pub(crate) mod one;
mod probe;
pub(crate) mod quorum;
mod replicas;
pub(crate) mod sentinel;

pub(crate) use cluster::Cluster;
pub(crate) use connect::{client, create_pool, dial, parse_url, take_from_pool, Timeouts};
pub(crate) use link::{Dial, Link, ReadOnly, FAIR_WITH_REPLICAS};
pub(crate) use probe::probe;
pub use probe::ServerKind;
pub(crate) use quorum::Quorum;
pub(crate) use replicas::Replicas;

/// A place's answer to a script call, or how it failed.
pub(crate) type Answer = Result<Value, Failed>;

/// Where a manager's locks live: how a lease is granted there, and what every kind has.
pub(crate) struct Deployment {
    /// How a lease is granted, and so where each call runs.
    pub(crate) grant: Grant,
    /// Where it connects, without passwords.
    pub(crate) endpoint: String,
    /// The longest a single call waits for an answer.
    pub(crate) response_timeout: Duration,
    /// How to subscribe to release announcements; `None` when it cannot (a caller's pool says
    /// nowhere where it connects): waiters poll.
    pub(crate) subscriber: Option<Arc<dyn Subscribe>>,
    /// The commands sent outside scripts, besides `EVALSHA` and the channels' (each with its
    /// words apart, as `LockManager::ping` checks them).
    pub(crate) commands: Vec<String>,
    /// The deadpool pool of one server's connections, if it uses one.
    pub(crate) pool: Option<Pool>,
    /// Whether writes wait for replicas (`min_replicas`).
    waits_for_replicas: bool,
}

/// How a deployment grants a lease.
pub(crate) enum Grant {
    /// Each key on one server at a time.
    Serial(Serial),
    /// Independent primaries, a majority of which holds each lease (Redlock).
    Majority(Quorum),
}

/// A deployment that holds each key on one server at a time: a call runs where its keys live,
/// and its answer is that server's.
pub(crate) enum Serial {
    /// One primary: a server, a caller's pool, or the primary Sentinel names.
    One(Arc<Link>),
    /// A Redis Cluster: each key on the primary of its slot.
    Sharded(Cluster),
}

impl Serial {
    /// Runs `call` (whose keys share one [`shard`](Deployment::shard)) and reads its answer as
    /// `T`, saying on failure how far the request got (and, for a refusal, what exactly Redis
    /// refused: see `refusal.rs`).
    pub(crate) async fn call<T: FromRedisValue>(&self, call: &ScriptCall) -> Result<T, Failed> {
        match self.run(call).await {
            Ok(value) => read(call, value),
            Err(failed) => {
                let probe = |types: ScriptCall| async move {
                    let answer = self.run(&types).await;
                    answer.and_then(|v| read(&types, v)).map_err(|f| f.error)
                };
                // Boxed: rare, and large (it may run a probe).
                Err(Box::pin(crate::refusal::explain(call, failed, probe)).await)
            }
        }
    }

    async fn run(&self, call: &ScriptCall) -> Answer {
        match self {
            // Boxed: a link's call is large, and every lock future would embed it.
            Self::One(link) => Box::pin(link.run(call)).await,
            Self::Sharded(cluster) => Box::pin(cluster.run(call)).await,
        }
    }

    /// The command the scripts announce releases with (`PUBLISH`, or `SPUBLISH` on a cluster,
    /// where a channel lives in its key's slot).
    pub(crate) fn publish_command(&self) -> &'static str {
        match self {
            Self::One(_) => "PUBLISH",
            Self::Sharded(_) => "SPUBLISH",
        }
    }
}

impl Deployment {
    /// Where fair requests run, or why they cannot: a quorum's nodes would each hand a lock to
    /// their own oldest waiter; with `min_replicas`, nothing confirms a hand-off.
    pub(crate) fn fair(&self) -> Result<&Serial, &'static str> {
        match &self.grant {
            Grant::Serial(_) if self.waits_for_replicas => Err(FAIR_WITH_REPLICAS),
            Grant::Serial(serial) => Ok(serial),
            Grant::Majority(_) => Err(quorum::FAIR_REFUSED),
        }
    }

    /// Whether permits are held in slots (`keys::Seat`): on a quorum, whose nodes each see only
    /// the holders they granted, so that none can count them all (docs/modes.md, "Semaphores on
    /// a quorum").
    pub(crate) fn permits_in_slots(&self) -> bool {
        matches!(self.grant, Grant::Majority(_))
    }

    /// Which keys one script call may carry together: those with the same shard (a cluster
    /// slot; one shard elsewhere).
    pub(crate) fn shard(&self, key: &str) -> u16 {
        match self.grant {
            Grant::Serial(Serial::Sharded(_)) => cluster::slot(key),
            _ => 0,
        }
    }

    /// How the scripts announce a release: with `PUBLISH`, or `SPUBLISH` on a cluster; those of
    /// keys marked as waited on (see `scripts/`), or on a quorum every release, marked or not:
    /// its waiter listens on one node, whose copy of a mark is missing when the attempt that
    /// set it failed there.
    pub(crate) fn announce(&self) -> (&'static str, Announce) {
        match &self.grant {
            Grant::Serial(serial) => (serial.publish_command(), Announce::WaitedOn),
            Grant::Majority(_) => ("PUBLISH", Announce::Always),
        }
    }

    /// The commands that publish on, subscribe to and unsubscribe from a lock's channel.
    pub(crate) fn channel_commands(&self) -> (&'static str, &'static str, &'static str) {
        match self.grant {
            Grant::Serial(Serial::Sharded(_)) => ("SPUBLISH", "SSUBSCRIBE", "SUNSUBSCRIBE"),
            _ => ("PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE"),
        }
    }

    /// The keys matching `pattern` on every server that holds locks (`SCAN`).
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, LockError> {
        match &self.grant {
            Grant::Serial(Serial::One(link)) => link.scan(pattern).await,
            Grant::Serial(Serial::Sharded(cluster)) => cluster.scan(pattern).await,
            Grant::Majority(quorum) => quorum.scan(pattern).await,
        }
    }

    /// Runs `call` (which names no key) on every server that holds locks, each within the
    /// response timeout: each server's name (without passwords) and answer, and how many must
    /// answer for the deployment to serve (all, but a majority of a quorum's nodes).
    pub(crate) async fn run_on_every_server(
        &self,
        call: &ScriptCall,
    ) -> (Vec<(String, Answer)>, usize) {
        let answers = match &self.grant {
            Grant::Serial(Serial::One(link)) => vec![(self.endpoint.clone(), link.run(call).await)],
            Grant::Serial(Serial::Sharded(cluster)) => cluster.run_on_every_server(call).await,
            Grant::Majority(quorum) => return quorum.run_on_every_server(call).await,
        };
        let needed = answers.len();
        (answers, needed)
    }

    /// Runs a call that writes nothing a lease relies on, read as `T` (a quorum answers once a
    /// majority did): a release's count of keys released (on a quorum, the most any node
    /// released), a probe of key types.
    pub(crate) async fn read<T: FromRedisValue>(&self, call: &ScriptCall) -> Result<T, LockError> {
        match &self.grant {
            Grant::Serial(serial) => serial.call(call).await,
            Grant::Majority(quorum) => quorum.read(call).await,
        }
        .map_err(|failed| failed.error)
    }

    /// Runs a release call: how many keys were released (on a quorum, the most any node of a
    /// majority released).
    pub(crate) async fn release(&self, call: &ScriptCall) -> Result<usize, LockError> {
        match &self.grant {
            Grant::Serial(serial) => serial.call(call).await,
            Grant::Majority(quorum) => quorum.release(call, false).await,
        }
        .map_err(|failed| failed.error)
    }

    /// Runs a forced release: how many keys were released (on a quorum, run to the end on
    /// every node before it counts).
    pub(crate) async fn force_release(&self, call: &ScriptCall) -> Result<usize, LockError> {
        match &self.grant {
            Grant::Serial(serial) => serial.call(call).await,
            Grant::Majority(quorum) => quorum.release(call, true).await,
        }
        .map_err(|failed| failed.error)
    }

    /// Runs an extension call: per lease, whether its owner still held its keys (on a quorum,
    /// on a majority of nodes).
    pub(crate) async fn extend(&self, call: &ScriptCall) -> Result<Vec<bool>, LockError> {
        match &self.grant {
            Grant::Serial(serial) => serial
                .call::<Vec<i64>>(call)
                .await
                .map(|owned| owned.into_iter().map(|o| o == 1).collect()),
            Grant::Majority(quorum) => quorum.extend(call).await,
        }
        .map_err(|failed| failed.error)
    }

    /// Runs an inspect call (`scripts/inspect.lua`): on a quorum, the lock as a majority of
    /// nodes hold it.
    pub(crate) async fn inspect(&self, call: &ScriptCall) -> Result<Option<Inspected>, LockError> {
        match &self.grant {
            Grant::Serial(serial) => serial.call(call).await,
            Grant::Majority(quorum) => quorum.inspect(call).await,
        }
        .map_err(|failed| failed.error)
    }
}

/// A place's answer to `call` read as `T`.
pub(crate) fn read<T: FromRedisValue>(call: &ScriptCall, value: Value) -> Result<T, Failed> {
    T::from_redis_value(value).map_err(|error| Failed {
        error: LockError::Redis {
            op: call.op,
            source: error.into(),
        },
        reached: Reached::Answered,
    })
}

/// How a deployment's release announcements are subscribed to.
pub(crate) trait Subscribe: Send + Sync + 'static {
    /// Opens a subscriber connection that hands each message to `on_message`: what subscribes
    /// on it, and a future that completes when the connection ends.
    fn open(
        &self,
        on_message: OnMessage,
    ) -> BoxFuture<'_, redis::RedisResult<(Arc<dyn Channels>, Ended)>>;
}

/// Takes each message of a subscriber connection, on the connection's own task (a RESP3 push
/// handler): a message reaches its waiter with no task in between, where each hop between
/// tasks would cost a wake-up on the path of every hand-off. It must not block.
pub(crate) type OnMessage = Arc<dyn Fn(Message) + Send + Sync>;

/// Completes when a subscriber connection ends.
pub(crate) type Ended = BoxFuture<'static, ()>;

/// A RESP3 push handler for a subscriber connection: published messages (`MESSAGE`,
/// `SMESSAGE`) and ended subscriptions (`SUNSUBSCRIBE`, a cluster slot that moved) go to
/// `on_message`; the returned future completes when the connection is lost (or the handler is
/// dropped with it), and nothing more is handed on after that.
pub(crate) fn push_handler(
    on_message: OnMessage,
) -> (
    impl Fn(redis::PushInfo) -> Result<(), ()> + Send + Sync + 'static,
    Ended,
) {
    use redis::PushKind;
    let (lost, ended) = tokio::sync::oneshot::channel::<()>();
    let lost = std::sync::Mutex::new(Some(lost));
    let handler = move |push: redis::PushInfo| -> Result<(), ()> {
        if crate::sync::lock(&lost).is_none() {
            // Lost already (on a cluster, one node's connection): the notifier is opening a
            // new subscriber connection, which takes over.
            return Err(());
        }
        if push.kind == PushKind::Disconnection {
            // The connection was lost, and its subscriptions with it.
            if let Some(lost) = crate::sync::lock(&lost).take() {
                let _ = lost.send(());
            }
            return Err(());
        }
        if let Some(message) = Message::of(push) {
            on_message(message);
        }
        Ok(())
    };
    (handler, Box::pin(ended.map(drop)))
}

/// Where a channel's messages are published: what a subscription to it must reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// A lock's channel, named by its lock key: `SPUBLISH`ed on a cluster, so subscribed
    /// (`SSUBSCRIBE`) on the primary of the key's slot.
    Key,
    /// A channel of the whole deployment (a manager's forced releases): `PUBLISH`ed, which a
    /// cluster carries to every node, so subscribed (`SUBSCRIBE`) on any node.
    Everywhere,
}

/// Subscribes and unsubscribes channels on one subscriber connection.
pub(crate) trait Channels: Send + Sync + 'static {
    fn subscribe<'a>(
        &'a self,
        channel: &'a str,
        scope: Scope,
    ) -> BoxFuture<'a, redis::RedisResult<()>>;
    fn unsubscribe<'a>(
        &'a self,
        channel: &'a str,
        scope: Scope,
    ) -> BoxFuture<'a, redis::RedisResult<()>>;
    /// Run every 2 s by the notifier: checks with a `PING` that the connection (each of them,
    /// on a cluster) still answers, as one that stopped (a server hung, a network cut that
    /// closed nothing) would never say so itself; on a cluster, first ends the subscriptions
    /// whose slot the map now gives another primary (`ShardChannels::drop_moved`).
    fn check(&self) -> BoxFuture<'_, redis::RedisResult<()>>;
}

/// One event on a subscriber connection.
#[derive(Debug)]
pub(crate) enum Message {
    /// A message published on a subscribed channel.
    Published { channel: String, payload: Vec<u8> },
    /// The server ended the subscription of `channel` (its slot moved to another node).
    Dropped { channel: String },
}

impl Message {
    /// The message `push` carries, if it carries one (a published message, an ended
    /// subscription).
    fn of(push: redis::PushInfo) -> Option<Self> {
        use redis::{from_redis_value, PushKind};
        let mut data = push.data.into_iter();
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                let channel = from_redis_value(data.next()?).ok()?;
                let payload = from_redis_value(data.next()?).ok()?;
                Some(Self::Published { channel, payload })
            }
            PushKind::SUnsubscribe => {
                let channel = from_redis_value(data.next()?).ok()?;
                Some(Self::Dropped { channel })
            }
            _ => None,
        }
    }
}

/// The indices of `redis_keys` grouped by shard, groups in shard order, keys in their order
/// (one group on every deployment but a cluster).
pub(crate) fn by_shard(deployment: &Deployment, redis_keys: &[LockKeys]) -> Vec<Vec<usize>> {
    if redis_keys.len() == 1 {
        // Most requests: one group, whatever the deployment.
        return vec![vec![0]];
    }
    let mut groups = BTreeMap::new();
    for (i, keys) in redis_keys.iter().enumerate() {
        let shard = deployment.shard(keys.lock());
        groups.entry(shard).or_insert_with(Vec::new).push(i);
    }
    groups.into_values().collect()
}
