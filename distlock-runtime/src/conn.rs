//! Talking to one Redis server: a [`Link`] (one multiplexed connection, dialled again when it
//! fails, every call bounded by a timeout), what a failed call tells ([`Failed`]), and the
//! helpers every route shares (URL parsing without leaking the password, the pool the builder
//! creates, error classes).

use std::future::Future;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use deadpool_redis::{Pool, PoolError, Runtime};
use redis::aio::MultiplexedConnection;
use redis::{Cmd, Value};

use crate::call::{
    failed, is_connection_failure, ran, BoxFuture, Failed, Reached, Replicas, ScriptCall,
};
use crate::error::{LockError, Reply};
use crate::tls::Tls;

/// The timeouts every Redis call is bounded by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
    pub(crate) pool_wait: Duration,
}

/// One multiplexed connection, made by a [`Dial`] and made again when it fails: the way every
/// route but the cluster's talks to one server.
pub(crate) struct Link {
    dial: Box<dyn Dial>,
    current: Mutex<Option<Current>>,
    timeouts: Timeouts,
    bounded_connections: bool,
    replicas: Option<Replicas>,
    /// With `min_replicas`: connections of their own for the writes followed by `WAIT`, which
    /// blocks the connection it runs on (see [`Link::run_replicated`]).
    spare: Mutex<Spare>,
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

/// Idle connections for replicated writes, and a count of failovers: a connection checked out
/// before a failover is not put back after it.
#[derive(Default)]
struct Spare {
    idle: Vec<MultiplexedConnection>,
    generation: u64,
}

/// Most idle connections kept for writes that wait for replicas.
const MAX_SPARE: usize = 8;

/// The pause before a request refused for a passing reason (`LOADING`, `BUSY`, `MASTERDOWN`)
/// is sent again.
const PASSING_RETRY: Duration = Duration::from_millis(20);

/// How a [`Link`] opens its connection: from a pool, or to the primary Sentinel names.
pub(crate) trait Dial: Send + Sync + 'static {
    /// A fresh connection, ready for distlock's commands; bounded by the link's timeouts.
    fn dial(&self, op: &'static str) -> BoxFuture<'_, Result<MultiplexedConnection, LockError>>;

    /// What a `READONLY` answer on this link's connections means.
    fn read_only(&self) -> ReadOnly {
        ReadOnly::Replica
    }
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
            replicas,
            spare: Mutex::new(Spare::default()),
            dialing: Mutex::new(Dialing::default()),
            dialed: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Whether writes wait for replicas (`min_replicas`).
    pub(crate) fn waits_for_replicas(&self) -> bool {
        self.replicas.is_some()
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
        match self.replicas {
            Some(replicas) if call.kind.needs_replicas() => {
                Box::pin(self.run_replicated(call, replicas, asking)).await
            }
            _ => self.run_plain(call, asking).await,
        }
    }

    /// Runs `call`: `EVALSHA`, and `EVAL` if the server lost the script.
    async fn run_plain(&self, call: &ScriptCall, asking: bool) -> Result<Value, Failed> {
        match self.send(call.op, call.evalsha(), asking).await {
            Err(failed) if failed.is_noscript() => self.send(call.op, &call.eval(), asking).await,
            answer => answer,
        }
    }

    /// Runs a write and `WAIT`s for `replicas` in one pipeline, on a connection of its own:
    /// `WAIT` blocks the connection it runs on until the replicas answer or its timeout passes,
    /// and on the shared multiplexed connection every other lock's commands would queue behind
    /// it. Such connections are kept (up to [`MAX_SPARE`]) for the next replicated write; a
    /// write that the replicas did not confirm is undone (see `topology::confirmed`).
    async fn run_replicated(
        &self,
        call: &ScriptCall,
        replicas: Replicas,
        asking: bool,
    ) -> Result<Value, Failed> {
        match self.run_replicated_once(call, replicas, asking).await {
            // A replica refused it before running it: once more on a fresh connection, which
            // may reach the primary.
            Err(failed) if failed.is_read_only() && self.dial.read_only() != ReadOnly::Routed => {
                self.forget_current();
                self.run_replicated_once(call, replicas, asking)
                    .await
                    .map_err(|failed| self.refused_read_only(failed))
            }
            answer => answer,
        }
    }

    async fn run_replicated_once(
        &self,
        call: &ScriptCall,
        replicas: Replicas,
        asking: bool,
    ) -> Result<Value, Failed> {
        let op = call.op;
        let (spare, generation) = {
            let mut spare = lock(&self.spare);
            (spare.idle.pop(), spare.generation)
        };
        let kept = spare.is_some();
        let conn = match spare {
            Some(conn) => conn,
            None => self.dial.dial(op).await.map_err(|error| Failed {
                error,
                reached: Reached::No,
            })?,
        };
        match self
            .send_replicated(call, replicas, asking, conn, generation)
            .await
        {
            // A kept connection that died while idle (a server restart): once more, on a
            // fresh one. It may have been sent: an acquire by the same token takes its own
            // keys again, release and extend are idempotent.
            Err(failed) if kept && failed.broke_connection() => {
                let conn = self.dial.dial(op).await.map_err(|error| Failed {
                    error,
                    reached: Reached::Maybe,
                })?;
                self.send_replicated(call, replicas, asking, conn, generation)
                    .await
                    .map_err(|retried| Failed {
                        reached: match retried.reached {
                            Reached::No | Reached::Refused => Reached::Maybe,
                            reached => reached,
                        },
                        ..retried
                    })
            }
            answer => answer,
        }
    }

    /// Sends a write and its `WAIT` on `conn` (and `ASKING` first when `asking`), keeps the
    /// connection for the next replicated write, and undoes an acquire the replicas did not
    /// confirm. A request refused for a passing reason (`LOADING`, `BUSY`) is sent again on it,
    /// 20 ms apart, within the response timeout.
    async fn send_replicated(
        &self,
        call: &ScriptCall,
        replicas: Replicas,
        asking: bool,
        mut conn: MultiplexedConnection,
        generation: u64,
    ) -> Result<Value, Failed> {
        let op = call.op;
        let after = self.timeouts.response + replicas.timeout;
        conn.set_response_timeout(after);
        let until = tokio::time::Instant::now() + self.timeouts.response;
        let answer = loop {
            let answer = call
                .run_with(|cmd| {
                    let mut pipe = redis::pipe();
                    if asking {
                        pipe.cmd("ASKING");
                    }
                    pipe.add_command(cmd)
                        .cmd("WAIT")
                        .arg(replicas.count)
                        .arg(millis(replicas.timeout));
                    let mut conn = conn.clone();
                    async move {
                        let count = if asking { 3 } else { 2 };
                        let sent = conn.send_packed_commands(&pipe, 0, count);
                        match tokio::time::timeout(after, sent).await {
                            // Each reply on its own: a script's error (MOVED, NOSCRIPT,
                            // WRONGTYPE, ...) as the server error it is, not a pipeline's.
                            Ok(Ok(values)) => replicated_answer(op, values, asking, after),
                            Ok(Err(source)) => Err(failed(op, source, after)),
                            Err(_) => Err(Failed {
                                error: LockError::RedisTimeout { op, after },
                                reached: Reached::Maybe,
                            }),
                        }
                    }
                })
                .await;
            match answer {
                Err(failed)
                    if failed.is_passing()
                        && tokio::time::Instant::now() + PASSING_RETRY < until =>
                {
                    tokio::time::sleep(PASSING_RETRY).await;
                }
                answer => break answer?,
            }
        };
        {
            let mut spare = lock(&self.spare);
            if spare.idle.len() < MAX_SPARE && spare.generation == generation {
                spare.idle.push(conn);
            }
        }
        crate::call::confirmed(call, answer, replicas, |undo| async move {
            self.run_plain(&undo, asking).await
        })
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
            let failed = |error| Failed {
                error,
                reached: if unsent { sent } else { Reached::Maybe },
            };
            match answer {
                Some(Ok(value)) => return Ok(value),
                Some(Err(source)) if source.is_timeout() => {
                    // The connection's own response timeout fired.
                    self.forget(checkout.generation);
                    return Err(failed(LockError::RedisTimeout { op, after }));
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
                    if reply != Reply::Connection {
                        let reached = if ran(&source) {
                            Reached::Answered
                        } else {
                            Reached::Refused
                        };
                        let failed = Failed {
                            error: LockError::from_redis(op, source),
                            reached: reached.max_with(sent),
                        };
                        return Err(self.refused_read_only(failed));
                    }
                    self.forget(checkout.generation);
                    if !(checkout.reused && may_retry) {
                        return Err(failed(LockError::Redis { op, source }));
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
                    return Err(failed(error));
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
                        problem: crate::error::Misconfiguration::Replica,
                        detail: String::new(),
                        source,
                    },
                    reached: failed.reached,
                }
            }
            error => Failed { error, ..failed },
        }
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
            let mut spare = lock(&self.spare);
            spare.idle.clear();
            spare.generation += 1;
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
        let mut spare = lock(&self.spare);
        spare.idle.clear();
        spare.generation += 1;
    }
}

/// Takes a connection out of `pool` for good and selects its database: how a standalone link
/// (and each quorum node) dials.
///
/// deadpool-redis checks a connection out by sending `UNWATCH` + `PING` first, which would
/// double the round trips of every lock operation. redis-rs's multiplexed connection is made to
/// be shared by many tasks at once, so the link takes one connection out of the pool for good
/// (`Connection::take`: the pool may open another in its place) and sends all its commands on
/// it, pipelined. Taking it out, rather than sharing a pooled one, keeps other users of the pool
/// from changing its state (`SELECT`, `MULTI`) under the manager; it is `SELECT`ed to the
/// database of its connection info when taken.
pub(crate) async fn take_from_pool(
    pool: &Pool,
    timeouts: Timeouts,
    op: &'static str,
) -> Result<MultiplexedConnection, LockError> {
    let after = timeouts.pool_wait + timeouts.connect;
    let pooled = match tokio::time::timeout(after, pool.get()).await {
        Ok(Ok(pooled)) => pooled,
        Ok(Err(PoolError::Backend(source))) if source.is_timeout() => {
            return Err(LockError::RedisTimeout {
                op,
                after: timeouts.connect,
            })
        }
        Ok(Err(PoolError::Backend(source))) => return Err(LockError::from_redis(op, source)),
        Ok(Err(PoolError::Timeout(_))) | Err(_) => {
            return Err(LockError::RedisTimeout { op, after })
        }
        Ok(Err(other)) => {
            let source = redis::RedisError::from((
                redis::ErrorKind::Client,
                "connection pool",
                other.to_string(),
            ));
            return Err(LockError::Redis { op, source });
        }
    };
    let mut conn = deadpool_redis::Connection::take(pooled);
    // A pooled connection may have been switched to another database by its last user.
    let db = redis::aio::ConnectionLike::get_db(&conn);
    let mut select = redis::cmd("SELECT");
    select.arg(db);
    match tokio::time::timeout(timeouts.response, select.exec_async(&mut conn)).await {
        Ok(Ok(())) => Ok(conn),
        Ok(Err(source)) => Err(LockError::from_redis(op, source)),
        Err(_) => Err(LockError::RedisTimeout {
            op,
            after: timeouts.response,
        }),
    }
}

/// A process-wide unique number (connection generations, manager identities).
pub(crate) fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The replies to `[ASKING,] script, WAIT` as `[answer, replicas]`, or the first error among
/// `ASKING`'s and the script's.
fn replicated_answer(
    op: &'static str,
    mut values: Vec<Value>,
    asking: bool,
    after: Duration,
) -> Result<Value, Failed> {
    if asking && !values.is_empty() {
        values
            .remove(0)
            .extract_error()
            .map_err(|e| failed(op, e, after))?;
    }
    let mut values = values.into_iter();
    let (Some(answer), Some(acked)) = (values.next(), values.next()) else {
        return Err(Failed {
            error: LockError::Redis {
                op,
                source: redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "unexpected answer to a write and WAIT",
                )),
            },
            reached: Reached::Answered,
        });
    };
    let answer = answer.extract_error().map_err(|e| failed(op, e, after))?;
    Ok(Value::Array(vec![answer, acked]))
}

/// A duration as whole milliseconds for `PX` / `PEXPIRE` (at least 1).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Locks a std mutex, ignoring poisoning: every critical section here leaves the data valid.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Parses a Redis URL; returns the connection info (with `tls`'s certificates for a `rediss://`
/// URL) and the URL with its password masked.
pub(crate) fn parse_url(
    url: &str,
    tls: &Tls,
) -> Result<(redis::ConnectionInfo, String), LockError> {
    let mut parsed = url::Url::parse(url).map_err(|e| LockError::InvalidUrl {
        reason: format!("{e}; expected redis://[user:password@]host[:port][/db]"),
    })?;
    match parsed.scheme() {
        "redis" | "rediss" | "redis+unix" | "unix" | "valkey" | "valkeys" => {}
        other => {
            return Err(LockError::InvalidUrl {
                reason: format!(
                    "scheme `{other}:` is not a Redis scheme; use redis://host:port, \
                     rediss:// for TLS, or unix:///path/to/socket"
                ),
            })
        }
    }
    let password = parsed.password().map(str::to_owned);
    let info = redis::IntoConnectionInfo::into_connection_info(parsed.clone()).map_err(|e| {
        let mut reason = e.to_string();
        if let Some(password) = password.as_deref().filter(|p| !p.is_empty()) {
            reason = reason.replace(password, "***");
        }
        LockError::InvalidUrl { reason }
    })?;
    let info = tls.apply(info)?;
    if password.is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    // Query parameters can carry credentials too (`unix:///sock?pass=...`): never show them.
    if parsed.query().is_some() {
        parsed.set_query(Some("..."));
    }
    Ok((info, parsed.to_string()))
}

/// A multiplexed connection to `client`'s server whose every call is bounded by the response
/// timeout, opened within the connect timeout.
pub(crate) async fn dial(
    client: &redis::Client,
    timeouts: Timeouts,
    op: &'static str,
) -> Result<MultiplexedConnection, LockError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.response));
    let connect = client.get_multiplexed_async_connection_with_config(&config);
    match tokio::time::timeout(timeouts.connect, connect).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(source)) if source.is_timeout() => Err(LockError::RedisTimeout {
            op,
            after: timeouts.connect,
        }),
        Ok(Err(source)) => Err(LockError::from_redis(op, source)),
        Err(_) => Err(LockError::RedisTimeout {
            op,
            after: timeouts.connect,
        }),
    }
}

/// A client for `info` (for a subscriber connection).
pub(crate) fn client(info: redis::ConnectionInfo) -> Result<redis::Client, LockError> {
    redis::Client::open(info).map_err(|e| LockError::InvalidUrl {
        reason: e.to_string(),
    })
}

/// The pool the builder creates for a URL: every connection bounded by `timeouts`.
pub(crate) fn create_pool(
    info: redis::ConnectionInfo,
    size: usize,
    timeouts: Timeouts,
) -> Result<Pool, LockError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeouts.connect))
        .set_response_timeout(Some(timeouts.response));
    let manager = deadpool_redis::Manager::new_with_config(info, config).map_err(|e| {
        LockError::InvalidUrl {
            reason: e.to_string(),
        }
    })?;
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeouts.pool_wait))
        .create_timeout(Some(timeouts.connect))
        .recycle_timeout(Some(timeouts.response))
        .build()
        .map_err(|e| LockError::InvalidConfig {
            what: "pool",
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_without_leaking_the_password() {
        let (_, shown) = parse_url("redis://app:s3cret@127.0.0.1:6380/2", &Tls::default()).unwrap();
        assert_eq!(shown, "redis://app:***@127.0.0.1:6380/2");
        assert!(parse_url("unix:///run/redis.sock", &Tls::default()).is_ok());
        let (_, shown) =
            parse_url("unix:///run/redis.sock?db=1&pass=s3cret", &Tls::default()).unwrap();
        assert!(!shown.contains("s3cret"), "{shown}");
        let err = parse_url("postgres://app:s3cret@db/0", &Tls::default()).unwrap_err();
        assert!(err.to_string().contains("`postgres:`"), "{err}");
        assert!(!err.to_string().contains("s3cret"));
    }
}
