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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use redis::{Cmd, FromRedisValue, ToRedisArgs, Value};

use crate::conn::{Failed, Reached};
use crate::error::LockError;

pub(crate) mod cluster;
pub(crate) mod quorum;
pub(crate) mod sentinel;
pub(crate) mod standalone;

/// A boxed future, as the object-safe [`Route`] returns.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

/// A Lua script: its source and its SHA-1, which `EVALSHA` names it by.
pub(crate) struct Lua {
    code: String,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: impl Into<String>) -> Self {
        let code = code.into();
        let hash = sha1_smol::Sha1::from(code.as_bytes()).digest().to_string();
        Self { code, hash }
    }
}

/// What a call does, which says how a quorum combines its nodes' answers (see `quorum.rs`).
pub(crate) enum Kind {
    /// Writes nothing; counts when a majority answers.
    Read,
    /// Takes lock keys: answers a fencing token, or who holds them (`scripts::Acquire`).
    /// `fences` are the keys' fencing counters and `ttl` the lease's, so a quorum can write the
    /// greatest token back; `undo` releases what this call took.
    Acquire {
        fences: Vec<String>,
        ttl: Duration,
        undo: Box<ScriptCall>,
    },
    /// Releases by token: answers how many keys were released.
    Release,
    /// Extends leases by token: answers one 0 or 1 per lease.
    Extend,
    /// Raises fencing counters: answers nothing of interest.
    Raise,
    /// A fair queue's call; a route that refuses fair requests never sees one.
    Fair,
}

impl Kind {
    /// Whether, with `min_replicas`, the call counts only once replicas confirmed it: what takes
    /// or prolongs a lock, or raises a fencing counter.
    pub(crate) fn needs_replicas(&self) -> bool {
        matches!(
            self,
            Self::Acquire { .. } | Self::Extend | Self::Raise | Self::Fair
        )
    }
}

/// With `min_replicas`: the answer of a call that `acked` replicas confirmed. When fewer did,
/// an acquire is undone at once (by `run`, its release) and the call fails with
/// [`LockError::Replication`]; it counts as having written (so the acquire also releases by
/// token, in the background, whatever the undo could not).
pub(crate) async fn confirmed<'a, F, Fut>(
    call: &'a ScriptCall,
    answer: Value,
    acked: usize,
    replicas: Replicas,
    run: F,
) -> Result<Value, Failed>
where
    F: FnOnce(&'a ScriptCall) -> Fut,
    Fut: Future<Output = Result<Value, Failed>>,
{
    if acked >= replicas.count {
        return Ok(answer);
    }
    let mut undone = false;
    if let Kind::Acquire { undo, .. } = &call.kind {
        let took = matches!(
            crate::scripts::Acquire::from_redis_value(answer.clone()),
            Ok(crate::scripts::Acquire::Acquired { .. })
        );
        if !took {
            // Held by another owner: nothing was written, and the answer stands.
            return Ok(answer);
        }
        undone = run(undo).await.is_ok();
    }
    Err(Failed {
        error: LockError::Replication {
            op: call.op,
            acked,
            needed: replicas.count,
            within: replicas.timeout,
        },
        reached: if undone {
            Reached::Refused
        } else {
            Reached::Answered
        },
    })
}

/// One script call: the script, its keys and arguments, and its [`Kind`].
pub(crate) struct ScriptCall {
    /// What it does, for errors and logs.
    pub(crate) op: &'static str,
    lua: &'static Lua,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
    pub(crate) kind: Kind,
}

impl ScriptCall {
    pub(crate) fn new(op: &'static str, lua: &'static Lua, kind: Kind) -> Self {
        Self {
            op,
            lua,
            keys: Vec::new(),
            args: Vec::new(),
            kind,
        }
    }

    pub(crate) fn key(&mut self, key: impl Into<String>) -> &mut Self {
        self.keys.push(key.into());
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// An owned copy of the call, for one server of a quorum (its kind is [`Kind::Read`]:
    /// the combining is the quorum's).
    pub(crate) fn detached(&self) -> Self {
        Self {
            op: self.op,
            lua: self.lua,
            keys: self.keys.clone(),
            args: self.args.clone(),
            kind: Kind::Read,
        }
    }

    /// [`detached`](Self::detached), with one more argument (a quorum's proposed fencing
    /// token).
    pub(crate) fn with_arg(&self, arg: impl ToRedisArgs) -> Self {
        let mut call = self.detached();
        call.arg(arg);
        call
    }

    /// The keys, in order.
    pub(crate) fn keys(&self) -> &[String] {
        &self.keys
    }

    /// `EVALSHA`: the script by its hash.
    pub(crate) fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", &self.lua.hash)
    }

    /// `EVAL`: the whole script, which also loads it (for a server that lost it: a restart, a
    /// `SCRIPT FLUSH`, a promoted replica).
    pub(crate) fn eval(&self) -> Cmd {
        self.command("EVAL", &self.lua.code)
    }

    fn command(&self, name: &str, script: &str) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script).arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(key.as_str());
        }
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }

    /// Sends `EVALSHA` through `send`, and `EVAL` once if the server does not know the script.
    /// Every distlock script may run twice: an acquire that finds its own token takes the key
    /// as it is, release and extend are idempotent.
    pub(crate) async fn run_with<'a, F, Fut>(&'a self, mut send: F) -> Result<Value, Failed>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, Failed>> + 'a,
    {
        match send(self.evalsha()).await {
            Err(failed) if failed.is_noscript() => send(self.eval()).await,
            answer => answer,
        }
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
pub(crate) type Messages = tokio::sync::mpsc::UnboundedReceiver<Message>;

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

/// `min_replicas`: how many replicas must acknowledge an acquire or extend, and how long to
/// wait for them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replicas {
    pub(crate) count: usize,
    pub(crate) timeout: Duration,
}
