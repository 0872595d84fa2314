//! Where the manager's Redis commands go: one multiplexed connection of its own, opened through
//! the `deadpool_redis::Pool`, every call bounded by a timeout.
//!
//! deadpool-redis checks a connection out by sending `UNWATCH` + `PING` first, which would
//! double the round trips of every lock operation. redis-rs's multiplexed connection is made to be
//! shared by many tasks at once, so the manager takes one connection out of the pool for good
//! (`Connection::take`: the pool may open another in its place) and sends all its commands on it,
//! pipelined. Taking it out, rather than sharing a pooled one, keeps other users of the pool from
//! changing its state (`SELECT`, `MULTI`) under the manager; it is `SELECT`ed to the database of
//! its connection info when taken. A connection that fails or stops answering is dropped, and
//! the next call takes a fresh one. No connection is ever reserved while a body runs.
//!
//! It also turns a URL into that pool (and says where it points without the password).

use std::future::Future;
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use deadpool_redis::{Pool, PoolError, Runtime};
use redis::aio::MultiplexedConnection;
use redis::{FromRedisValue, ScriptInvocation};

use crate::error::LockError;

/// The timeouts every Redis call is bounded by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
    pub(crate) pool_wait: Duration,
}

/// The manager's way to Redis: the pool and the connection currently in use.
pub(crate) struct Redis {
    pool: Pool,
    current: Mutex<Option<Current>>,
    timeouts: Timeouts,
    bounded_connections: bool,
}

/// A call that failed, and how far its request got.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: LockError,
    pub(crate) reached: Reached,
}

/// How far a failed request got, which decides whether what it would have written may be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reached {
    /// Never sent: no connection could be had.
    No,
    /// Sent, or maybe sent, with no answer: it may still arrive and run.
    Maybe,
    /// Redis ran it and answered with an error: whatever it wrote before failing stays
    /// written (or its answer could not be read).
    Answered,
    /// Redis refused it before running it (a replica's `READONLY`, `LOADING`, `OOM`, a key the
    /// user may not touch, a script that does not compile): nothing was written.
    Refused,
}

/// Whether a failed request ran on the server: an error raised inside a script says where
/// (`... script: <sha>, on @user_script:<line>.`), a refusal before the script ran does not,
/// and an answer that could not be read came from a request that ran.
fn ran(error: &redis::RedisError) -> bool {
    match error.kind() {
        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => true,
        _ => error.to_string().contains("@user_script"),
    }
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

impl Redis {
    /// `bounded_connections`: the pool's connections were configured with `timeouts.response`
    /// as their own response timeout (a pool the builder created), so no second timer is needed
    /// per call.
    pub(crate) fn new(pool: Pool, timeouts: Timeouts, bounded_connections: bool) -> Self {
        Self {
            pool,
            current: Mutex::new(None),
            timeouts,
            bounded_connections,
        }
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.timeouts.response
    }

    /// Runs a script, bounded by the response timeout (and the pool's wait and connect timeouts
    /// when a connection must be checked out first).
    ///
    /// A connection kept from an earlier call may have died while idle (a server restart, an
    /// idle timeout): when it fails at once, the script is sent once more on a fresh connection.
    /// Every distlock script is safe to repeat (an acquire by the same token takes its own keys
    /// again; release and extend are idempotent).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        op: &'static str,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        self.call(op, script).await.map_err(|failed| failed.error)
    }

    /// [`Redis::invoke`], saying on failure whether the request may have reached Redis.
    pub(crate) async fn call<T: FromRedisValue>(
        &self,
        op: &'static str,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, Failed> {
        let after = self.timeouts.response;
        let mut may_retry = true;
        // Whether an earlier try may have reached Redis.
        let mut sent = Reached::No;
        loop {
            let (checkout, mut conn) = match self.connection(op).await {
                Ok(connection) => connection,
                Err(error) => {
                    return Err(Failed {
                        error,
                        reached: sent,
                    })
                }
            };
            let mut call = std::pin::pin!(script.invoke_async(&mut conn));
            // A connection whose driver has already stopped (the server closed it) fails the
            // request at its first poll, before handing it over: then it was never sent.
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            let unsent = matches!(&first, Poll::Ready(Err(e)) if is_connection_failure(e));
            let answer = match first {
                Poll::Ready(answer) => Some(answer),
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
                    if !is_connection_failure(&source) {
                        let reached = if ran(&source) {
                            Reached::Answered
                        } else {
                            Reached::Refused
                        };
                        return Err(Failed {
                            error: LockError::from_redis(op, source),
                            reached,
                        });
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
                    return Err(failed(LockError::RedisTimeout { op, after }));
                }
            }
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

    /// Takes a fresh connection out of the pool and makes it the current one.
    async fn connect(
        &self,
        op: &'static str,
    ) -> Result<(Checkout, MultiplexedConnection), LockError> {
        let after = self.timeouts.pool_wait + self.timeouts.connect;
        let pooled = match tokio::time::timeout(after, self.pool.get()).await {
            Ok(Ok(pooled)) => pooled,
            Ok(Err(PoolError::Backend(source))) if source.is_timeout() => {
                return Err(LockError::RedisTimeout {
                    op,
                    after: self.timeouts.connect,
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
        match tokio::time::timeout(self.timeouts.response, select.exec_async(&mut conn)).await {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return Err(LockError::from_redis(op, source)),
            Err(_) => {
                return Err(LockError::RedisTimeout {
                    op,
                    after: self.timeouts.response,
                })
            }
        }
        let mut current = lock(&self.current);
        if let Some(existing) = &*current {
            // Another task connected meanwhile: share its connection.
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

    /// Stops using the connection of `generation`, unless it was already replaced.
    fn forget(&self, generation: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            *current = None;
        }
    }
}

/// A process-wide unique number (connection generations, manager identities).
pub(crate) fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A duration as whole milliseconds for `PX` / `PEXPIRE` (at least 1).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// True when the error says the connection itself is unusable, not that the command failed.
pub(crate) fn is_connection_failure(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_timeout()
        || err.is_unrecoverable_error()
}

/// True when Redis refused a request for a passing reason: loading its data after a restart,
/// a replica during a failover, a cluster re-sharding or down. Worth retrying for a while.
pub(crate) fn is_transient(err: &redis::RedisError) -> bool {
    use redis::ServerErrorKind::{BusyLoading, ClusterDown, MasterDown, ReadOnly, TryAgain};
    matches!(
        err.kind(),
        redis::ErrorKind::Server(BusyLoading | ClusterDown | MasterDown | ReadOnly | TryAgain)
    )
}

/// Locks a std mutex, ignoring poisoning: every critical section here leaves the data valid.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Parses a Redis URL; returns the connection info and the URL with its password masked.
pub(crate) fn parse_url(url: &str) -> Result<(redis::ConnectionInfo, String), LockError> {
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
    if password.is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    // Query parameters can carry credentials too (`unix:///sock?pass=...`): never show them.
    if parsed.query().is_some() {
        parsed.set_query(Some("..."));
    }
    Ok((info, parsed.to_string()))
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
        let (_, shown) = parse_url("redis://app:s3cret@127.0.0.1:6380/2").unwrap();
        assert_eq!(shown, "redis://app:***@127.0.0.1:6380/2");
        assert!(parse_url("unix:///run/redis.sock").is_ok());
        let (_, shown) = parse_url("unix:///run/redis.sock?db=1&pass=s3cret").unwrap();
        assert!(!shown.contains("s3cret"), "{shown}");
        let err = parse_url("postgres://app:s3cret@db/0").unwrap_err();
        assert!(err.to_string().contains("`postgres:`"), "{err}");
        assert!(!err.to_string().contains("s3cret"));
    }
}
