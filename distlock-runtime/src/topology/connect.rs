//! Reaching one server: its URL parsed without leaking the password, a client, a bounded dial,
//! the pool the builder creates, and a connection taken out of a pool for good.

use std::future::Future;
use std::time::Duration;

use deadpool_redis::{Pool, PoolError, Runtime, TimeoutType};
use redis::aio::MultiplexedConnection;

use crate::error::LockError;
use crate::tls::Tls;

/// The timeouts every Redis call is bounded by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
    pub(crate) pool_wait: Duration,
}

impl Timeouts {
    /// A connection's settings: opened within the connect timeout, each call bounded by the
    /// response timeout.
    pub(super) fn config(self) -> redis::AsyncConnectionConfig {
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect))
            .set_response_timeout(Some(self.response))
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
    let pooled = tokio::time::timeout(after, pool.get())
        .await
        .map_err(|_| LockError::RedisTimeout { op, after })?;
    let pooled = pooled.map_err(|error| match error {
        PoolError::Backend(source) if !source.is_timeout() => LockError::from_redis(op, source),
        // The pool's own create timeout is the connect timeout (see `create_pool`): it and
        // redis-rs's fire together, and either one is a connect that timed out.
        PoolError::Backend(_) | PoolError::Timeout(TimeoutType::Create) => {
            LockError::RedisTimeout {
                op,
                after: timeouts.connect,
            }
        }
        PoolError::Timeout(_) => LockError::RedisTimeout { op, after },
        other => LockError::Redis {
            op,
            source: redis::RedisError::from((
                redis::ErrorKind::Client,
                "connection pool",
                other.to_string(),
            )),
        },
    })?;
    let mut conn = deadpool_redis::Connection::take(pooled);
    // A pooled connection may have been switched to another database by its last user.
    let db = redis::aio::ConnectionLike::get_db(&conn);
    let mut select = redis::cmd("SELECT");
    select.arg(db);
    within(op, timeouts.response, select.exec_async(&mut conn)).await?;
    Ok(conn)
}

/// What `request`, a request of `op`, answers within `after`: a timeout, the client's or this
/// one's, is a [`LockError::RedisTimeout`]; another error is classified by
/// [`LockError::from_redis`].
pub(crate) async fn within<T>(
    op: &'static str,
    after: Duration,
    request: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, LockError> {
    match tokio::time::timeout(after, request).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(source)) if !source.is_timeout() => Err(LockError::from_redis(op, source)),
        Ok(Err(_)) | Err(_) => Err(LockError::RedisTimeout { op, after }),
    }
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
    let config = timeouts.config();
    let connect = client.get_multiplexed_async_connection_with_config(&config);
    within(op, timeouts.connect, connect).await
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
    let manager =
        deadpool_redis::Manager::new_with_config(info, timeouts.config()).map_err(|e| {
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
