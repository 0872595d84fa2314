//! [`Context`]: what every lock operation of one manager shares. A
//! [`LockManager`](crate::LockManager) is a handle to one; requests and leases hold the context
//! itself, not the manager, so everything below the manager depends on this file alone.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::background::Background;
use crate::keys::LockKeys;
use crate::notify::Notifications;
use crate::order::Orders;
use crate::renew::Renewals;
use crate::topology::Deployment;

/// One manager's way to Redis, its background tasks, its key layout, defaults and counters.
pub(crate) struct Context {
    /// Unique per manager (shared by its clones): the identity re-entrancy is scoped to.
    pub(crate) id: u64,
    pub(crate) redis: Arc<Deployment>,
    pub(crate) renewals: Renewals,
    /// The bounds of its background releases (see `release.rs`).
    pub(crate) background: Background,
    /// Release notifications for waiters; `None` for a caller's pool (no client to subscribe
    /// with): its waiters poll.
    pub(crate) notifications: Option<Notifications>,
    pub(crate) prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) default_wait: Duration,
    pub(crate) default_fair: bool,
    /// Appended to every owner token (`token:label`), for `inspect`.
    pub(crate) holder_label: Option<String>,
    /// The lock order check's record.
    pub(crate) orders: Orders,
    pub(crate) stats: Counters,
    /// The servers the last `ping` found, as it logged them (see `diagnose.rs`).
    pub(crate) servers_seen: std::sync::Mutex<Option<String>>,
}

/// What the manager did so far; read as [`LockStats`](crate::LockStats).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) acquire_requests: AtomicU64,
    pub(crate) handed_over: AtomicU64,
}

impl Context {
    /// Every Redis key of the lock on `key`.
    pub(crate) fn lock_keys(&self, key: &str) -> LockKeys {
        LockKeys::new(&self.prefix, key)
    }

    pub(crate) fn redis(&self) -> &Deployment {
        &self.redis
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("endpoint", &self.redis.endpoint)
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("default_wait", &self.default_wait)
            .finish_non_exhaustive()
    }
}
