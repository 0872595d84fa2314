//! [`LockManager`]: the entry point. It hands out [`LockRequest`]s and reports what it did;
//! making one is [`LockManager::builder`]'s business (`builder.rs`), everything it shares with
//! its requests and leases lives in its [`Context`].

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use deadpool_redis::Pool;

use crate::context::Context;
use crate::error::LockError;
use crate::request::LockRequest;

/// Hands out locks on one Redis server.
///
/// Cheap to clone (clones share the pool, the renewal driver and the re-entrancy identity) and
/// `Send + Sync`. Build one per process at startup and keep it, or install it with
/// [`set_default_manager`] for the `#[distributed_lock]` attribute.
///
/// The lock on `order:42` lives at `distlock:lock:{order:42}` (the prefix, `lock:`, and the key
/// in braces: a Redis Cluster hash tag, so all of one lock's keys share a slot), its fencing
/// counter at `distlock:fence:{order:42}`; the default prefix is `distlock:`. Every key distlock
/// writes expires.
///
/// Its connection and its renewal task run on the Tokio runtime where it is first used, and are
/// made again on the current runtime when that one shuts down. Use a manager from one runtime
/// (the usual multi-thread runtime of a service): on a runtime that stays alive but is no
/// longer driven (a stored current-thread runtime used now and then), renewal stalls, and the
/// leases it should extend report themselves lost at their deadline.
///
/// ```no_run
/// use std::time::Duration;
/// use distlock_runtime::LockManager;
///
/// # async fn demo() -> Result<(), distlock_runtime::LockError> {
/// let locks = LockManager::from_url("redis://127.0.0.1:6379")?;
/// let total = locks
///     .lock("order:42")
///     .ttl(Duration::from_secs(10))
///     .run(async { /* at most one task in the fleet runs this per order */ 1999 })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager {
    context: Arc<Context>,
}

/// What a [`LockManager`] did so far (all its clones together), from [`LockManager::stats`]:
/// for metrics, and to see how contended locks behave.
///
/// ```no_run
/// # async fn demo(locks: distlock_runtime::LockManager) {
/// let stats = locks.stats();
/// println!("{} acquire requests sent", stats.acquire_requests);
/// println!("{} fair leases handed over", stats.handed_over);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Acquire requests sent to Redis: one per attempt, so under contention more than the
    /// leases acquired.
    pub acquire_requests: u64,
    /// Fair leases acquired by hand-off: a release gave the lock straight to the waiter,
    /// which learned it by notification, without another acquire request.
    pub handed_over: u64,
    /// Releases waiting or running in the background now (leases dropped unreleased, acquires
    /// that ended not knowing whether they took the lock), retried while Redis is away: at most
    /// 10,000 per manager; more are dropped, and their locks expire after their ttl.
    pub background_releases: usize,
}

impl LockManager {
    /// The manager of `context` (made by the builder).
    pub(crate) fn new(context: Context) -> Self {
        Self {
            context: Arc::new(context),
        }
    }

    /// A request for the lock on `key`, with this manager's default ttl and wait and renewal on.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let lease = locks.lock("order:42").acquire().await?;
    /// // ... at most one holder of `order:42` in the fleet here ...
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        self.lock_all([key])
    }

    /// A request for the lock on `key` held shared: any number of readers hold it at once, and
    /// no writer ([`lock`](Self::lock)) while they do. `lock_all(a).read_keys(b)` takes keys
    /// exclusively and shared in one request ([`LockRequest::read_keys`]).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // Many readers at once; a restock (`locks.lock("product:7")`) waits for them, and they
    /// // for it.
    /// let price = locks.read_lock("product:7").run(async { 42 }).await?;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn read_lock(&self, key: impl Into<String>) -> LockRequest {
        LockRequest::new(Arc::clone(&self.context), Vec::new()).read_keys([key])
    }

    /// A request for the locks on all `keys` as one unit: all are taken or none is. Keys are
    /// sorted and de-duplicated first, so two callers naming the same keys in different orders
    /// cannot deadlock.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // One lease on both keys: taken together, or not at all.
    /// locks
    ///     .lock_all(["stock:sku-1", "wallet:7"])
    ///     .run(async { /* debit one, credit the other */ })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn lock_all<I, K>(&self, keys: I) -> LockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        LockRequest::new(
            Arc::clone(&self.context),
            keys.into_iter().map(Into::into).collect(),
        )
    }

    /// A request for the lock on `key` that tries once and does not wait:
    /// `lock(key).wait(Duration::ZERO)`.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// match locks.try_lock("report:daily").acquire().await {
    ///     Ok(lease) => {
    ///         // ... build the report ...
    ///         lease.release().await?;
    ///     }
    ///     Err(e) if e.is_contention() => println!("another instance is on it"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn try_lock(&self, key: impl Into<String>) -> LockRequest {
        self.lock(key).wait(Duration::ZERO)
    }

    pub(crate) fn context(&self) -> &Context {
        &self.context
    }

    /// The connection pool this manager takes its connections from: the one given to
    /// [`LockManagerBuilder::pool`](crate::LockManagerBuilder::pool) or made for
    /// [`url`](crate::LockManagerBuilder::url); `None` on a cluster, Sentinel or quorum
    /// manager, which manage their connections themselves.
    ///
    /// ```no_run
    /// # fn demo(locks: distlock_runtime::LockManager) {
    /// if let Some(pool) = locks.pool() {
    ///     let status = pool.status();
    ///     println!("{} of {} connections open", status.size, status.max_size);
    /// }
    /// # }
    /// ```
    pub fn pool(&self) -> Option<&Pool> {
        self.context.redis.pool.as_ref()
    }

    /// The prefix of every Redis key this manager writes.
    ///
    /// ```
    /// # fn main() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::from_url("redis://127.0.0.1:6379")?;
    /// assert_eq!(locks.prefix(), "distlock:");
    /// # Ok(()) }
    /// ```
    pub fn prefix(&self) -> &str {
        &self.context.prefix
    }

    /// The Redis key that holds the lock on `key`.
    ///
    /// ```
    /// # fn main() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::from_url("redis://127.0.0.1:6379")?;
    /// // The key in braces: a Redis Cluster hash tag, so a lock's keys share one slot.
    /// assert_eq!(locks.redis_key("order:42"), "distlock:lock:{order:42}");
    /// # Ok(()) }
    /// ```
    pub fn redis_key(&self, key: &str) -> String {
        self.context.lock_keys(key).lock().to_owned()
    }

    /// Checks now that this manager's settings work with its Redis, so a service can fail at
    /// startup rather than at its first lock, or at the first contended one. On every server
    /// that holds locks (the one server, the primary Sentinel names, every primary of a
    /// cluster, every quorum node) it connects (address, TLS, credentials, database index),
    /// checks that the server is a writable primary of Redis 7.0 or newer, and asks Redis
    /// whether the ACL user may run every command every one of distlock's scripts may run,
    /// on the keys under the prefix, under contention and fairness too, and the commands the
    /// topology needs (`SELECT`, `WAIT` with `min_replicas`, `ROLE` on a Sentinel primary,
    /// `CLUSTER SLOTS`). Release notifications are optional (without channel rights waiters
    /// poll), but a user that may subscribe and not publish is refused: its waiters would
    /// sleep through every release. With `min_replicas`, it sends a `WAIT` too (waiting for no
    /// replica), which some managed services refuse. Writes nothing. The first `ping`, and one
    /// that finds other servers or versions than the last, logs (at `info`) which server
    /// software and version answered (`Valkey 8.1.8 at 10.0.0.5:6379`): see
    /// [`servers`](Self::servers).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::from_url("redis://app:secret@redis:6379/2")?;
    /// locks.ping().await?; // a wrong password fails here, with LockError::Misconfigured
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Misconfigured`] when Redis refuses the settings: it says what to fix, for a
    /// missing ACL right the commands and the `ACL SETUSER` line that grants them, for a
    /// replica's URL [`Misconfiguration::Replica`](crate::Misconfiguration::Replica), for a
    /// command the server or a proxy does not offer
    /// [`Misconfiguration::Unsupported`](crate::Misconfiguration::Unsupported) and what to
    /// configure instead;
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when a server cannot be reached
    /// within the manager's timeouts ([`LockError::NoQuorum`]-free on a quorum: a majority of
    /// nodes that pass is enough, a refusal on any node is reported).
    pub async fn ping(&self) -> Result<(), LockError> {
        crate::diagnose::ping(&self.context).await
    }

    /// Which servers hold this manager's locks, and what each is: Redis or Valkey, and its
    /// version (the one server, the primary Sentinel names, every primary of a cluster, every
    /// quorum node that answered), sorted by address. Asked with the script
    /// [`ping`](Self::ping) runs, so it needs no right beyond running scripts, `SELECT` for the
    /// URL's database, and what the topology needs to find its servers (`CLUSTER SLOTS` on a
    /// cluster, `ROLE` on Sentinel); it sends no `WAIT`. Writes nothing. [`ping`](Self::ping) logs the same
    /// (at `info`, the first time and whenever the servers or their versions change).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// for server in locks.servers().await? {
    ///     println!("locks are held on {server}"); // Redis 8.2.3 at 10.0.0.5:6379
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`ping`](Self::ping), but for the rights a lock needs beyond running scripts.
    pub async fn servers(&self) -> Result<Vec<crate::ServerInfo>, LockError> {
        crate::diagnose::servers(&self.context).await
    }

    /// Counts of what this manager (and its clones) did so far.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let before = locks.stats();
    /// locks.lock("report").acquire().await?.release().await?;
    /// let after = locks.stats();
    /// println!("attempts: {}", after.acquire_requests - before.acquire_requests);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> LockStats {
        let stats = &self.context.stats;
        LockStats {
            acquire_requests: stats.acquire_requests.load(Ordering::Relaxed),
            handed_over: stats.handed_over.load(Ordering::Relaxed),
            background_releases: self.context.background.pending(),
        }
    }
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.context.fmt(f)
    }
}

static DEFAULT_MANAGER: RwLock<Option<LockManager>> = RwLock::new(None);

tokio::task_local! {
    /// The default manager of the futures run by [`with_default_manager`].
    static SCOPED_MANAGER: LockManager;
}

/// Installs the manager that `#[distributed_lock]` functions without `manager = ...` use,
/// for the whole process: every task and thread, from now on. Replaces one installed before.
///
/// Call it once, at startup. Tests that run in parallel, each against its own throwaway
/// server, must not share one default: give each test's future its own with
/// [`with_default_manager`], which takes precedence over this one.
///
/// ```no_run
/// use distlock_runtime::{distributed_lock, LockError, LockManager};
///
/// #[distributed_lock("report:{day}")]
/// async fn build_report(day: u32) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), LockError> {
///     distlock_runtime::set_default_manager(LockManager::from_url("redis://127.0.0.1:6379")?);
///     build_report(7).await // locks `report:7` through the manager installed above
/// }
/// ```
pub fn set_default_manager(manager: LockManager) {
    *DEFAULT_MANAGER
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(manager);
}

/// Runs `future` with `manager` as the default manager of the `#[distributed_lock]` functions
/// it calls without `manager = ...`, in place of the one [`set_default_manager`] installed
/// for the process.
///
/// The default is scoped to `future` on its task: calls made while it runs, however deeply
/// nested, use `manager`; other tasks do not see it, and neither do tasks that `future`
/// spawns (`tokio::spawn` starts a task of its own: wrap the spawned future too). Scopes nest:
/// the innermost wins. Made for tests that run in parallel in one process, each against its
/// own server.
///
#[cfg_attr(feature = "testing", doc = "```")]
#[cfg_attr(not(feature = "testing"), doc = "```ignore")]
/// use distlock_runtime::testing::TestRedis;
/// use distlock_runtime::{distributed_lock, LockError};
///
/// #[distributed_lock("report:{day}")]
/// async fn build_report(day: u32) -> Result<u64, LockError> {
///     Ok(distlock_runtime::current_lease().map_or(0, |lease| lease.fencing_token()))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = TestRedis::start().await?; // this test's own server
/// let token = distlock_runtime::with_default_manager(redis.manager(), build_report(7)).await?;
/// assert!(token > 0);
/// # Ok(()) }
/// ```
pub async fn with_default_manager<F: Future>(manager: LockManager, future: F) -> F::Output {
    SCOPED_MANAGER.scope(manager, future).await
}

/// The manager `#[distributed_lock]` functions without `manager = ...` use here: the one
/// [`with_default_manager`] gave the running future, else the one installed with
/// [`set_default_manager`].
///
/// ```no_run
/// # async fn demo() -> Result<(), distlock_runtime::LockError> {
/// // The manager the attribute uses, for a lock taken by hand beside annotated fns.
/// let locks = distlock_runtime::default_manager()?;
/// locks.lock("cleanup").run(async { /* ... */ }).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::NotConfigured`] when neither gave one.
pub fn default_manager() -> Result<LockManager, LockError> {
    if let Ok(manager) = SCOPED_MANAGER.try_with(LockManager::clone) {
        return Ok(manager);
    }
    DEFAULT_MANAGER
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .ok_or(LockError::NotConfigured)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Lease;

    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    fn assert_send_static<T: Send + 'static>(_: &T) {}

    #[test]
    fn managers_leases_and_run_futures_cross_tasks() {
        let locks = LockManager::from_url("redis://127.0.0.1:1").unwrap();
        assert_send_sync(&locks);
        assert_send_static(&locks.lock("k").acquire());
        assert_send_static(&locks.lock("k").run(async { 1 }));
        fn lease_is_send_static(lease: Lease) -> impl Send + 'static {
            lease
        }
        let _ = lease_is_send_static;
    }

    #[test]
    fn lock_futures_stay_small() {
        // Every annotated fn's future embeds one of these; nesting multiplies it. Connecting
        // (large, rare) is boxed so the common path stays small.
        let locks = LockManager::from_url("redis://127.0.0.1:1").unwrap();
        let size = std::mem::size_of_val(&locks.lock("k").run(async {}));
        assert!(size <= 4096, "run future is {size} bytes");
    }

    #[test]
    fn a_run_future_embeds_its_body_once() {
        // Nested calls nest bodies: a copy per layer inside `run` would multiply with depth.
        let locks = LockManager::from_url("redis://127.0.0.1:1").unwrap();
        let big = [0u8; 10_000];
        let body = async move {
            std::hint::black_box(big);
        };
        let size = std::mem::size_of_val(&locks.lock("k").run(body));
        assert!(size <= 10_001 + 4096, "run future is {size} bytes");
    }

    #[test]
    fn locks_live_under_the_prefix_each_with_its_own_counter() {
        let locks = LockManager::builder()
            .url("redis://127.0.0.1:1")
            .prefix("app:")
            .build()
            .unwrap();
        assert_eq!(locks.redis_key("fence"), "app:lock:{fence}");
        assert_eq!(
            locks.context.lock_keys("fence").fence(),
            "app:fence:{fence}"
        );
    }
}
