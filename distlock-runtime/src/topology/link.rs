//! Talking to one server: a [`Link`] is one multiplexed connection, dialled again when it fails
//! (one dial shared by every call that needs it), every call bounded by a timeout; a failed try
//! is sent again as the link's retry policy says ([`Retry::link`]), and a `READONLY` answer
//! means what its [`Dial`] says. Every route talks to its servers through links, a cluster
//! through one per node.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Mutex;
use std::task::Poll;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, RedisResult, Value};
use tokio::time::Instant;

use super::connect::Timeouts;
use super::replicas::{Replicas, Replicated};
use crate::call::{BoxFuture, Confirm, ScriptCall};
use crate::error::{LockError, Misconfiguration, Reply};
use crate::failed::{failed, Failed, Reached};
use crate::ids::next_id;
use crate::retry::{Decision, Retry, Tried};
use crate::sync::lock;

/// One multiplexed connection, made by a [`Dial`] and made again when it fails: the way every
/// route but the cluster's talks to one server.
pub(crate) struct Link {
    pub(super) dial: Box<dyn Dial>,
    current: Mutex<Option<Current>>,
    timeouts: Timeouts,
    bounded_connections: bool,
    /// With `min_replicas`: the writes followed by `WAIT` go on connections of their own, as
    /// `WAIT` blocks the connection it runs on (see `replicas.rs`).
    replicated: Option<Replicated>,
    /// One dial at a time: the calls that need a connection meanwhile wait for it.
    dialing: Mutex<Dialing>,
    /// Notified when a dial ends.
    dialed: tokio::sync::Notify,
}

/// Where a link's dialing stands: when a server comes back, the many calls that found no
/// connection share one dial instead of each opening one of their own (a storm of connections
/// to a server that just restarted, all but one thrown away).
#[derive(Default)]
struct Dialing {
    /// A dial is out.
    busy: bool,
    /// Counts the dials that ended.
    ended: u64,
    /// Why the last dial failed (`None` when it succeeded): the calls that waited for it fail
    /// the same way, rather than each dialing again.
    failed: Option<LockError>,
}

/// Ends a dial (also when its future is dropped): wakes the calls that wait for it.
struct DialOut<'a>(&'a Link);

impl Drop for DialOut<'_> {
    fn drop(&mut self) {
        {
            let mut dialing = lock(&self.0.dialing);
            dialing.busy = false;
            dialing.ended += 1;
        }
        self.0.dialed.notify_waiters();
    }
}

/// How a [`Link`] opens its connection: from a pool, or to the primary Sentinel names.
pub(crate) trait Dial: Send + Sync + 'static {
    /// A fresh connection, ready for distlock's commands; bounded by the link's timeouts.
    fn dial(&self, op: &'static str) -> BoxFuture<'_, Result<MultiplexedConnection, LockError>>;

    /// What a `READONLY` answer on this link's connections means.
    fn read_only(&self) -> ReadOnly {
        ReadOnly::Replica
    }

    /// The server it reaches, as messages name it (without passwords).
    fn server(&self) -> String;
}

/// What a `READONLY` answer (a replica refused a write, before running it) means on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadOnly {
    /// The URL may name a replica: the call is sent once more on a fresh connection (a DNS name
    /// may have moved to the new primary of a managed failover); refused again, it is
    /// [`Misconfiguration::Replica`](crate::Misconfiguration::Replica).
    Replica,
    /// A failover demoted the primary: a fresh connection finds the new one (Sentinel). Sent
    /// once more there; refused again, an outage (the failover is still under way).
    Failover,
    /// The caller routes by itself (a cluster node): returned as it is.
    Routed,
}

/// How a request reaches a cluster node: as the slot map routes it, or after `ASKING` (an
/// `ASK` redirection to a node importing the slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hop {
    /// Where the slot map says.
    Direct,
    /// After `ASKING`, on the same connection.
    Asking,
}

impl Hop {
    /// A pipeline that takes this hop: `ASKING` first when asked.
    pub(super) fn pipe(self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        if self == Hop::Asking {
            pipe.cmd("ASKING");
        }
        pipe
    }

    /// The replies to a pipeline over this hop, after `ASKING`'s own, which is checked too: an
    /// ACL user without `+asking` is told so, not bounced between two nodes until the deadline.
    pub(super) fn answers(self, replies: Vec<Value>) -> RedisResult<std::vec::IntoIter<Value>> {
        let mut replies = replies.into_iter();
        if self == Hop::Asking {
            replies.next().unwrap_or(Value::Nil).extract_error()?;
        }
        Ok(replies)
    }

    /// Sends `cmd` on `conn` over this hop: its answer, or its error.
    async fn send(self, mut conn: MultiplexedConnection, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Hop::Direct => conn.send_packed_command(cmd).await,
            Hop::Asking => {
                let mut pipe = self.pipe();
                pipe.add_command(cmd.clone());
                let replies = conn.send_packed_commands(&pipe, 0, 2).await?;
                Ok(self.answers(replies)?.next().unwrap_or(Value::Nil))
            }
        }
        .and_then(Value::extract_error)
    }
}

/// What a link sends: a command, or a script call by its hash (sent whole, `EVAL`, once the
/// server lost the script), over a hop.
pub(super) struct Request<'a> {
    pub(super) op: &'static str,
    pub(super) cmd: Cow<'a, Cmd>,
    /// The script call `cmd` makes by the script's hash, until it is sent whole.
    call: Option<&'a ScriptCall>,
    pub(super) hop: Hop,
}

impl<'a> Request<'a> {
    pub(super) fn script(call: &'a ScriptCall, hop: Hop) -> Self {
        let (op, cmd, call) = (call.op, Cow::Borrowed(call.evalsha()), Some(call));
        Self { op, cmd, call, hop }
    }

    /// Sends the whole script from now on (`EVAL`, which also loads it): whether there is one.
    pub(super) fn reload(&mut self) -> bool {
        let reloaded = self.call.take().map(ScriptCall::eval);
        reloaded.map(|eval| self.cmd = Cow::Owned(eval)).is_some()
    }
}

/// A link's connection; handed to a call with whether it was kept from an earlier call.
#[derive(Clone)]
struct Current {
    generation: u64,
    conn: MultiplexedConnection,
}

impl Link {
    /// `bounded_connections`: the connections `dial` opens have `timeouts.response` as their
    /// own response timeout, so no second timer is needed per call.
    pub(crate) fn new(
        dial: Box<dyn Dial>,
        timeouts: Timeouts,
        bounded_connections: bool,
        replicas: Option<Replicas>,
    ) -> Self {
        Self {
            dial,
            current: Mutex::new(None),
            timeouts,
            bounded_connections,
            replicated: replicas.map(Replicated::new),
            dialing: Mutex::new(Dialing::default()),
            dialed: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Whether a `READONLY` answer is worth one more try, on a fresh connection that may reach
    /// the primary (not on a cluster node, whose caller routes by itself).
    pub(super) fn retries_read_only(&self) -> bool {
        self.dial.read_only() != ReadOnly::Routed
    }

    /// Whether writes wait for replicas (`min_replicas`).
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicated.is_some()
    }

    /// Runs a script call (`EVALSHA`, and `EVAL` if the server lost the script); with
    /// `min_replicas`, a write waits for its replicas.
    pub(crate) async fn run(&self, call: &ScriptCall) -> Result<Value, Failed> {
        self.run_via(call, Hop::Direct).await
    }

    /// [`run`](Self::run) over `hop` (a cluster node accepts a call for a slot it imports
    /// after `ASKING`).
    pub(crate) async fn run_via(&self, call: &ScriptCall, hop: Hop) -> Result<Value, Failed> {
        match &self.replicated {
            Some(replicated) if !matches!(call.confirm, Confirm::No) => {
                Box::pin(replicated.run(self, call, hop)).await
            }
            _ => self.send(Request::script(call, hop)).await,
        }
    }

    /// Sends one command (see [`send`](Self::send)).
    pub(crate) async fn query(&self, op: &'static str, cmd: &Cmd) -> Result<Value, Failed> {
        let (cmd, call, hop) = (Cow::Borrowed(cmd), None, Hop::Direct);
        self.send(Request { op, cmd, call, hop }).await
    }

    /// Sends `request`, each try bounded by the response timeout (and the dial's timeouts when a
    /// connection must be opened first), and tries again as the link's policy
    /// ([`Retry::link`]) says.
    ///
    /// A connection kept from an earlier call may have died while idle (a server restart, an
    /// idle timeout): when it fails at once, the request is sent once more on a fresh
    /// connection. Every distlock script is safe to repeat (an acquire by the same token takes
    /// its own keys again; release and extend are idempotent).
    pub(super) async fn send(&self, mut request: Request<'_>) -> Result<Value, Failed> {
        // Set at the first refusal for a passing reason: the tries after it share what is left
        // of a response timeout. (Most calls never need it: no clock read for them.)
        let mut deadline: Option<Instant> = None;
        let mut tried = Tried::default();
        // Whether an earlier try may have reached Redis.
        let mut sent = Reached::No;
        // Set once a try was refused for a passing reason: the tries after it end by the
        // deadline, and one cut short by it reports that refusal.
        let mut passing: Option<redis::RedisError> = None;
        loop {
            let (answer, unsent, generation) = match self.connection(request.op).await {
                Ok((current, reused)) => {
                    tried.kept = reused;
                    let until = deadline.filter(|_| passing.is_some());
                    let (answer, unsent) = self.try_on(current.conn, &request, until).await;
                    (answer, unsent, Some(current.generation))
                }
                Err(error) => {
                    let reached = Reached::No;
                    (Err(Failed { error, reached }), false, None)
                }
            };
            let failed = match answer {
                Ok(value) => return Ok(value),
                Err(failed) => failed,
            };
            let now = Instant::now();
            let until = deadline.unwrap_or(now + self.timeouts.response);
            let decision =
                Retry::link(until, self.retries_read_only()).decide(&failed, &mut tried, now);
            if let Some(generation) = generation {
                // Broken, stuck behind a hung server, or a replica's: send nothing more on it.
                if failed.reached == Reached::Maybe || decision == Decision::Reconnect {
                    self.forget(generation);
                }
            }
            if failed.reached == Reached::Maybe && !unsent {
                sent = Reached::Maybe;
            }
            match decision {
                Decision::After(pause) => {
                    // Refused while connecting (BUSY, LOADING), or after it: again shortly.
                    deadline = Some(until);
                    if generation.is_some() {
                        passing = failed.error.redis_source().cloned();
                    }
                    tokio::time::sleep(pause).await;
                }
                Decision::Reconnect => {}
                // The server answers again: the whole script goes as a request of its own.
                Decision::Reload if request.reload() => {
                    (deadline, passing, tried) = (None, None, Tried::default());
                }
                _ => {
                    let reached = failed.reached.after(sent, unsent);
                    return Err(self.gave_up(Failed { reached, ..failed }, passing));
                }
            }
        }
    }

    /// One try of `request` on `conn`, within `until` when given (after a passing refusal),
    /// else the response timeout; and whether it failed before it was sent.
    async fn try_on(
        &self,
        conn: MultiplexedConnection,
        request: &Request<'_>,
        until: Option<Instant>,
    ) -> (Result<Value, Failed>, bool) {
        let (op, after) = (request.op, self.timeouts.response);
        let mut call = std::pin::pin!(request.hop.send(conn, &request.cmd));
        // A connection whose driver has already stopped (the server closed it) fails the
        // request at its first poll, before handing it over: then it was never sent.
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        let unsent = matches!(&first, Poll::Ready(Err(e)) if Reply::of(e) == Reply::Connection);
        let answer = match first {
            Poll::Ready(answer) => Some(answer),
            Poll::Pending => match until {
                Some(until) => tokio::time::timeout_at(until, call).await.ok(),
                None if self.bounded_connections => Some(call.await),
                None => tokio::time::timeout(after, call).await.ok(),
            },
        };
        let answer = match answer {
            Some(answer) => answer.map_err(|source| failed(op, source, after)),
            None => Err(Failed::maybe(LockError::RedisTimeout { op, after })),
        };
        (answer, unsent)
    }

    /// What a request that is not sent again fails with: cut short while the server kept
    /// refusing (it answers, slowly: loading), that refusal; a redirection or `CROSSSLOT` on a
    /// link that does not route, or `SELECT` refused, [`Misconfiguration::ClusterNode`] (the
    /// URL names a cluster node, which no retry cures); a `READONLY` on a URL that may name a
    /// replica (a fresh connection did not cure it), [`Misconfiguration::Replica`].
    pub(super) fn gave_up(&self, failed: Failed, passing: Option<redis::RedisError>) -> Failed {
        use Misconfiguration::{ClusterNode, Replica};
        let read_only = self.dial.read_only();
        let problem = match failed.reply() {
            Some(Reply::Redirect(_) | Reply::CrossSlot) if read_only != ReadOnly::Routed => {
                Some(ClusterNode)
            }
            Some(Reply::Refused(ClusterNode)) => Some(ClusterNode),
            Some(Reply::ReadOnly) if read_only == ReadOnly::Replica => Some(Replica),
            _ => None,
        };
        let error = match (failed.error, passing, problem) {
            (LockError::RedisTimeout { op, .. }, Some(source), _) => {
                LockError::from_redis(op, source)
            }
            (
                LockError::Redis { op, source } | LockError::Misconfigured { op, source, .. },
                _,
                Some(problem),
            ) => {
                let server = self.dial.server();
                let detail = match problem {
                    ClusterNode => format!("the server at {server} is a Redis Cluster node"),
                    _ => String::new(),
                };
                LockError::Misconfigured {
                    op,
                    problem,
                    detail,
                    source,
                }
            }
            (error, ..) => error,
        };
        Failed { error, ..failed }
    }

    async fn connection(&self, op: &'static str) -> Result<(Current, bool), LockError> {
        if let Some(current) = &*lock(&self.current) {
            return Ok((current.clone(), true));
        }
        // Rare (first call, reconnect) and large: keep it out of every lock future.
        Box::pin(self.connect(op)).await.map(|fresh| (fresh, false))
    }

    /// Dials a fresh connection and makes it the current one; or, while another call dials,
    /// waits for that dial (within the dial's own bound) and shares its connection or its
    /// failure.
    async fn connect(&self, op: &'static str) -> Result<Current, LockError> {
        // As long as a dial may take: connecting (out of a pool) and its handshake.
        let waited_for = self.timeouts.connect + self.timeouts.pool_wait + self.timeouts.response;
        let until = tokio::time::Instant::now() + waited_for;
        loop {
            if let Some(existing) = &*lock(&self.current) {
                return Ok(existing.clone());
            }
            let ended = self.dialed.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let other = {
                let mut dialing = lock(&self.dialing);
                let other = dialing.busy.then_some(dialing.ended);
                dialing.busy = true;
                other
            };
            let Some(round) = other else {
                return self.dial_now(op).await;
            };
            tokio::select! {
                () = ended => {}
                () = tokio::time::sleep_until(until) => {
                    return Err(LockError::RedisTimeout { op, after: waited_for });
                }
            }
            let dialing = lock(&self.dialing);
            if dialing.ended > round {
                if let Some(failed) = &dialing.failed {
                    return Err(failed.clone().with_op(op));
                }
            }
        }
    }

    /// The dial itself (this call set `dialing.busy`).
    async fn dial_now(&self, op: &'static str) -> Result<Current, LockError> {
        // An earlier dial's failure is not this one's: were this one dropped half way, its
        // waiters must dial again, not fail the old way.
        lock(&self.dialing).failed = None;
        let _out = DialOut(self);
        let conn = (self.dial.dial(op).await)
            .inspect_err(|error| lock(&self.dialing).failed = Some(error.clone()))?;
        let mut current = lock(&self.current);
        // One may have been made meanwhile by a call that did not wait (a failover's forget and
        // redial).
        let generation = next_id();
        Ok(current.get_or_insert(Current { generation, conn }).clone())
    }

    /// Stops using the connection of `generation`, unless it was already replaced; the spare
    /// connections for replicated writes go with it (they most likely died the same way).
    fn forget(&self, generation: u64) {
        let forgotten = lock(&self.current).take_if(|c| c.generation == generation);
        if forgotten.is_some() {
            self.forget_spare();
        }
    }

    /// The keys matching `pattern` on this server, by `SCAN` (never `KEYS`), each call bounded
    /// by the response timeout.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, LockError> {
        let mut found = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg((cursor, "MATCH", pattern, "COUNT", 1000));
            let answer = self.query("scan", &cmd).await.map_err(|f| f.error)?;
            let (next, keys): (u64, Vec<String>) = redis::FromRedisValue::from_redis_value(answer)
                .map_err(|e| LockError::Redis {
                    op: "scan",
                    source: e.into(),
                })?;
            found.extend(keys);
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// Stops using the current connection and the spare ones: the next call dials anew (a
    /// failover happened).
    pub(crate) fn forget_current(&self) {
        *lock(&self.current) = None;
        self.forget_spare();
    }

    fn forget_spare(&self) {
        if let Some(replicated) = &self.replicated {
            replicated.forget_spare();
        }
    }
}

/// Why a deployment with `min_replicas` refuses fair requests: nothing confirms a hand-off on
/// the replicas.
pub(crate) const FAIR_WITH_REPLICAS: &str = "fair requests cannot be combined with min_replicas: \
    a fair lock is handed to its next waiter by the release script, and nothing confirms that \
    hand-off on the replicas before the waiter's body starts, so a failover could give the lock \
    to someone else too; use unfair requests with min_replicas, or fair ones without it";
