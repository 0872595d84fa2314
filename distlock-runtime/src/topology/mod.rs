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
//!   answers are combined by the call's [`Kind`].
//!
//! A route also says which keys can share one script call ([`Route::shard`]: a cluster slot;
//! one shard elsewhere), how the scripts announce a release ([`Route::publish_command`]) and how
//! to subscribe to those announcements ([`Route::subscriber`]).

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use redis::{FromRedisValue, Value};

use crate::call::{BoxFuture, Failed, Reached, ScriptCall};
use crate::error::LockError;
use crate::keys::LockKeys;

pub(crate) mod cluster;
pub(crate) mod quorum;
pub(crate) mod sentinel;
pub(crate) mod standalone;

/// How one kind of deployment runs distlock's script calls.
pub(crate) trait Route: Send + Sync + 'static {
    /// Runs `call` (whose keys share one [`shard`](Route::shard)); the answer is the script's,
    /// or for a quorum the combination its [`Kind`] prescribes.
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
}

impl dyn Route {
    /// Runs `call` and reads its answer as `T`, saying on failure how far the request got.
    pub(crate) async fn call<T: FromRedisValue>(&self, call: &ScriptCall) -> Result<T, Failed> {
        let value = self.run(call).await?;
        T::from_redis_value(value).map_err(|error| Failed {
            error: LockError::Redis {
                op: call.op,
                source: error.into(),
            },
            reached: Reached::Answered,
        })
    }

    /// [`call`](Self::call), with just the error on failure.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        call: &ScriptCall,
    ) -> Result<T, LockError> {
        self.call(call).await.map_err(|failed| failed.error)
    }
}

/// How a route's scripts announce releases to subscribers.
pub(crate) trait Subscribe: Send + Sync + 'static {
    /// Opens a subscriber connection: what subscribes on it, and its messages (which end when
    /// the connection does).
    fn open(&self) -> BoxFuture<'_, redis::RedisResult<(Arc<dyn Channels>, Messages)>>;
}

/// Subscribes and unsubscribes channels on one subscriber connection.
pub(crate) trait Channels: Send + Sync + 'static {
    fn subscribe<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, redis::RedisResult<()>>;
    fn unsubscribe<'a>(&'a self, channel: &'a str) -> BoxFuture<'a, redis::RedisResult<()>>;
}

/// What arrives on a subscriber connection; the receiver ends with the connection.
///
/// A stream, read by the notifier's own task: a message reaches its waiter with no task in
/// between (each hop between tasks costs a wake-up on the path of every hand-off).
pub(crate) type Messages = std::pin::Pin<Box<dyn futures_core::Stream<Item = Message> + Send>>;

/// One event on a subscriber connection.
#[derive(Debug)]
pub(crate) enum Message {
    /// A message published on a subscribed channel.
    Published { channel: String, payload: Vec<u8> },
    /// The server ended the subscription of `channel` (its slot moved to another node).
    Dropped { channel: String },
}

/// Why a route with `min_replicas` refuses fair requests.
pub(crate) const FAIR_WITH_REPLICAS: &str = "fair requests cannot be combined with min_replicas: \
    a fair lock is handed to its next waiter by the release script, and nothing confirms that \
    hand-off on the replicas before the waiter's body starts, so a failover could give the lock \
    to someone else too; use unfair requests with min_replicas, or fair ones without it";

/// The indices of `redis_keys` grouped by shard, groups in shard order, keys in their order
/// (one group on every route but a cluster's).
pub(crate) fn by_shard(route: &dyn Route, redis_keys: &[LockKeys]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, keys) in redis_keys.iter().enumerate() {
        let shard = route.shard(&keys.lock);
        match groups.iter_mut().find(|(s, _)| *s == shard) {
            Some((_, group)) => group.push(i),
            None => groups.push((shard, vec![i])),
        }
    }
    groups.sort_by_key(|(shard, _)| *shard);
    groups.into_iter().map(|(_, group)| group).collect()
}
