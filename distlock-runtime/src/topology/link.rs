//! Talking to one server: a [`Link`] is one multiplexed connection, dialled again when it fails
//! (one dial shared by every call that needs it), every call bounded by a timeout; a request
//! refused for a passing reason is sent again, and a `READONLY` answer means what its [`Dial`]
//! says. Every route talks to its servers through links, a cluster through one per node.

use std::future::Future;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};

use super::connect::Timeouts;
use super::replicas::{Primary, Replicas, Replicated};
use crate::call::{BoxFuture, Confirm, ScriptCall};
use crate::error::{LockError, Misconfiguration, Reply};
use crate::failed::{failed, is_connection_failure, Failed, Reached, PASSING_RETRY};
use crate::ids::next_id;
use crate::sync::lock;

/// One multiplexed connection, made by a [`Dial`] and made again when it fails: the way every
/// route but the cluster's talks to one server.
pub(crate) struct Link {
    dial: Box<dyn Dial>,
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

/// Which connection a call used, and whether it was kept from an earlier call.
struct Checkout {
    generation: u64,
    reused: bool,
}

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

    /// Whether writes wait for replicas (`min_replicas`).
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicated.is_some()
    }

    /// Runs a script call (`EVALSHA`, and `EVAL` if the server lost the script); with
    /// `min_replicas`, a write waits for its replicas.
    pub(crate) async fn run(&self, call: &ScriptCall) -> Result<Value, Failed> {
        self.run_as(call, false).await
    }

    /// [`run`](Self::run), preceded by `ASKING` on the same connection: a cluster node accepts
    /// one command for a slot it is importing so.
    pub(crate) async fn run_asking(&self, call: &ScriptCall) -> Result<Value, Failed> {
        self.run_as(call, true).await
    }

    async fn run_as(&self, call: &ScriptCall, asking: bool) -> Result<Value, Failed> {
        match &self.replicated {
            Some(replicated) if !matches!(call.confirm, Confirm::No) => {
                Box::pin(replicated.run(self, call, asking)).await
            }
            _ => self.run_plain(call, asking).await,
        }
    }

    /// Runs `call`: `EVALSHA`, and `EVAL` if the server lost the script.
    async fn run_plain(&self, call: &ScriptCall, asking: bool) -> Result<Value, Failed> {
        call.run_with(|cmd| async move { self.send(call.op, &cmd, asking).await })
            .await
    }

    /// Sends one command, bounded by the response timeout (and the dial's timeouts when a
    /// connection must be opened first).
    ///
    /// A connection kept from an earlier call may have died while idle (a server restart, an
    /// idle timeout): when it fails at once, the command is sent once more on a fresh
    /// connection. Every distlock script is safe to repeat (an acquire by the same token takes
    /// its own keys again; release and extend are idempotent).
    pub(crate) async fn query(&self, op: &'static str, cmd: &Cmd) -> Result<Value, Failed> {
        self.send(op, cmd, false).await
    }

    /// [`query`](Self::query), preceded by `ASKING` when `asking`.
    async fn send(&self, op: &'static str, cmd: &Cmd, asking: bool) -> Result<Value, Failed> {
        let after = self.timeouts.response;
        // Set at the first refusal for a passing reason: the tries after it share what is left
        // of a response timeout. (Most calls never need it: no clock read for them.)
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut may_retry = true;
        let mut read_only_retry = self.dial.read_only() != ReadOnly::Routed;
        // Whether an earlier try may have reached Redis.
        let mut sent = Reached::No;
        // Set once a try was refused for a passing reason: the tries after it share what is
        // left of the response timeout, and one cut short by it reports that refusal.
        let mut passing: Option<redis::RedisError> = None;
        loop {
            let (checkout, mut conn) = match self.connection(op).await {
                Ok(connection) => connection,
                Err(error) => {
                    let refused = error
                        .redis_source()
                        .is_some_and(|source| Reply::of(source) == Reply::Passing);
                    let now = tokio::time::Instant::now();
                    let deadline = *deadline.get_or_insert(now + after);
                    if refused && now + PASSING_RETRY < deadline {
                        // Refused while connecting (BUSY, LOADING): again shortly.
                        tokio::time::sleep(PASSING_RETRY).await;
                        continue;
                    }
                    // A dial cut short after the server kept refusing: that refusal.
                    let error = match (passing.take(), error) {
                        (Some(source), LockError::RedisTimeout { .. }) => {
                            LockError::from_redis(op, source)
                        }
                        // A cluster node refused the URL's database (`SELECT`): say which.
                        (
                            _,
                            LockError::Misconfigured {
                                op,
                                problem: problem @ Misconfiguration::ClusterNode,
                                source,
                                ..
                            },
                        ) => LockError::Misconfigured {
                            op,
                            problem,
                            detail: self.cluster_node_detail(),
                            source,
                        },
                        (_, error) => error,
                    };
                    return Err(Failed {
                        error,
                        reached: sent,
                    });
                }
            };
            let mut call = std::pin::pin!(async {
                if asking {
                    let mut pipe = redis::pipe();
                    pipe.cmd("ASKING").add_command(cmd.clone());
                    // ASKING's own reply too: an ACL user without `+asking` is told so, not
                    // bounced between the two nodes until the deadline.
                    conn.send_packed_commands(&pipe, 0, 2)
                        .await
                        .and_then(|answers| {
                            let mut answers = answers.into_iter();
                            answers.next().unwrap_or(Value::Nil).extract_error()?;
                            Ok(answers.next().unwrap_or(Value::Nil))
                        })
                } else {
                    conn.send_packed_command(cmd).await
                }
                .and_then(Value::extract_error)
            });
            // A connection whose driver has already stopped (the server closed it) fails the
            // request at its first poll, before handing it over: then it was never sent.
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            let unsent = matches!(&first, Poll::Ready(Err(e)) if is_connection_failure(e));
            let answer = match first {
                Poll::Ready(answer) => Some(answer),
                Poll::Pending if passing.is_some() => match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline, call).await.ok(),
                    None => tokio::time::timeout(after, call).await.ok(),
                },
                Poll::Pending if self.bounded_connections => Some(call.await),
                Poll::Pending => tokio::time::timeout(after, call).await.ok(),
            };
            // How far this try got: one whose request never left got as far as those before it.
            let settle = |mut failed: Failed| {
                failed.reached = if unsent && failed.reached == Reached::Maybe {
                    sent
                } else {
                    failed.reached.max_with(sent)
                };
                failed
            };
            match answer {
                Some(Ok(value)) => return Ok(value),
                Some(Err(source)) if source.is_timeout() => {
                    // The connection's own response timeout fired.
                    self.forget(checkout.generation);
                    return Err(settle(failed(op, source, after)));
                }
                Some(Err(source)) => {
                    let reply = Reply::of(&source);
                    if reply == Reply::ReadOnly && read_only_retry {
                        // A replica refused it before running it: once more on a fresh
                        // connection, which may reach the primary.
                        self.forget(checkout.generation);
                        read_only_retry = false;
                        continue;
                    }
                    let now = tokio::time::Instant::now();
                    let deadline = *deadline.get_or_insert(now + after);
                    if reply == Reply::Passing && now + PASSING_RETRY < deadline {
                        // Refused before it ran, for a passing reason (LOADING, BUSY,
                        // MASTERDOWN): again shortly, on the same connection.
                        passing = Some(source);
                        tokio::time::sleep(PASSING_RETRY).await;
                        continue;
                    }
                    if matches!(reply, Reply::Redirect | Reply::CrossSlot)
                        && self.dial.read_only() != ReadOnly::Routed
                    {
                        return Err(settle(self.cluster_node(op, source)));
                    }
                    if reply != Reply::Connection {
                        return Err(self.refused_read_only(settle(failed(op, source, after))));
                    }
                    self.forget(checkout.generation);
                    if !(checkout.reused && may_retry) {
                        return Err(settle(failed(op, source, after)));
                    }
                    may_retry = false;
                    if !unsent {
                        sent = Reached::Maybe;
                    }
                }
                None => {
                    // The connection may be stuck behind a hung server: send nothing more on it.
                    self.forget(checkout.generation);
                    // Cut short while the server kept refusing (it answers, slowly: loading):
                    // that refusal is what the caller should hear of.
                    let error = match passing.take() {
                        Some(source) => LockError::from_redis(op, source),
                        None => LockError::RedisTimeout { op, after },
                    };
                    return Err(settle(Failed {
                        error,
                        reached: Reached::Maybe,
                    }));
                }
            }
        }
    }

    /// A `READONLY` refusal that a fresh connection did not cure: on a URL that names a
    /// replica, [`Misconfiguration::Replica`](crate::Misconfiguration::Replica).
    fn refused_read_only(&self, failed: Failed) -> Failed {
        match failed.error {
            LockError::Redis { op, source }
                if Reply::of(&source) == Reply::ReadOnly
                    && self.dial.read_only() == ReadOnly::Replica =>
            {
                Failed {
                    error: LockError::Misconfigured {
                        op,
                        problem: Misconfiguration::Replica,
                        detail: String::new(),
                        source,
                    },
                    reached: failed.reached,
                }
            }
            error => Failed { error, ..failed },
        }
    }

    /// A redirection (`MOVED`, `ASK`) or a `CROSSSLOT` refusal on a link that does not route:
    /// the URL names a Redis Cluster node, which no retry cures.
    fn cluster_node(&self, op: &'static str, source: redis::RedisError) -> Failed {
        Failed {
            error: LockError::Misconfigured {
                op,
                problem: Misconfiguration::ClusterNode,
                detail: self.cluster_node_detail(),
                source,
            },
            // Refused before the script ran: nothing was written.
            reached: Reached::Refused,
        }
    }

    /// [`Misconfiguration::ClusterNode`]'s detail: which server it is.
    fn cluster_node_detail(&self) -> String {
        format!(
            "the server at {} is a Redis Cluster node",
            self.dial.server()
        )
    }

    async fn connection(
        &self,
        op: &'static str,
    ) -> Result<(Checkout, MultiplexedConnection), LockError> {
        if let Some(current) = &*lock(&self.current) {
            let checkout = Checkout {
                generation: current.generation,
                reused: true,
            };
            return Ok((checkout, current.conn.clone()));
        }
        // Rare (first call, reconnect) and large: keep it out of every lock future.
        Box::pin(self.connect(op)).await
    }

    /// Dials a fresh connection and makes it the current one; or, while another call dials,
    /// waits for that dial (within the dial's own bound) and shares its connection or its
    /// failure.
    async fn connect(
        &self,
        op: &'static str,
    ) -> Result<(Checkout, MultiplexedConnection), LockError> {
        // As long as a dial may take: connecting (out of a pool) and its handshake.
        let waited_for = self.timeouts.connect + self.timeouts.pool_wait + self.timeouts.response;
        let until = tokio::time::Instant::now() + waited_for;
        loop {
            if let Some(existing) = &*lock(&self.current) {
                let checkout = Checkout {
                    generation: existing.generation,
                    reused: false,
                };
                return Ok((checkout, existing.conn.clone()));
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
    async fn dial_now(
        &self,
        op: &'static str,
    ) -> Result<(Checkout, MultiplexedConnection), LockError> {
        // An earlier dial's failure is not this one's: were this one dropped half way, its
        // waiters must dial again, not fail the old way.
        lock(&self.dialing).failed = None;
        let _out = DialOut(self);
        let conn = match self.dial.dial(op).await {
            Ok(conn) => conn,
            Err(error) => {
                lock(&self.dialing).failed = Some(error.clone());
                return Err(error);
            }
        };
        let mut current = lock(&self.current);
        if let Some(existing) = &*current {
            // Made meanwhile by a call that did not wait (a failover's forget and redial).
            let checkout = Checkout {
                generation: existing.generation,
                reused: false,
            };
            return Ok((checkout, existing.conn.clone()));
        }
        let generation = next_id();
        *current = Some(Current {
            generation,
            conn: conn.clone(),
        });
        let checkout = Checkout {
            generation,
            reused: false,
        };
        Ok((checkout, conn))
    }

    /// Stops using the connection of `generation`, unless it was already replaced; the spare
    /// connections for replicated writes go with it (they most likely died the same way).
    fn forget(&self, generation: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            *current = None;
            drop(current);
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
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
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

impl Primary for Link {
    fn dial_fresh<'a>(
        &'a self,
        op: &'static str,
    ) -> BoxFuture<'a, Result<MultiplexedConnection, LockError>> {
        self.dial.dial(op)
    }

    fn retries_read_only(&self) -> bool {
        self.dial.read_only() != ReadOnly::Routed
    }

    fn forget_current(&self) {
        Link::forget_current(self);
    }

    fn refused_read_only(&self, failed: Failed) -> Failed {
        Link::refused_read_only(self, failed)
    }

    fn run_plain<'a>(
        &'a self,
        call: &'a ScriptCall,
        asking: bool,
    ) -> BoxFuture<'a, Result<Value, Failed>> {
        Box::pin(Link::run_plain(self, call, asking))
    }

    fn response_timeout(&self) -> Duration {
        self.timeouts.response
    }
}

/// Why a deployment with `min_replicas` refuses fair requests: nothing confirms a hand-off on
/// the replicas.
pub(crate) const FAIR_WITH_REPLICAS: &str = "fair requests cannot be combined with min_replicas: \
    a fair lock is handed to its next waiter by the release script, and nothing confirms that \
    hand-off on the replicas before the waiter's body starts, so a failover could give the lock \
    to someone else too; use unfair requests with min_replicas, or fair ones without it";
