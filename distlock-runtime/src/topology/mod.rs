//! How a command reaches Redis: one [`Route`] per kind of deployment, one file each.
//!
//! Everything above this layer (keys, tokens, validity, renewal, waiting, fairness,
//! re-entrancy) describes its work as [`ScriptCall`]s and hands them to the manager's route,
//! never asking which kind it is:
//! - `standalone.rs`: one server (or a caller's pool), one multiplexed connection.
//! - `sentinel.rs`: the primary Sentinel names, re-resolved on `READONLY`, a broken connection
//!   or `+switch-master`.
//! - `cluster.rs`: a Redis Cluster; each call goes to the primary of its keys' slot.
//! - `quorum.rs`: Redlock over independent primaries; a call runs on every node at once and the
//!   answers are combined by the call's [`Kind`](crate::call::Kind).
//!
//! A route also says which keys can share one script call ([`Route::shard`]: a cluster slot;
//! one shard elsewhere), how the scripts announce a release ([`Route::publish_command`]) and how
//! to subscribe to those announcements ([`Route::subscriber`]).

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use redis::{FromRedisValue, Value};

use crate::call::{BoxFuture, ScriptCall};
use crate::error::LockError;
use crate::failed::{Failed, Reached};
use crate::keys::LockKeys;
use crate::scripts::Announce;

pub(crate) mod cluster;
mod connect;
mod link;
mod probe;
pub(crate) mod quorum;
mod replicas;
pub(crate) mod sentinel;
pub(crate) mod standalone;

pub(crate) use connect::{client, create_pool, dial, parse_url, take_from_pool, Timeouts};
pub(crate) use link::{Dial, Link, ReadOnly, FAIR_WITH_REPLICAS};
pub(crate) use probe::probe;
pub use probe::ServerKind;
pub(crate) use replicas::Replicas;

/// A place's answer to a script call, or how it failed.
pub(crate) type Answer = Result<Value, Failed>;

/// Says, from a quorum's answers so far (in node order, `None` for one still out), whether
/// they settle the round.
pub(crate) type Enough = dyn Fn(&[Option<Answer>]) -> bool + Send + Sync;

/// How one kind of deployment runs distlock's script calls.
pub(crate) trait Route: Send + Sync + 'static {
    /// Runs `call` (whose keys share one [`shard`](Route::shard)); the answer is the script's,
    /// or for a quorum the combination its [`Kind`](crate::call::Kind) prescribes.
    fn run<'a>(&'a self, call: &'a ScriptCall) -> BoxFuture<'a, Result<Value, Failed>>;

    /// Which keys one script call may carry together: those with the same shard.
    fn shard(&self, _key: &str) -> u16 {
        0
    }

    /// The command the scripts announce releases with (`PUBLISH`, or `SPUBLISH` on a cluster,
    /// where a channel lives in its key's slot).
    fn publish_command(&self) -> &'static str {
        "PUBLISH"
    }

    /// Which releases announce themselves: those of keys marked as waited on (see `scripts/`),
    /// or every release, marked or not: a quorum's waiter listens on one node, whose copy of a
    /// mark is missing when the attempt that set it failed there.
    fn announces(&self) -> Announce {
        Announce::WaitedOn
    }

    /// How an acquire takes a request's keys, and what must grant them.
    fn grant(&self) -> Grant {
        Grant::All
    }

    /// A quorum's nodes ([`Grant::Majority`]): runs `call` on every node `to` marks, at once and
    /// each in a task of its own (a round that ends early never drops a request before it was
    /// written), each within `limit`, until `enough` says the answers so far (in node order,
    /// `None` for one still out) settle the round. Never asked of a route that grants
    /// [`Grant::All`].
    fn fan_out<'a>(
        &'a self,
        call: Arc<ScriptCall>,
        limit: Duration,
        to: &'a [bool],
        enough: &'a Enough,
    ) -> BoxFuture<'a, Vec<Option<Answer>>> {
        let _ = (call, limit, to, enough);
        Box::pin(std::future::ready(Vec::new()))
    }

    /// How long one place may take to answer an acquire of `ttl`: the response timeout, but a
    /// quorum node a tenth of the ttl (a hung node must not stall the round).
    fn acquire_timeout(&self, ttl: Duration) -> Duration {
        let _ = ttl;
        self.response_timeout()
    }

    /// How to subscribe to those announcements; `None` when this route cannot (a caller's pool
    /// says nowhere where it connects): waiters poll.
    fn subscriber(&self) -> Option<Arc<dyn Subscribe>>;

    /// The longest a single call waits for an answer.
    fn response_timeout(&self) -> Duration;

    /// Where it connects, without passwords.
    fn endpoint(&self) -> String;

    /// The deadpool pool its connections come from, if it uses one.
    fn pool(&self) -> Option<&Pool> {
        None
    }

    /// The keys matching `pattern` on every server that holds locks (`SCAN`).
    fn scan<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, Result<Vec<String>, LockError>>;

    /// Why fair requests cannot run here, if they cannot.
    fn refuses_fair(&self) -> Option<&'static str> {
        None
    }

    /// Runs `call` (which names no key) on every server that holds locks, each within the
    /// response timeout: each server's name (without passwords) and answer.
    fn run_on_every_server<'a>(
        &'a self,
        call: &'a ScriptCall,
    ) -> BoxFuture<'a, Vec<(String, Result<Value, Failed>)>>;

    /// How many of `servers` must answer for the deployment to serve: all of them, but on a
    /// quorum a majority.
    fn servers_needed(&self, servers: usize) -> usize {
        servers
    }

    /// The commands that publish on, subscribe to and unsubscribe from a lock's channel.
    fn channel_commands(&self) -> (&'static str, &'static str, &'static str) {
        ("PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE")
    }

    /// The commands this route sends outside scripts, besides `EVALSHA` and the channels'
    /// (each with its words apart, as `LockManager::ping` checks them).
    fn commands(&self) -> Vec<String>;
}

impl dyn Route {
    /// Runs `call` and reads its answer as `T`, saying on failure how far the request got (and,
    /// for a refusal, what exactly Redis refused: see `refusal.rs`).
    pub(crate) async fn call<T: FromRedisValue>(&self, call: &ScriptCall) -> Result<T, Failed> {
        let value = match self.run(call).await {
            Ok(value) => value,
            Err(failed) if failed.error.is_misconfigured() => {
                let probe = |types: ScriptCall| async move { self.invoke(&types).await };
                return Err(Box::pin(crate::refusal::explain(call, failed, probe)).await);
            }
            Err(failed) => return Err(failed),
        };
        T::from_redis_value(value).map_err(|error| Failed {
            error: LockError::Redis {
                op: call.op,
                source: error.into(),
            },
            reached: Reached::Answered,
        })
    }

    /// `call`, with just the error on failure.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        call: &ScriptCall,
    ) -> Result<T, LockError> {
        self.call(call).await.map_err(|failed| failed.error)
    }
}

/// How a route's scripts announce releases to subscribers.
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
        let message = match push.kind {
            PushKind::SMessage | PushKind::Message => {
                let mut data = push.data.into_iter();
                let (Some(channel), Some(payload)) = (data.next(), data.next()) else {
                    return Ok(());
                };
                let (Ok(channel), Ok(payload)) = (
                    redis::from_redis_value::<String>(channel),
                    redis::from_redis_value::<Vec<u8>>(payload),
                ) else {
                    return Ok(());
                };
                Message::Published { channel, payload }
            }
            PushKind::SUnsubscribe => {
                let Some(Ok(channel)) = push
                    .data
                    .into_iter()
                    .next()
                    .map(redis::from_redis_value::<String>)
                else {
                    return Ok(());
                };
                Message::Dropped { channel }
            }
            PushKind::Disconnection => {
                // The connection was lost, and its subscriptions with it.
                if let Some(lost) = crate::sync::lock(&lost).take() {
                    let _ = lost.send(());
                }
                return Err(());
            }
            _ => return Ok(()),
        };
        on_message(message);
        Ok(())
    };
    (
        handler,
        Box::pin(async move {
            let _ = ended.await;
        }),
    )
}

/// Subscribes and unsubscribes channels on one subscriber connection.
pub(crate) trait Channels: Send + Sync + 'static {
    fn subscribe<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, redis::RedisResult<()>>;
    fn unsubscribe<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, redis::RedisResult<()>>;
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

/// How an acquire takes a request's keys where they live, and what must grant them (see
/// `acquire/places.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    /// Each shard's group of keys on its one server, in turn, in one global order: every group
    /// must grant (one server, Sentinel, a cluster).
    All,
    /// The same keys on every one of `nodes` independent servers at once: a majority must grant
    /// (a quorum).
    Majority {
        /// How many nodes there are.
        nodes: usize,
    },
}

impl Grant {
    /// How many of `places` must hold a lease's keys (with its fencing token) for it to count.
    pub(crate) fn needed(self, places: usize) -> usize {
        match self {
            Self::All => places,
            Self::Majority { nodes } => nodes / 2 + 1,
        }
    }
}

/// The indices of `redis_keys` grouped by shard, groups in shard order, keys in their order
/// (one group on every route but a cluster's).
pub(crate) fn by_shard(route: &dyn Route, redis_keys: &[LockKeys]) -> Vec<Vec<usize>> {
    if redis_keys.len() == 1 {
        // Most requests: one group, whatever the route.
        return vec![vec![0]];
    }
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, keys) in redis_keys.iter().enumerate() {
        let shard = route.shard(keys.lock());
        match groups.iter_mut().find(|(s, _)| *s == shard) {
            Some((_, group)) => group.push(i),
            None => groups.push((shard, vec![i])),
        }
    }
    groups.sort_by_key(|(shard, _)| *shard);
    groups.into_iter().map(|(_, group)| group).collect()
}
