//! [`LockManagerBuilder`]: how a [`LockManager`] is made, its settings checked, and where it
//! connects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;

use crate::conn::{self, Redis, Timeouts};
use crate::context::{Context, Counters};
use crate::error::LockError;
use crate::manager::LockManager;
use crate::notify::Notifications;
use crate::renew::Renewals;
use crate::validity::check_ttl;

impl LockManager {
    /// A manager for the Redis at `url` (`redis://[user:password@]host[:port][/db]`, or
    /// `unix:///path`), with every default of [`LockManagerBuilder`]. No connection is made here:
    /// an unreachable server is reported by the first lock.
    ///
    /// # Errors
    /// [`LockError::InvalidUrl`] when the URL cannot be parsed or is not a Redis URL; the message
    /// never contains the URL's password.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).build()
    }

    /// A builder to set the pool, key prefix, defaults and timeouts.
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }
}

/// Builds a [`LockManager`]. Every timeout is finite by default.
///
/// | setting | default |
/// |---|---|
/// | [`url`](Self::url) or [`pool`](Self::pool) | required |
/// | [`prefix`](Self::prefix) | `"distlock:"` |
/// | [`default_ttl`](Self::default_ttl) | 30 s |
/// | [`default_wait`](Self::default_wait) | 10 s |
/// | [`default_fair`](Self::default_fair) | `false` |
/// | [`pool_size`](Self::pool_size) | 8 connections |
/// | [`connect_timeout`](Self::connect_timeout) | 2 s |
/// | [`response_timeout`](Self::response_timeout) | 1 s |
/// | [`pool_wait_timeout`](Self::pool_wait_timeout) | 1 s |
///
/// ```no_run
/// use std::time::Duration;
/// # fn demo() -> Result<(), distlock_runtime::LockError> {
/// let locks = distlock_runtime::LockManager::builder()
///     .url("redis://127.0.0.1:6379/0")
///     .prefix("billing:")
///     .default_ttl(Duration::from_secs(10))
///     .response_timeout(Duration::from_millis(500))
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "call .build() to get a LockManager"]
pub struct LockManagerBuilder {
    source: Option<Source>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    default_fair: bool,
    pool_size: usize,
    connect_timeout: Duration,
    response_timeout: Duration,
    pool_wait_timeout: Duration,
}

enum Source {
    Url(String),
    Pool(Pool),
}

impl Default for LockManagerBuilder {
    fn default() -> Self {
        Self {
            source: None,
            prefix: "distlock:".to_owned(),
            default_ttl: Duration::from_secs(30),
            default_wait: Duration::from_secs(10),
            default_fair: false,
            pool_size: 8,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            pool_wait_timeout: Duration::from_secs(1),
        }
    }
}

impl fmt::Debug for LockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManagerBuilder")
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("default_wait", &self.default_wait)
            .finish_non_exhaustive()
    }
}

impl LockManagerBuilder {
    /// Connect to the Redis at `url`, through a pool this builder creates. Replaces a
    /// [`pool`](Self::pool) given before.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.source = Some(Source::Url(url.into()));
        self
    }

    /// Use an existing deadpool-redis pool. Replaces a [`url`](Self::url) given before;
    /// [`pool_size`](Self::pool_size) and [`connect_timeout`](Self::connect_timeout) then do not
    /// apply to the pool, but every call is still bounded by this builder's timeouts. A pool
    /// does not say where it connects, so such a manager cannot subscribe to release
    /// notifications: its waiters poll with backoff (1 to 50 ms). Prefer [`url`](Self::url).
    pub fn pool(mut self, pool: Pool) -> Self {
        self.source = Some(Source::Pool(pool));
        self
    }

    /// Prefix of every Redis key the manager writes. Default `"distlock:"`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease length of requests that do not set one. Default 30 s.
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long requests that do not set a wait wait for a held lock. Default 10 s.
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// Whether single-key requests that do not say are fair (see
    /// [`LockRequest::fair`](crate::LockRequest::fair)). Default `false`: a fair acquire's
    /// script does more work even when the lock is free, and unfair waiters are already woken
    /// by notification rather than polling.
    pub fn default_fair(mut self, fair: bool) -> Self {
        self.default_fair = fair;
        self
    }

    /// Most connections the created pool opens. Default 8.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Longest time to open a connection (TCP connect and handshake). Default 2 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Longest time to wait for Redis to answer one call. Default 1 s.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Longest time to wait for a free connection from the pool. Default 1 s.
    pub fn pool_wait_timeout(mut self, timeout: Duration) -> Self {
        self.pool_wait_timeout = timeout;
        self
    }

    /// Builds the manager. Makes no network connection.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when neither a URL nor a pool was given, a timeout is zero,
    /// the pool size is zero or the default ttl is outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL);
    /// [`LockError::InvalidUrl`] when the URL is unusable.
    pub fn build(self) -> Result<LockManager, LockError> {
        for (what, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
            ("pool_wait_timeout", self.pool_wait_timeout),
        ] {
            if value.is_zero() {
                return Err(LockError::InvalidConfig {
                    what,
                    reason: "must be greater than zero: every Redis call needs a bound".to_owned(),
                });
            }
        }
        if self.pool_size == 0 {
            return Err(LockError::InvalidConfig {
                what: "pool_size",
                reason: "must be at least 1".to_owned(),
            });
        }
        check_ttl(self.default_ttl)?;
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
            pool_wait: self.pool_wait_timeout,
        };
        let (pool, endpoint, bounded_connections, notifications) = match self.source {
            None => {
                return Err(LockError::InvalidConfig {
                    what: "Redis source",
                    reason: "give the builder a .url(..) or a .pool(..)".to_owned(),
                })
            }
            Some(Source::Pool(pool)) => (pool, "(caller's pool)".to_owned(), false, None),
            Some(Source::Url(url)) => {
                let (info, endpoint) = conn::parse_url(&url)?;
                let client =
                    redis::Client::open(info.clone()).map_err(|e| LockError::InvalidUrl {
                        reason: e.to_string(),
                    })?;
                let notifications = Notifications::new(client, timeouts);
                let pool = conn::create_pool(info, self.pool_size, timeouts)?;
                (pool, endpoint, true, Some(notifications))
            }
        };
        let redis = Arc::new(Redis::new(pool, timeouts, bounded_connections));
        Ok(LockManager::new(Context {
            id: crate::conn::next_id(),
            renewals: Renewals::new(Arc::clone(&redis)),
            notifications,
            redis,
            prefix: self.prefix,
            default_ttl: self.default_ttl,
            default_wait: self.default_wait,
            default_fair: self.default_fair,
            stats: Counters::default(),
            endpoint,
        }))
    }
}
