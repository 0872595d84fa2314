//! A held lease: its keys, owner token and fencing token, how it ends, and how it learns it
//! was lost.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::conn::lock;
use crate::keys::LockKeys;
use crate::manager::LockManager;
use crate::renew::{self, Registration};
use crate::{scripts, LockError};

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
    manager: LockManager,
    keys: Arc<[String]>,
    redis_keys: Arc<[LockKeys]>,
    token: Arc<str>,
    fencing_token: u64,
    state: Arc<LeaseState>,
    renewal: Option<Registration>,
    released: bool,
}

impl Lease {
    pub(crate) fn new(
        manager: LockManager,
        keys: Arc<[String]>,
        redis_keys: Arc<[LockKeys]>,
        token: Arc<str>,
        fencing_token: u64,
        state: Arc<LeaseState>,
        renewal: Option<Registration>,
    ) -> Self {
        Self {
            manager,
            keys,
            redis_keys,
            token,
            fencing_token,
            state,
            renewal,
            released: false,
        }
    }

    /// The lock keys this lease holds (without the manager's prefix), sorted and de-duplicated.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The fencing token drawn when this lease was acquired: one number for all its keys,
    /// strictly greater than that of every earlier lease on any of them (from any client, also
    /// after an expiry, and after Redis lost its data: see the crate docs, "Fencing tokens").
    /// Storage that remembers the highest token it accepted can reject a holder that lost its
    /// lease.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// True once the lease is known to be lost, or its validity has run out without renewal.
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Resolves when the lease is lost: renewal found a key gone or owned by someone else,
    /// renewal kept failing until the lease's validity ran out, or (without renewal) its ttl
    /// passed. Never resolves while the lease stays valid.
    pub async fn lost(&self) {
        self.state.lost().await;
    }

    /// Extends the lease to `ttl` from now, if this owner still holds every key; later renewals
    /// use `ttl` too.
    ///
    /// # Errors
    /// [`LockError::LeaseLost`] when a key is gone or owned by someone else (nothing is
    /// re-created; the lease is marked lost); [`LockError::InvalidConfig`] for a ttl under 10 ms;
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis cannot be asked.
    pub async fn extend(&self, ttl: Duration) -> Result<(), LockError> {
        crate::manager::check_ttl(ttl)?;
        let mut invocation = scripts::EXTEND.prepare_invoke();
        for keys in self.redis_keys.iter() {
            invocation.key(keys.lock.as_str());
        }
        invocation
            .arg(&*self.token)
            .arg(renew::millis(ttl))
            .arg(self.redis_keys.len());
        let sent = Instant::now();
        let owned: Vec<i64> = self.manager.redis().invoke("extend", &invocation).await?;
        if owned.first() == Some(&1) {
            let current = self.state.renewed(sent, ttl);
            if self.state.is_lost() {
                return Err(LockError::LeaseLost {
                    keys: self.keys.to_vec(),
                });
            }
            if let (true, Some(renewal)) = (current, &self.renewal) {
                renewal.schedule(sent, ttl);
            }
            Ok(())
        } else {
            self.state.mark_lost();
            Err(LockError::LeaseLost {
                keys: self.keys.to_vec(),
            })
        }
    }

    /// Releases the lease: stops its renewal and deletes each key this owner still holds, in one
    /// script call. Releasing a lease that already expired is not an error.
    ///
    /// If this future is dropped before Redis answers, or the call fails, the release is retried
    /// from a background task until the keys' ttl has passed.
    ///
    /// # Errors
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis cannot be asked.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.renewal = None;
        let deleted = self
            .manager
            .release_keys(&self.redis_keys, &self.token, false)
            .await?;
        self.released = true;
        if deleted < self.redis_keys.len() {
            tracing::debug!(keys = ?self.keys, deleted, "distlock lease had already expired in part");
        }
        Ok(())
    }

    pub(crate) fn shared_keys(&self) -> &Arc<[String]> {
        &self.keys
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            self.renewal = None;
            self.manager.release_in_background(
                Arc::clone(&self.redis_keys),
                Arc::clone(&self.token),
                self.state.ttl(),
                crate::manager::Leaving::Dropped,
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

/// What a lease and its renewal share: until when it is valid, its ttl, and whether it was lost.
pub(crate) struct LeaseState {
    lost: CancellationToken,
    validity: Mutex<Validity>,
}

#[derive(Clone, Copy)]
struct Validity {
    until: Instant,
    ttl: Duration,
    /// When the request that set this expiry was sent: an answer to an older request (a
    /// renewal overtaken by a manual `extend`, say) must not overwrite it.
    sent: Instant,
}

impl LeaseState {
    /// A lease being requested with `ttl`; valid from when [`LeaseState::acquired`] is called.
    pub(crate) fn new(ttl: Duration) -> Self {
        Self {
            lost: CancellationToken::new(),
            validity: Mutex::new(Validity {
                until: Instant::now(),
                ttl,
                sent: Instant::now(),
            }),
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        lock(&self.validity).ttl
    }

    pub(crate) fn valid_until(&self) -> Instant {
        lock(&self.validity).until
    }

    /// The acquire request sent at `sent` took the keys with `ttl`.
    pub(crate) fn acquired(&self, sent: Instant, ttl: Duration) {
        *lock(&self.validity) = Validity {
            until: sent + validity(ttl),
            ttl,
            sent,
        };
    }

    /// A release handed the key over with `claim` as its expiry, at a moment known to be no
    /// earlier than `start` on this host's clock; renewals (the first one due at once when
    /// `claim` is shorter) extend it to `ttl`.
    pub(crate) fn handed(&self, start: Instant, claim: Duration, ttl: Duration) {
        *lock(&self.validity) = Validity {
            until: start + validity(claim),
            ttl,
            sent: start,
        };
    }

    /// Redis set the keys' expiry to `ttl` by a request sent at `sent`. Returns whether this
    /// answer now defines the lease (false for an answer older than the current one). A lease
    /// once lost, or whose validity ran out before this answer, stays lost: there was a moment
    /// when this owner could not know it held the lock.
    pub(crate) fn renewed(&self, sent: Instant, ttl: Duration) -> bool {
        let mut current = lock(&self.validity);
        if self.lost.is_cancelled() || current.until <= Instant::now() {
            self.lost.cancel();
            return false;
        }
        if sent < current.sent {
            return false;
        }
        *current = Validity {
            until: sent + validity(ttl),
            ttl,
            sent,
        };
        true
    }

    /// Whether the lease was marked lost (without checking the clock).
    pub(crate) fn is_lost_flag(&self) -> bool {
        self.lost.is_cancelled()
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.cancel();
    }

    /// Whether the lease is lost; running out of validity loses it for good.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        let current = lock(&self.validity);
        if current.until <= Instant::now() {
            // Under the validity lock, so a renewal cannot revive it in between.
            self.lost.cancel();
            return true;
        }
        false
    }

    pub(crate) async fn lost(&self) {
        loop {
            let until = self.valid_until();
            tokio::select! {
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep_until(until) => {
                    // A renewal may have moved the deadline while we slept.
                    if self.is_lost() {
                        return;
                    }
                }
            }
        }
    }
}

/// How long a lease of `ttl` is trusted, counted from when its request was sent: the ttl less a
/// margin for the drift between this host's clock and Redis's (1% + 2 ms, as in Redlock).
pub(crate) fn validity(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 100 + Duration::from_millis(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_answer_never_overwrites_a_newer_one() {
        let state = LeaseState::new(Duration::from_secs(30));
        let start = Instant::now();
        state.acquired(start, Duration::from_secs(30));
        let early = start + Duration::from_millis(1);
        let late = start + Duration::from_millis(2);
        // A manual extend to 600 ms (sent late) is answered before a 30 s renewal sent earlier.
        assert!(state.renewed(late, Duration::from_millis(600)));
        assert!(!state.renewed(early, Duration::from_secs(30)));
        assert_eq!(state.ttl(), Duration::from_millis(600));
        assert_eq!(
            state.valid_until(),
            late + validity(Duration::from_millis(600))
        );
    }

    #[test]
    fn a_lease_past_its_validity_stays_lost() {
        let state = LeaseState::new(Duration::from_millis(10));
        state.acquired(
            Instant::now() - Duration::from_secs(1),
            Duration::from_millis(10),
        );
        assert!(state.is_lost());
        assert!(!state.renewed(Instant::now(), Duration::from_secs(30)));
        assert!(state.is_lost());
    }
}
