//! A held lease: its keys, owner token and fencing token, how it ends, and how it learns it
//! was lost.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::context::Context;
use crate::error::LockError;
use crate::keys::LockKeys;
use crate::release::{release_in_background, release_keys, Leaving};
use crate::renew::{extend_lease, Registration, Renew};
use crate::scripts::Queued;
use crate::validity::check_ttl;
use crate::validity::{LeaseState, Loss};

/// A lock held in Redis on one or more keys, until it is released, dropped or lost.
///
/// Get one with [`LockRequest::acquire`](crate::LockRequest::acquire). Release it with
/// [`Lease::release`]; dropping it releases in the background instead (a fallback for panics and
/// cancellation, which needs a running Tokio runtime). If it was acquired with `renew(true)` (the
/// default) a background driver extends it about every ttl/3 while it is held.
///
/// Leaking a renewing lease (`std::mem::forget`) keeps it renewed for as long as the manager's
/// runtime runs, like a leaked `MutexGuard`; a leaked lease without renewal ends after its ttl.
///
/// ```no_run
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// let lease = locks.lock("invoice:7").acquire().await?;
/// let token = lease.fencing_token(); // pass it to storage that can reject stale writers
/// // ... critical section ...
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping a Lease releases the lock (from a background task); keep it while the critical section runs"]
pub struct Lease {
    manager: Arc<Context>,
    keys: Arc<[String]>,
    redis_keys: Arc<[LockKeys]>,
    token: Arc<str>,
    fencing_token: u64,
    state: Arc<LeaseState>,
    standing: Standing,
}

/// Whether a lease still holds its keys, as far as it knows.
enum Standing {
    /// Held, renewed while its registration lives (with renewal); its drop releases it.
    Held(Option<Registration>),
    /// Released, or left to expire (`hold_at_least`): nothing is left to release.
    Done,
}

/// What a lease holds in Redis, set up by its acquire before the first request goes out: its
/// Redis keys, owner token, validity and renewal.
pub(crate) struct Holding {
    pub(crate) redis_keys: Arc<[LockKeys]>,
    pub(crate) token: Arc<str>,
    pub(crate) state: Arc<LeaseState>,
    /// With renewal, registered before the first request goes out: a lease that is granted can
    /// never miss its renewal.
    pub(crate) registration: Option<Registration>,
}

impl Holding {
    pub(crate) fn new(
        context: &Context,
        renew: bool,
        redis_keys: Arc<[LockKeys]>,
        token: Arc<str>,
        state: Arc<LeaseState>,
    ) -> Self {
        let mut holding = Self {
            redis_keys,
            token,
            state,
            registration: None,
        };
        let renew = if renew { Renew::Always } else { Renew::Never };
        holding.registration = Some(context.renewals.register(&holding, renew));
        holding
    }

    /// An attempt sent at `sent` took the keys for `ttl`.
    pub(crate) fn took(&self, sent: Instant, ttl: Duration) {
        self.state.acquired(sent, ttl);
        if let Some(registration) = &self.registration {
            registration.schedule(sent, ttl);
        }
    }

    /// A lease without renewal, handed over for less than its ttl: extended to its ttl once,
    /// now.
    pub(crate) fn renew_once(&mut self, context: &Context) {
        self.registration = Some(context.renewals.register(self, Renew::Once));
    }

    /// The Redis key of the lock on the key at `index` among the request's keys.
    pub(crate) fn lock_key(&self, index: usize) -> &str {
        self.redis_keys.get(index).map_or("", LockKeys::lock)
    }
}

impl Lease {
    /// The lease on `keys` that `holding` forms, which it takes over: the acquire keeps its
    /// names only.
    pub(crate) fn new(
        manager: Arc<Context>,
        keys: Arc<[String]>,
        holding: &mut Holding,
        fencing_token: u64,
    ) -> Self {
        if let Some(registration) = &holding.registration {
            registration.held();
        }
        Self {
            manager,
            keys,
            redis_keys: Arc::clone(&holding.redis_keys),
            token: Arc::clone(&holding.token),
            fencing_token,
            state: Arc::clone(&holding.state),
            standing: Standing::Held(holding.registration.take()),
        }
    }

    /// The lock keys this lease holds (without the manager's prefix), sorted and de-duplicated.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let lease = locks.lock_all(["b", "a", "b"]).acquire().await?;
    /// assert_eq!(lease.keys(), ["a", "b"]);
    /// # Ok(()) }
    /// ```
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The fencing token drawn when this lease was acquired: one number for all its keys,
    /// strictly greater than that of every earlier lease on any of them (from any client, also
    /// after an expiry, and after Redis lost its data: see the crate docs, "Fencing tokens").
    /// Storage that remembers the highest token it accepted can reject a holder that lost its
    /// lease.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let lease = locks.lock("account:7").acquire().await?;
    /// // Storage that keeps the greatest token per account refuses a write with a smaller one.
    /// let token = lease.fencing_token();
    /// let write = format!("UPDATE accounts SET balance = 10, fence = {token} \
    ///                      WHERE id = 7 AND fence < {token}");
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// True once the lease is known to be lost, or its validity has run out without renewal.
    ///
    /// ```no_run
    /// # async fn demo(lease: distlock_runtime::Lease) {
    /// for batch in 0..10 {
    ///     if lease.is_lost() {
    ///         break; // another holder may have the lock now: stop writing
    ///     }
    ///     // ... write batch ...
    /// }
    /// # }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// How much longer the lease is valid: until Redis expires it, less the clock-drift margin,
    /// counted from before the request that set its expiry was sent (renewals move it on).
    /// Zero once it is lost or has run out.
    ///
    /// ```no_run
    /// # async fn demo(lease: distlock_runtime::Lease) {
    /// if lease.remaining() < std::time::Duration::from_secs(1) {
    ///     // too little left to start another write under this lease
    /// }
    /// # }
    /// ```
    pub fn remaining(&self) -> Duration {
        if self.state.is_lost() {
            return Duration::ZERO;
        }
        self.state
            .valid_until()
            .saturating_duration_since(tokio::time::Instant::now())
    }

    /// Resolves when the lease is lost: a forced release freed it (at once, where this manager
    /// hears it: see [`LockManager::force_release`](crate::LockManager::force_release)),
    /// renewal found a key gone or owned by someone else, renewal kept failing until the lease's
    /// validity ran out, or (without renewal) its ttl passed. Never resolves while the lease
    /// stays valid.
    ///
    /// ```no_run
    /// # async fn copy_files() {}
    /// # async fn demo(lease: distlock_runtime::Lease) {
    /// tokio::select! {
    ///     () = lease.lost() => println!("lease lost: stopped copying"),
    ///     () = copy_files() => println!("copied"),
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) {
        self.state.lost().await;
    }

    /// Extends the lease to `ttl` from now, if this owner still holds every key; later renewals
    /// use `ttl` too.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let lease = locks.lock("migration").renew(false).acquire().await?;
    /// // ... the work turns out to need longer ...
    /// lease.extend(Duration::from_secs(120)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::LeaseLost`] when a key is gone or owned by someone else (nothing is
    /// re-created; the lease is marked lost); [`LockError::InvalidConfig`] for a ttl under 10 ms;
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis cannot be asked.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        check_ttl(ttl)?;
        let sent = Instant::now();
        let extended =
            extend_lease(self.manager.redis(), &self.redis_keys, &self.token, ttl).await?;
        let current = extended && self.state.renewed(sent, ttl);
        if !extended {
            self.state.lose(Loss::Taken);
        }
        if self.state.is_lost() {
            return Err(LockError::LeaseLost {
                keys: self.keys.to_vec(),
            });
        }
        if let (true, Standing::Held(Some(renewal))) = (current, &self.standing) {
            renewal.schedule(sent, ttl);
        }
        Ok(())
    }

    /// Releases the lease: stops its renewal and deletes each key this owner still holds, in one
    /// script call. Releasing a lease that already expired is not an error.
    ///
    /// If this future is dropped before Redis answers, or the call fails, the release is retried
    /// from a background task: a failure returns its error all the same, and the background
    /// release keeps trying while Redis is away (no answer in time, a broken connection,
    /// `CLUSTERDOWN` or `TRYAGAIN` while a cluster fails over, `READONLY`, `LOADING`) until the
    /// keys are gone or their ttl has passed; a release Redis refuses for good (an ACL) is tried
    /// once more and logged.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let lease = locks.lock("invoice:7").acquire().await?;
    /// // ... critical section ...
    /// lease.release().await?; // the next waiter is woken now
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis cannot be asked (the
    /// release goes on in the background, as said above).
    pub async fn release(mut self) -> Result<(), LockError> {
        self.standing = Standing::Held(None);
        // On failure `self` is dropped unreleased: its drop hands the keys to the background
        // release, which retries an outage until they are gone or their ttl has passed.
        let deleted =
            release_keys(&self.manager, &self.redis_keys, &self.token, Queued::No).await?;
        self.standing = Standing::Done;
        if deleted < self.redis_keys.len() {
            tracing::debug!(keys = ?self.keys, deleted, "distlock lease had already expired in part");
        }
        Ok(())
    }

    /// Stops renewing and lets the keys expire `keep` from now (by owner, like an extension),
    /// instead of releasing them: `hold_at_least`. If Redis cannot be asked, the keys expire
    /// at their current ttl, and a warning says so.
    pub(crate) async fn keep_for(mut self, keep: Duration) {
        self.standing = Standing::Held(None);
        let ttl = keep.max(crate::MIN_TTL);
        let kept = extend_lease(self.manager.redis(), &self.redis_keys, &self.token, ttl).await;
        // Held until it expires, or gone: either way nothing is left to release.
        self.standing = Standing::Done;
        match kept {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(keys = ?self.keys, "distlock lease gone before hold_at_least could keep it");
            }
            Err(error) => {
                tracing::warn!(keys = ?self.keys, %error, "distlock could not keep the lock for hold_at_least; it expires at its ttl");
            }
        }
    }

    /// The lease's validity and loss signal, which outlive the lease (an election watches a
    /// term's loss while its leader's future owns the term).
    pub(crate) fn state(&self) -> &Arc<LeaseState> {
        &self.state
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Standing::Held(renewal) = std::mem::replace(&mut self.standing, Standing::Done) {
            drop(renewal);
            release_in_background(
                &self.manager,
                Arc::clone(&self.redis_keys),
                Arc::clone(&self.token),
                self.state.ttl(),
                if self.state.is_lost() {
                    Leaving::Lost
                } else {
                    Leaving::Dropped
                },
            );
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The owner token is what lets anyone release the lock: keep it out of logs.
        f.debug_struct("Lease")
            .field("keys", &self.keys)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
