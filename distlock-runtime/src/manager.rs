//! [`LockManager`]: the entry point. It owns the connection pool and the renewal driver, and
//! hands out [`LockRequest`]s.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use deadpool_redis::{Pool, Runtime};
use tokio::time::Instant;
use tracing::Instrument;

use crate::conn::{Reached, Redis, Timeouts};
use crate::keys::LockKeys;
use crate::lease::{Lease, LeaseState};
use crate::notify::Notifications;
use crate::renew::{self, Renewals};
use crate::scripts::{self, Acquire};
use crate::wait::{Waiter, Wake};
use crate::{reentrancy, LockError};

/// The shortest lease accepted: below this the clock-drift margin eats the whole lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest lease accepted (one year); longer is surely a mistake, and would overflow clocks.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Hands out locks on one Redis server.
///
/// Cheap to clone (clones share the pool, the renewal driver and the re-entrancy identity) and
/// `Send + Sync`. Build one per process at startup and keep it, or install it with
/// [`set_default_manager`] for the `#[distributed_lock]` attribute.
///
/// Locks live under `{prefix}lock:{key}`, each with its fencing counter under
/// `{prefix}fence:{key}`; the default prefix is `distlock:`. Every key distlock writes expires.
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
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    redis: Arc<Redis>,
    renewals: Renewals,
    /// Release notifications for waiters; `None` for a caller's pool (no client to subscribe
    /// with): its waiters poll.
    notifications: Option<Notifications>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    default_fair: bool,
    stats: Counters,
    /// The URL without its password, for Debug.
    endpoint: String,
}

#[derive(Default)]
struct Counters {
    acquire_requests: AtomicU64,
    handed_over: AtomicU64,
}

/// What a [`LockManager`] did so far (all its clones together), from [`LockManager::stats`]:
/// for metrics, and to see how contended locks behave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Acquire requests sent to Redis: one per attempt, so under contention more than the
    /// leases acquired.
    pub acquire_requests: u64,
    /// Fair leases acquired by hand-off: a release gave the lock straight to the waiter,
    /// which learned it by notification, without another acquire request.
    pub handed_over: u64,
}

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

    /// A request for the lock on `key`, with this manager's default ttl and wait and renewal on.
    pub fn lock(&self, key: impl Into<String>) -> LockRequest {
        self.lock_all([key])
    }

    /// A request for the locks on all `keys` as one unit: all are taken or none is. Keys are
    /// sorted and de-duplicated first, so two callers naming the same keys in different orders
    /// cannot deadlock.
    pub fn lock_all<I, K>(&self, keys: I) -> LockRequest
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        LockRequest {
            manager: self.clone(),
            keys: keys.into_iter().map(Into::into).collect(),
            ttl: self.inner.default_ttl,
            wait: self.inner.default_wait,
            renew: true,
            fair: None,
        }
    }

    /// A request for the lock on `key` that tries once and does not wait:
    /// `lock(key).wait(Duration::ZERO)`.
    pub fn try_lock(&self, key: impl Into<String>) -> LockRequest {
        self.lock(key).wait(Duration::ZERO)
    }

    /// The connection pool this manager takes its connections from.
    pub fn pool(&self) -> &Pool {
        self.inner.redis.pool()
    }

    /// The prefix of every Redis key this manager writes.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The Redis key that holds the lock on `key`.
    pub fn redis_key(&self, key: &str) -> String {
        self.lock_keys(key).lock
    }

    /// Every Redis key of the lock on `key`.
    pub(crate) fn lock_keys(&self, key: &str) -> LockKeys {
        LockKeys::new(&self.inner.prefix, key)
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
        let stats = &self.inner.stats;
        LockStats {
            acquire_requests: stats.acquire_requests.load(Ordering::Relaxed),
            handed_over: stats.handed_over.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn redis(&self) -> &Redis {
        &self.inner.redis
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    async fn acquire(
        &self,
        keys: Arc<[String]>,
        ttl: Duration,
        started: Instant,
        wait: Duration,
        renew: bool,
        fair: bool,
    ) -> Result<Lease, LockError> {
        let redis_keys: Arc<[LockKeys]> = keys.iter().map(|k| self.lock_keys(k)).collect();
        let token: Arc<str> = new_token().into();
        let state = Arc::new(LeaseState::new(ttl));
        // Registered before the request goes out: an acquired lease can never miss renewal.
        let mut registration = renew.then(|| {
            self.inner.renewals.register(
                Arc::clone(&redis_keys),
                Arc::clone(&token),
                Arc::clone(&state),
            )
        });
        let request = if fair {
            AcquireRequest::Fair(FairRequest::new(&redis_keys[0], ttl))
        } else {
            AcquireRequest::new(&redis_keys, &token, ttl)
        };

        let deadline = started
            .checked_add(wait)
            .unwrap_or_else(|| started + Duration::from_secs(100 * 365 * 86_400));
        let mut waiter = Waiter::new(
            deadline,
            self.inner.notifications.as_ref(),
            fair.then(|| Arc::clone(&token)),
        );
        let mut in_doubt = InDoubt {
            manager: self,
            redis_keys: &redis_keys,
            token: &token,
            ttl,
            fair,
            armed: false,
            in_flight: false,
        };
        // A fair waiter stays in the key's queue between attempts, and may be handed the lock
        // at any moment: leaving early must release (which also leaves the queue).
        let mut queued = false;
        // When the last fair attempt was sent, and Redis's clock when it ran: dates a hand-off.
        let mut calibration = None;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            // A fair attempt stores a new secret in the queue; only a hand-off made after it
            // (by the release script, which alone can read it) shows it.
            let secret: Option<Arc<str>> = fair.then(|| new_token().into());
            waiter.before_attempt(&redis_keys[0].lock, secret.clone());
            let sent = Instant::now();
            // If this call is cancelled or fails while the request is out, the lock may have
            // been taken: release it (by token) rather than leave it until its ttl.
            in_doubt.armed = true;
            in_doubt.in_flight = true;
            self.inner
                .stats
                .acquire_requests
                .fetch_add(1, Ordering::Relaxed);
            let answer = match request
                .send(self.redis(), &token, secret.as_deref(), deadline, sent)
                .await
            {
                Ok((answer, server_ms)) => {
                    if let Some(server_ms) = server_ms {
                        calibration = Some((sent, server_ms));
                    }
                    answer
                }
                Err(failed) => {
                    match failed.reached {
                        // Never sent: nothing to undo, but a queued fair waiter still leaves.
                        Reached::No => {
                            in_doubt.in_flight = false;
                            in_doubt.armed = queued;
                        }
                        // Ran and failed: scripts are not rolled back, so whatever it wrote
                        // (a lock, a queue entry) is released by token, once.
                        Reached::Answered => in_doubt.in_flight = false,
                        // May still arrive: released, and again in case it runs later.
                        Reached::Maybe => {}
                    }
                    return Err(failed.error);
                }
            };
            in_doubt.in_flight = false;
            in_doubt.armed = queued;
            let fencing_token = match answer {
                Acquire::Acquired { fencing_token } => {
                    state.acquired(sent, ttl);
                    if let Some(registration) = &registration {
                        registration.schedule(sent, ttl);
                    }
                    fencing_token
                }
                Acquire::Held {
                    first_held,
                    remaining,
                } => {
                    let key = || keys.get(first_held).cloned().unwrap_or_default();
                    if wait.is_zero() {
                        return Err(LockError::NotAcquired { key: key() });
                    }
                    queued = fair;
                    in_doubt.armed = queued;
                    let held_key = redis_keys.get(first_held).map_or("", |k| k.lock.as_str());
                    let handoff = match waiter.wait(held_key, remaining, sent).await {
                        Wake::Retry => continue,
                        Wake::Deadline => {
                            return Err(LockError::Timeout {
                                key: key(),
                                waited: started.elapsed(),
                            })
                        }
                        Wake::Handed(handoff) => handoff,
                    };
                    let trusted = handoff_start(calibration, handoff.server_ms).filter(|start| {
                        *start + crate::lease::validity(handoff.claim)
                            > Instant::now() + Duration::from_millis(1)
                    });
                    let Some(start) = trusted else {
                        // Learned too late to trust the claim (or undated): an attempt
                        // confirms the hand-off, or queues again if it lapsed.
                        continue;
                    };
                    state.handed(start, handoff.claim, ttl);
                    self.inner.stats.handed_over.fetch_add(1, Ordering::Relaxed);
                    // A claim shorter than the ttl is extended to the ttl at once.
                    let claimed = (handoff.claim < ttl).then(Instant::now);
                    match (&registration, claimed) {
                        (Some(registration), Some(now)) => registration.schedule_at(now),
                        (Some(registration), None) => registration.schedule(start, ttl),
                        (None, Some(_)) => {
                            registration = Some(self.inner.renewals.register_once(
                                Arc::clone(&redis_keys),
                                Arc::clone(&token),
                                Arc::clone(&state),
                            ));
                        }
                        (None, None) => {}
                    }
                    handoff.fencing_token
                }
            };
            if state.is_lost() {
                // The answer came after the lease it granted had run out.
                in_doubt.armed = true;
                return Err(LockError::RedisTimeout {
                    op: "acquire (answered after the lease had expired)",
                    after: sent.elapsed(),
                });
            }
            in_doubt.armed = false;
            if attempts > 1 {
                tracing::debug!(keys = ?keys, waited = ?started.elapsed(), attempts, "distlock acquired after waiting");
            }
            return Ok(Lease::new(
                self.clone(),
                keys,
                redis_keys.clone(),
                token.clone(),
                fencing_token,
                state,
                registration,
            ));
        }
    }

    /// Deletes the keys still held by `token` (handing each to its oldest fair waiter, if it
    /// has one); returns how many were. With `queued`, `token` also leaves the keys' fair
    /// queues: a fair waiter that gives up, or whose attempt may have queued it.
    pub(crate) async fn release_keys(
        &self,
        redis_keys: &[LockKeys],
        token: &str,
        queued: bool,
    ) -> Result<usize, LockError> {
        let mut invocation = scripts::RELEASE.prepare_invoke();
        for keys in redis_keys {
            invocation
                .key(keys.lock.as_str())
                .key(keys.queue.as_str())
                .key(keys.waiters.as_str())
                .key(keys.fence.as_str());
        }
        invocation.arg(token).arg(if queued { "1" } else { "0" });
        self.redis().invoke("release", &invocation).await
    }

    /// Releases from a spawned task: the fallback when a lease is dropped instead of released,
    /// or an acquire ended without knowing whether it took the lock, or a fair waiter left its
    /// queue (see [`Leaving`]). Retries failed attempts until `ttl` from now, when the keys have
    /// expired anyway.
    pub(crate) fn release_in_background(
        &self,
        redis_keys: Arc<[LockKeys]>,
        token: Arc<str>,
        ttl: Duration,
        leaving: Leaving,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                keys = ?lock_names(&redis_keys),
                "distlock lease dropped outside a Tokio runtime; it expires after its ttl"
            );
            return;
        };
        let manager = self.clone();
        let give_up = Instant::now() + ttl;
        let response_timeout = self.redis().response_timeout();
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(50);
            let mut repeats = match leaving {
                Leaving::InFlight | Leaving::InFlightFair => 2,
                Leaving::Dropped | Leaving::Queued => 0,
            };
            loop {
                let queued = matches!(leaving, Leaving::Queued | Leaving::InFlightFair);
                let error = match manager.release_keys(&redis_keys, &token, queued).await {
                    Ok(released)
                        if repeats > 0
                            && (released == 0 || leaving == Leaving::InFlightFair)
                            && Instant::now() < give_up =>
                    {
                        repeats -= 1;
                        tokio::time::sleep(response_timeout).await;
                        continue;
                    }
                    Ok(_) => return,
                    Err(error) => error,
                };
                // Redis refusing the release (an ACL, say) refuses it again: only an outage
                // is worth waiting out.
                let outage = match &error {
                    LockError::RedisTimeout { .. } => true,
                    LockError::Redis { source, .. } => crate::conn::is_connection_failure(source),
                    _ => false,
                };
                if !outage || Instant::now() + pause >= give_up {
                    tracing::warn!(keys = ?lock_names(&redis_keys), %error, "distlock release failed; the lock expires after its ttl");
                    return;
                }
                tracing::debug!(keys = ?lock_names(&redis_keys), %error, "distlock background release failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
    }
}

/// The lock keys' Redis names, for logs.
fn lock_names(redis_keys: &[LockKeys]) -> Vec<&str> {
    redis_keys.iter().map(|k| k.lock.as_str()).collect()
}

/// The acquire request of one lease, built once and sent at every attempt.
enum AcquireRequest {
    /// The all-or-nothing script, for one key or several.
    All(redis::ScriptInvocation<'static>),
    /// One key, fairly: the queueing script.
    Fair(FairRequest),
}

/// The fair acquire script's keys and fixed arguments; the token, the wait left and the
/// attempt's secret are added per attempt.
struct FairRequest {
    keys: [String; 4],
    ttl_ms: u64,
    claim_ms: u64,
}

impl FairRequest {
    fn new(keys: &LockKeys, ttl: Duration) -> Self {
        Self {
            keys: [
                keys.lock.clone(),
                keys.queue.clone(),
                keys.waiters.clone(),
                keys.fence.clone(),
            ],
            ttl_ms: renew::millis(ttl),
            claim_ms: renew::millis(ttl.min(HANDOFF_CLAIM)),
        }
    }
}

/// How long a lock handed to a fair waiter is held for it before the waiter extends it to its
/// ttl. A hand-off to a waiter that is gone (crashed, or its process stalled) costs the queue
/// at most this long (plus a quarter, the next waiter's slack) before the next waiter takes
/// the lock.
pub const HANDOFF_CLAIM: Duration = Duration::from_secs(2);

impl AcquireRequest {
    fn new(redis_keys: &[LockKeys], token: &str, ttl: Duration) -> Self {
        let mut invocation = scripts::ACQUIRE.prepare_invoke();
        for keys in redis_keys {
            invocation.key(keys.lock.as_str());
        }
        for keys in redis_keys {
            invocation.key(keys.fence.as_str());
        }
        invocation.arg(token).arg(renew::millis(ttl));
        Self::All(invocation)
    }

    /// Sends one attempt; returns the answer and, for a fair attempt, Redis's clock (ms).
    async fn send(
        &self,
        redis: &Redis,
        token: &str,
        secret: Option<&str>,
        deadline: Instant,
        now: Instant,
    ) -> Result<(Acquire, Option<u64>), crate::conn::Failed> {
        let answer = match self {
            Self::All(invocation) => redis
                .call("acquire", invocation)
                .await
                .map(|answer| (answer, None)),
            Self::Fair(fair) => {
                let mut invocation = scripts::ACQUIRE_FAIR.prepare_invoke();
                for key in &fair.keys {
                    invocation.key(key.as_str());
                }
                // At most a century: the script does arithmetic on it in Lua numbers.
                let wait_ms = u64::try_from(deadline.saturating_duration_since(now).as_millis())
                    .unwrap_or(u64::MAX)
                    .min(100 * 365 * 86_400_000);
                invocation
                    .arg(token)
                    .arg(fair.ttl_ms)
                    .arg(fair.claim_ms)
                    .arg(wait_ms)
                    .arg(secret.unwrap_or_default());
                redis
                    .call::<scripts::FairAnswer>("acquire", &invocation)
                    .await
                    .map(|answer| (answer.acquire, Some(answer.server_ms)))
            }
        };
        answer.map_err(|mut failed| {
            // Redis before 7.0 cannot compile a script that declares itself with `#!lua`.
            if let LockError::Redis { source, .. } = &failed.error {
                let text = source.to_string();
                if text.contains("Error compiling script") && text.contains("'#'") {
                    let source = source.clone();
                    failed.error = LockError::Redis {
                        op: "acquire (the script was refused: distlock needs Redis 7.0 or newer)",
                        source,
                    };
                }
            }
            failed
        })
    }
}

/// The earliest moment (on this host's clock) a hand-off at Redis time `server_ms` can have
/// happened, from an attempt sent at `sent` that ran at Redis time `ran_ms`: Redis's clock has
/// advanced `server_ms - ran_ms` since a moment after `sent`. Allows 1% clock-rate drift and
/// 1 ms for the millisecond resolution. `None` without a dated attempt.
fn handoff_start(calibration: Option<(Instant, u64)>, server_ms: u64) -> Option<Instant> {
    let (sent, ran_ms) = calibration?;
    let start = if server_ms >= ran_ms {
        let elapsed = Duration::from_millis(server_ms - ran_ms);
        (sent + elapsed - elapsed / 100).checked_sub(Duration::from_millis(1))?
    } else {
        let before = Duration::from_millis(ran_ms - server_ms);
        sent.checked_sub(before + before / 100 + Duration::from_millis(1))?
    };
    Some(start.min(Instant::now()))
}

/// Why a release runs in the background, which decides how often it is repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// A lease dropped instead of released: released once.
    Dropped,
    /// An acquire request may still be on its way, on the connection that was given up, behind
    /// this release on a fresh one: a release that found nothing is repeated twice, a response
    /// timeout apart.
    InFlight,
    /// A fair acquire request may still be on its way: even after a release that found the key
    /// (handed over meanwhile), it could queue the token again or take the key, so the release
    /// is repeated twice whatever it finds.
    InFlightFair,
    /// A fair waiter left between attempts: one release takes it out of the queue and passes on
    /// a hand-off it was given.
    Queued,
}

/// Releases a lock whose acquire request may have reached Redis when the acquire did not
/// finish, and takes a fair waiter that leaves out of its queue.
struct InDoubt<'a> {
    manager: &'a LockManager,
    redis_keys: &'a Arc<[LockKeys]>,
    token: &'a Arc<str>,
    ttl: Duration,
    fair: bool,
    /// Release on drop.
    armed: bool,
    /// An acquire request is out (or was given up unanswered).
    in_flight: bool,
}

impl Drop for InDoubt<'_> {
    fn drop(&mut self) {
        if self.armed {
            let leaving = match (self.in_flight, self.fair) {
                (true, true) => Leaving::InFlightFair,
                (true, false) => Leaving::InFlight,
                (false, _) => Leaving::Queued,
            };
            self.manager.release_in_background(
                Arc::clone(self.redis_keys),
                Arc::clone(self.token),
                self.ttl,
                leaving,
            );
        }
    }
}

impl fmt::Debug for LockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManager")
            .field("endpoint", &self.inner.endpoint)
            .field("prefix", &self.inner.prefix)
            .field("default_ttl", &self.inner.default_ttl)
            .field("default_wait", &self.inner.default_wait)
            .finish_non_exhaustive()
    }
}

/// A lock about to be taken: set the ttl, wait and renewal, then [`acquire`](Self::acquire) a
/// [`Lease`] or [`run`](Self::run) a future under it.
#[must_use = "a LockRequest does nothing until .acquire() or .run(future) is awaited"]
#[derive(Debug)]
pub struct LockRequest {
    manager: LockManager,
    keys: Vec<String>,
    ttl: Duration,
    wait: Duration,
    renew: bool,
    /// `None`: the manager's default (for one key).
    fair: Option<bool>,
}

impl LockRequest {
    /// How long the lease lasts without renewal (Redis expires it then). Default: the manager's
    /// default ttl (30 s unless the builder changed it). From [`MIN_TTL`] to [`MAX_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait for a held lock before giving up with [`LockError::Timeout`]. Zero tries
    /// once and fails with [`LockError::NotAcquired`]. Default: the manager's default wait (10 s
    /// unless the builder changed it).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether to extend the lease every ttl/3 while it is held. Default: `true`. Without it the
    /// lease ends after its ttl, and [`run`](Self::run) stops a body still running then.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Whether waiters are served in arrival order: waiters queue in Redis, and a release hands
    /// the lock straight to the oldest live waiter, which starts without another acquire
    /// request (see the crate docs, "Fair locks"). Default: the manager's
    /// [`default_fair`](LockManagerBuilder::default_fair) (`false` unless changed). Only a
    /// request for one key can be fair: [`acquire`](Self::acquire) and [`run`](Self::run)
    /// refuse `fair(true)` with several keys ([`LockError::InvalidConfig`]).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // Buyers of one hot product are served first come, first served.
    /// let lease = locks.lock("stock:sku-1").fair(true).acquire().await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = Some(fair);
        self
    }

    /// Takes the lock: one round trip when it is free; otherwise waits until it is, or until the
    /// wait runs out.
    ///
    /// # Errors
    /// [`LockError::NotAcquired`] (wait zero) or [`LockError::Timeout`] when another owner held a
    /// key throughout; [`LockError::InvalidKey`] / [`LockError::InvalidConfig`] for an empty key
    /// or a ttl outside [`MIN_TTL`]..=[`MAX_TTL`]; [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis
    /// cannot be asked within the manager's timeouts.
    pub async fn acquire(self) -> Result<Lease, LockError> {
        let keys = prepare_keys(self.keys)?;
        check_ttl(self.ttl)?;
        let fair = fair_for(&self.manager, self.fair, &keys)?;
        self.manager
            .acquire(keys, self.ttl, Instant::now(), self.wait, self.renew, fair)
            .await
    }

    /// Takes the lock, runs `body` under it, and releases it whatever happens: when the body
    /// returns, panics, or this future is dropped (then the release is sent from a spawned task).
    ///
    /// If the lease is lost while the body runs (see [`Lease::lost`]), the body is dropped at its
    /// next await point and the call returns [`LockError::LeaseLost`]. A failed release after a
    /// finished body does not hide the body's result: it is logged, and the keys expire after
    /// their ttl.
    ///
    /// **Re-entrancy:** inside a `run` body, a `run` on the same task and manager (or a clone)
    /// for keys this task already holds runs its body at once under the outer lease, without
    /// asking Redis. If only some of the keys are held, the others are acquired as a new lease
    /// (waiting as usual) and the held ones stay under the outer lease. Like any nested locking,
    /// that can wait on a task that waits on this one; the wait then ends in
    /// [`LockError::Timeout`]: take all keys in the outer call to avoid it.
    ///
    /// Re-entry is for strict nesting only: calls for a held key that run side by side on one
    /// task (`join!`, `select!`, `FuturesUnordered` inside the body) are separate critical
    /// sections and never overlap. The first one borrows the key from the enclosing body until
    /// it ends; the others wait for it (within their `wait`, failing with
    /// [`LockError::Timeout`], or [`LockError::NotAcquired`] with a zero wait), while calls
    /// nested inside the first re-enter at once.
    ///
    /// # Errors
    /// Those of [`acquire`](Self::acquire), and [`LockError::LeaseLost`].
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        let keys = prepare_keys(self.keys)?;
        check_ttl(self.ttl)?;
        let fair = fair_for(&self.manager, self.fair, &keys)?;
        let manager = self.manager;
        let started = Instant::now();
        let entry = reentrancy::enter(manager.id(), &keys, started, self.wait).await?;
        if entry.missing().is_empty() {
            return Ok(entry.scope(None, body).await);
        }
        let span =
            tracing::debug_span!("distlock", keys = ?keys, fencing_token = tracing::field::Empty);
        async move {
            let missing: Arc<[String]> = entry.missing().into();
            let lease = manager
                .acquire(missing, self.ttl, started, self.wait, self.renew, fair)
                .await?;
            let fencing_token = lease.fencing_token();
            tracing::Span::current().record("fencing_token", fencing_token);
            let scoped = entry.scope(
                Some((Arc::clone(lease.shared_keys()), fencing_token)),
                body,
            );
            let outcome = tokio::select! {
                biased;
                () = lease.lost() => {
                    tracing::warn!(keys = ?lease.keys(), "distlock lease lost; the body was stopped");
                    Err(LockError::LeaseLost { keys: lease.keys().to_vec() })
                }
                output = scoped => Ok(output),
            };
            if let Err(error) = lease.release().await {
                tracing::warn!(%error, "distlock release failed; the lock expires after its ttl");
            }
            outcome
        }
        .instrument(span)
        .await
    }
}

/// Whether a request for `keys` (sorted, de-duplicated) is served fairly: as asked, else by the
/// manager's default, which applies to single-key requests only.
fn fair_for(
    manager: &LockManager,
    asked: Option<bool>,
    keys: &[String],
) -> Result<bool, LockError> {
    match asked {
        Some(true) if keys.len() > 1 => Err(LockError::InvalidConfig {
            what: "fair",
            reason: format!(
                "a fair request takes one key, not {}: waiters queue on one key at a time, and \
                 queueing on several at once could deadlock; lock one key fairly, or drop .fair(true)",
                keys.len()
            ),
        }),
        Some(fair) => Ok(fair),
        None => Ok(manager.inner.default_fair && keys.len() == 1),
    }
}

/// Sorts and de-duplicates the keys of a request, refusing unusable ones.
fn prepare_keys(mut keys: Vec<String>) -> Result<Arc<[String]>, LockError> {
    if keys.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "no key given: lock_all needs at least one key",
        });
    }
    if let Some(empty) = keys.iter().find(|k| k.is_empty()) {
        return Err(LockError::InvalidKey {
            key: empty.clone(),
            reason: "a lock key must not be empty",
        });
    }
    keys.sort_unstable();
    keys.dedup();
    Ok(keys.into())
}

pub(crate) fn check_ttl(ttl: Duration) -> Result<(), LockError> {
    if ttl > MAX_TTL {
        return Err(LockError::InvalidConfig {
            what: "ttl",
            reason: format!(
                "{ttl:?} is too long: a lease lasts at most {MAX_TTL:?}; use renewal for long \
                 critical sections"
            ),
        });
    }
    if ttl < MIN_TTL {
        return Err(LockError::InvalidConfig {
            what: "ttl",
            reason: format!(
                "{ttl:?} is too short: a lease must last at least {MIN_TTL:?} (give the \
                 longest time the critical section may take, or a few seconds with renewal)"
            ),
        });
    }
    Ok(())
}

/// A random 128-bit owner token (a uuid v4 from the OS random source, as 32 hex digits). Not from
/// a seeded per-thread generator: a fork, a restored VM snapshot or a call that reseeds such a
/// generator would repeat its tokens, and an acquire that finds its own token counts as success.
fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
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

    /// Whether single-key requests that do not say are fair (see [`LockRequest::fair`]).
    /// Default `false`: a fair acquire costs a Lua script call even when the lock is free,
    /// where an unfair one is three plain commands, and unfair waiters are already woken by
    /// notification rather than polling.
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
    /// the pool size is zero or the default ttl is outside [`MIN_TTL`]..=[`MAX_TTL`];
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
                let (info, endpoint) = parse_url(&url)?;
                let client =
                    redis::Client::open(info.clone()).map_err(|e| LockError::InvalidUrl {
                        reason: e.to_string(),
                    })?;
                let notifications = Notifications::new(client, timeouts);
                let pool = create_pool(info, self.pool_size, timeouts)?;
                (pool, endpoint, true, Some(notifications))
            }
        };
        let redis = Arc::new(Redis::new(pool, timeouts, bounded_connections));
        Ok(LockManager {
            inner: Arc::new(Inner {
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
            }),
        })
    }
}

/// Parses a Redis URL; returns the connection info and the URL with its password masked.
fn parse_url(url: &str) -> Result<(redis::ConnectionInfo, String), LockError> {
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

fn create_pool(
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

static DEFAULT_MANAGER: RwLock<Option<LockManager>> = RwLock::new(None);

/// Installs the manager that `#[distributed_lock]` functions without `manager = ...` use.
/// Replaces one installed before.
pub fn set_default_manager(manager: LockManager) {
    *DEFAULT_MANAGER
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(manager);
}

/// The manager installed with [`set_default_manager`].
///
/// # Errors
/// [`LockError::NotConfigured`] when none was installed.
pub fn default_manager() -> Result<LockManager, LockError> {
    DEFAULT_MANAGER
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
        .ok_or(LockError::NotConfigured)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn keys_are_sorted_and_deduplicated_and_empty_ones_refused() {
        let keys = prepare_keys(vec!["b".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(&*keys, ["a", "b"]);
        assert!(matches!(
            prepare_keys(vec!["a".into(), String::new()]),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(matches!(
            prepare_keys(vec![]),
            Err(LockError::InvalidKey { .. })
        ));
    }

    #[test]
    fn ttls_under_the_minimum_are_refused() {
        assert!(check_ttl(MIN_TTL).is_ok());
        assert!(check_ttl(MIN_TTL - Duration::from_nanos(1)).is_err());
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(MAX_TTL).is_ok());
        assert!(check_ttl(Duration::MAX).is_err());
    }

    #[test]
    fn a_hand_off_is_dated_no_later_than_redis_made_it() {
        let sent = Instant::now() - Duration::from_secs(5);
        // Redis ran the attempt at 1,000,000 ms and handed over 3,000 ms later on its clock:
        // at least 3 s less 1% drift and 1 ms resolution after the attempt was sent.
        let start = handoff_start(Some((sent, 1_000_000)), 1_003_000).unwrap();
        assert_eq!(start, sent + Duration::from_millis(3_000 - 30 - 1));
        // A hand-off dated before the attempt ran (another attempt's date) reaches back.
        let start = handoff_start(Some((sent, 1_000_000)), 999_000).unwrap();
        assert_eq!(start, sent - Duration::from_millis(1_000 + 10 + 1));
        // Never later than now, whatever Redis's clock says.
        let start = handoff_start(Some((sent, 1_000_000)), 1_000_000 + 60_000).unwrap();
        assert!(start <= Instant::now());
        assert!(handoff_start(None, 1_000_000).is_none());
    }

    #[test]
    fn tokens_are_uuid_v4_hex_and_distinct() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a.as_bytes()[12], b'4', "version 4: {a}");
        assert_ne!(a, b);
    }

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

    #[test]
    fn locks_live_under_the_prefix_each_with_its_own_counter() {
        let locks = LockManager::builder()
            .url("redis://127.0.0.1:1")
            .prefix("app:")
            .build()
            .unwrap();
        assert_eq!(locks.redis_key("fence"), "app:lock:fence");
        assert_eq!(locks.lock_keys("fence").fence, "app:fence:fence");
    }
}
