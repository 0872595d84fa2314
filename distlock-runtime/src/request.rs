//! [`LockRequest`]: one request for a lock (its keys, ttl, wait, renewal and fairness), checked
//! and then acquired as a [`Lease`] or run around a body.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::acquire::{self, Ask};
use crate::context::Context;
use crate::error::LockError;
use crate::lease::Lease;
use crate::mode::{KeyModes, LockMode};
use crate::order::{Classes, Site};
use crate::reentrancy::{self, Named};
use crate::telemetry::Tags;
use crate::validity::check_ttl;
use crate::wait::Wait;

/// A lock about to be taken: set the ttl, wait and renewal, then [`acquire`](Self::acquire) a
/// [`Lease`] or [`run`](Self::run) a future under it. Made by
/// [`LockManager::lock`](crate::LockManager::lock) and its siblings.
///
/// ```no_run
/// use std::time::Duration;
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// let total = locks
///     .lock("cart:7")
///     .ttl(Duration::from_secs(5))
///     .wait(Duration::from_secs(1))
///     .run(async { /* read, change and write the cart */ 3 })
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a LockRequest does nothing until .acquire() or .run(future) is awaited"]
#[derive(Debug)]
pub struct LockRequest {
    manager: Arc<Context>,
    keys: Vec<String>,
    read: Vec<String>,
    permits: Option<u32>,
    ttl: Duration,
    wait: Duration,
    renew: bool,
    /// `None`: the manager's default (for one key).
    fair: Option<bool>,
    /// `run` keeps the keys held at least this long after the acquisition.
    hold_at_least: Option<Duration>,
    /// Names the request in metrics and spans.
    label: &'static str,
    /// The lock order check's class of each key (`keys`, then `read`, as given) where an
    /// attribute named them; `None`: each key is its own class.
    classes: Option<&'static [&'static str]>,
    /// Where the request was made, for the lock order check's warnings.
    site: Site,
}

impl LockRequest {
    /// A request for `keys` with the manager's defaults and renewal on.
    #[track_caller]
    pub(crate) fn new(manager: Arc<Context>, keys: Vec<String>) -> Self {
        Self {
            ttl: manager.default_ttl,
            wait: manager.default_wait,
            manager,
            keys,
            read: Vec::new(),
            permits: None,
            renew: true,
            fair: None,
            hold_at_least: None,
            label: crate::telemetry::UNLABELLED,
            classes: None,
            site: Site::Call(std::panic::Location::caller()),
        }
    }

    /// An annotated fn's request: the class of each key (exclusive, then shared, as written)
    /// and the fn's name, for the lock order check.
    pub(crate) fn attribute(
        mut self,
        classes: &'static [&'static str],
        name: &'static str,
    ) -> Self {
        self.classes = Some(classes);
        self.site = Site::Attribute(name);
        self
    }

    /// The `template` label of this request's metrics and span: what the request is for, such as
    /// its key template (`"order:{id}"`); the attribute sets its own. Never a rendered key:
    /// each distinct label is a series of its own. Default `"manual"`.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager, id: u64) -> Result<(), distlock_runtime::LockError> {
    /// let lease = locks.lock(format!("order:{id}")).metrics_label("order:{id}").acquire().await?;
    /// # Ok(()) }
    /// ```
    pub fn metrics_label(mut self, label: &'static str) -> Self {
        self.label = label;
        self
    }

    /// With [`run`](Self::run): after the body ends, the keys stay held until this long after
    /// the acquisition (then they expire by themselves), instead of being released at once. For
    /// jobs that must run at most once per tick across a fleet: an instance whose clock or
    /// schedule runs a little late finds the tick's lock still held and does not run it again
    /// (ShedLock's `lockAtLeastFor`). A body that runs longer than this is released as usual.
    /// A body that fails keeps the lock held too, so a failing tick is not retried by the next
    /// instance within the same tick.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// use std::time::Duration;
    /// // Every instance calls this every minute; one of them sends the report.
    /// let sent = locks
    ///     .try_lock("report:daily")
    ///     .hold_at_least(Duration::from_secs(50))
    ///     .run(async { /* send the report */ })
    ///     .await;
    /// # Ok(()) }
    /// ```
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = Some(hold);
        self
    }

    /// How long the lease lasts without renewal (Redis expires it then). Default: the manager's
    /// default ttl (30 s unless the builder changed it). From [`MIN_TTL`](crate::MIN_TTL) to [`MAX_TTL`](crate::MAX_TTL).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // Renewed every 2 s while held; expires 6 s after a crash of this process.
    /// let lease = locks.lock("import:csv").ttl(Duration::from_secs(6)).acquire().await?;
    /// # Ok(()) }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long to wait for a held lock before giving up with [`LockError::Timeout`]. Zero tries
    /// once and fails with [`LockError::NotAcquired`]. Default: the manager's default wait (10 s
    /// unless the builder changed it).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use distlock_runtime::LockError;
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), LockError> {
    /// match locks.lock("order:42").wait(Duration::from_millis(250)).acquire().await {
    ///     Ok(lease) => lease.release().await?,
    ///     Err(LockError::Timeout { key, waited }) => println!("{key} held for {waited:?}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether to extend the lease every ttl/3 while it is held. Default: `true`. Without it the
    /// lease ends after its ttl, and [`run`](Self::run) stops a body still running then.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // A short body: no renewal round trips; it is stopped if it is still running after 2 s.
    /// locks
    ///     .lock("counter:visits")
    ///     .renew(false)
    ///     .ttl(Duration::from_secs(2))
    ///     .run(async { /* a quick read-modify-write */ })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Whether waiters are served in arrival order: waiters queue in Redis, and a release hands
    /// the lock straight to the oldest live waiter, which starts without another acquire
    /// request (see the crate docs, "Fair locks"). Default: the manager's
    /// [`default_fair`](crate::LockManagerBuilder::default_fair) (fair for one key, unless the
    /// topology cannot serve fair requests). Only a request for one key can be fair:
    /// [`acquire`](Self::acquire) and [`run`](Self::run) refuse `fair(true)` with several keys
    /// ([`LockError::InvalidConfig`]).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // Buyers of one hot product are served first come, first served (the default, said
    /// // here for the reader).
    /// let lease = locks.lock("stock:sku-1").fair(true).acquire().await?;
    /// lease.release().await?;
    /// // A cache rebuild that any waiter may do next: whoever asks first after the release.
    /// let lease = locks.lock("cache:home").fair(false).acquire().await?;
    /// # Ok(()) }
    /// ```
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = Some(fair);
        self
    }

    /// Adds `keys` held shared: with other readers, and no writer. Taken together with the
    /// request's other keys, all or none (`manager.lock_all(a).read_keys(b)` takes `a`
    /// exclusively and `b` shared); a key asked both ways is held exclusively. Each lease
    /// has its own token, ttl, renewal and fencing token, whatever the other readers do.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // Write the report, reading the two inputs it is built from.
    /// locks
    ///     .lock("report:7")
    ///     .read_keys(["sales:7", "stock:7"])
    ///     .run(async { /* ... */ })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn read_keys<I, K>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        self.read.extend(keys.into_iter().map(Into::into));
        self
    }

    /// Makes the request's one key a semaphore of `n` permits: it is granted while fewer than
    /// `n` leases hold the key (a waiter is woken by a release). Each permit is a lease of its
    /// own: a crashed holder's permit comes back at its own ttl.
    ///
    /// Each caller is admitted while fewer than its own `n` hold the key (on a quorum: while one
    /// of its own `n` slots is free): callers that pass different `n` for one key (a rolling
    /// change of the limit) let in at most the largest.
    ///
    /// On a quorum, whose nodes each see only the holders they granted, the permits are `n`
    /// slots, each a lock a majority grants: an attempt asks slot after slot (up to `n` rounds),
    /// so keep `n` small there (`docs/modes.md`, "Semaphores on a quorum").
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// // At most 8 exports at once, across the fleet.
    /// locks.lock("exports").permits(8).run(async { /* ... */ }).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The acquire fails with [`LockError::InvalidConfig`] for `n` = 0, a request of several
    /// keys, or one with [`read_keys`](Self::read_keys).
    pub fn permits(mut self, n: u32) -> Self {
        self.permits = Some(n);
        self
    }

    /// Takes the lock: one round trip when it is free; otherwise waits until it is, or until the
    /// wait runs out.
    ///
    /// Inside a [`run`](Self::run) body (or an annotated fn), a key the body's task already holds
    /// cannot be acquired: the lease would wait for the enclosing one, which waits for the body.
    /// That fails at once with [`LockError::HeldByThisTask`]; a nested `run` re-enters instead.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let lease = locks.lock("invoice:7").acquire().await?;
    /// println!("holding {:?} with fencing token {}", lease.keys(), lease.fencing_token());
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::NotAcquired`] (wait zero) or [`LockError::Timeout`] when another owner held a
    /// key throughout; with [`min_replicas`](crate::LockManagerBuilder::min_replicas),
    /// [`LockError::Replication`] when the replicas did not confirm the acquire, or the last
    /// attempt of one that found a key held; [`LockError::HeldByThisTask`] for a key an enclosing body holds; [`LockError::InvalidKey`] / [`LockError::InvalidConfig`] for an empty key
    /// or a ttl outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL); [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis
    /// cannot be asked within the manager's timeouts.
    pub async fn acquire(mut self) -> Result<Lease, LockError> {
        let (ask, named) = self.ask()?;
        if let Some(key) = reentrancy::first_held(self.manager.id, &ask.keys) {
            return Err(LockError::HeldByThisTask {
                key: key.to_owned(),
            });
        }
        if !ask.wait.is_try() {
            reentrancy::check_order(&self.manager, &ask.keys, &named)?;
        }
        acquire::acquire(&self.manager, ask).await
    }

    /// Takes the lock, runs `body` under it, and releases it whatever happens: when the body
    /// returns, panics, or this future is dropped (then the release is sent from a spawned task).
    ///
    /// If the lease is lost while the body runs (see [`Lease::lost`]), the body is dropped at its
    /// next await point and the call returns [`LockError::LeaseLost`]. A failed release after a
    /// finished body does not hide the body's result: it is logged, and retried in the
    /// background as [`Lease::release`] says (until the keys are gone or their ttl has passed).
    ///
    /// **Re-entrancy:** inside a `run` body, a `run` on the same task and manager (or a clone)
    /// for keys this task already holds runs its body at once under the outer lease, without
    /// asking Redis. The inner request's `ttl`, `renew` and `fair` settings do not apply to the
    /// keys it re-enters: they stay under the outer lease, as the outer request set it up (its
    /// `wait` still bounds waiting for a sibling call that borrowed the key). If only some of the keys are held, the others are acquired as a new lease
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
    /// ```no_run
    /// use distlock_runtime::LockError;
    /// # async fn charge(order: u64) -> Result<u64, std::io::Error> { Ok(order) }
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), Box<dyn std::error::Error>> {
    /// // The body's own result comes back inside the lock's.
    /// match locks.lock("order:42").run(charge(42)).await {
    ///     Ok(Ok(receipt)) => println!("charged: {receipt}"),
    ///     Ok(Err(io)) => return Err(io.into()),
    ///     Err(LockError::LeaseLost { .. }) => println!("stopped: the lease was lost"),
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Those of [`acquire`](Self::acquire), and [`LockError::LeaseLost`].
    pub async fn run<F: Future>(mut self, body: F) -> Result<F::Output, LockError> {
        // Boxed: the body passes through the span's block, the held scope and the loss watch,
        // and each would embed a copy of it; a body that makes nested calls would multiply
        // them level by level (three nested levels overflowed a test thread's 2 MB stack).
        let body = Box::pin(body);
        let (ask, named) = self.ask()?;
        let waits = !ask.wait.is_try();
        let found = reentrancy::find(&self.manager, &ask.keys, &ask.modes, &named, waits)?;
        if found.missing.0.is_empty() {
            let entry = found.borrow(ask.wait, None).await?;
            return Ok(entry.scope(body).await);
        }
        let span = tracing::debug_span!(
            "distlock",
            template = self.label,
            keys = ?ask.keys,
            fencing_token = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        async move {
            // The acquire is for the missing keys only.
            let (keys, modes) = found.missing.clone();
            let missing = Ask {
                tags: Tags::new(self.label, &modes),
                keys,
                modes,
                ..ask
            };
            // Boxed: the acquire's state is large, and a nested `run` would carry it inline.
            let acquiring = Box::pin(acquire::acquire(&self.manager, missing));
            let lease = acquiring.await.inspect_err(|error| {
                let outcome = match error {
                    LockError::Timeout { .. } => "timed_out",
                    LockError::NotAcquired { .. } => "not_acquired",
                    _ => "error",
                };
                tracing::Span::current().record("outcome", outcome);
            })?;
            // After Redis set the keys: `hold_at_least` counts from no earlier than that.
            let acquired = Instant::now();
            // Held keys are borrowed only now: no loan is kept while waiting on Redis.
            let entry = match found.borrow(ask.wait, Some(lease.fencing_token())).await {
                Ok(entry) => entry,
                Err(error) => {
                    release(lease).await;
                    return Err(error);
                }
            };
            run_held(lease, entry, body, (ask.tags, acquired), self.hold_at_least).await
        }
        .instrument(span)
        .await
    }

    /// The request checked, as the acquire takes it (its wait starts now), and its keys'
    /// classes.
    fn ask(&mut self) -> Result<(Ask, Named), LockError> {
        let (keys, read) = (
            std::mem::take(&mut self.keys),
            std::mem::take(&mut self.read),
        );
        let ((keys, modes), classes) = prepare_keys(keys, read, self.permits, self.classes)?;
        check_ttl(self.ttl)?;
        // The manager's default applies to single-key requests only.
        let default = self.manager.default_fair && keys.len() == 1;
        let fair = self.fair.unwrap_or(default);
        if fair && keys.len() > 1 {
            return Err(LockError::InvalidConfig {
                what: "fair",
                reason: format!(
                    "a fair request takes one key, not {}: waiters queue on one key at a time, and \
                     queueing on several at once could deadlock; lock one key fairly, or drop .fair(true)",
                    keys.len()
                ),
            });
        }
        let named = Named {
            classes,
            site: self.site,
        };
        let ask = Ask {
            tags: Tags::new(self.label, &modes),
            keys,
            modes,
            ttl: self.ttl,
            wait: Wait::new(Instant::now(), self.wait),
            renew: self.renew,
            fair,
        };
        Ok((ask, named))
    }
}

/// Runs `body` under `lease` (taken at `acquired`, with `entry`'s re-entrancy scope), stopping
/// it if the lease is lost; then keeps the lease until `hold_at_least` has passed, or releases
/// it.
async fn run_held<F: Future>(
    lease: Lease,
    entry: reentrancy::Entry,
    body: F,
    (tags, acquired): (Tags, Instant),
    hold_at_least: Option<Duration>,
) -> Result<F::Output, LockError> {
    tracing::Span::current().record("fencing_token", lease.fencing_token());
    let output = tokio::select! {
        biased;
        () = lease.lost() => None,
        output = entry.scope(body) => Some(output),
    };
    let held_for = acquired.elapsed();
    crate::telemetry::held(tags, held_for);
    let Some(output) = output else {
        let keys = lease.keys().to_vec();
        let loss = lease.state().cause();
        tracing::warn!(?keys, "distlock lease lost: {loss}; the body was stopped");
        // Return now: Redis may be what failed, and the caller must not wait on it.
        // Dropping the lease releases it in the background (a key still held by this
        // owner, after renewal failed, is freed before its ttl once Redis answers).
        drop(lease);
        crate::telemetry::lease_lost(tags);
        tracing::Span::current().record("outcome", "lease_lost");
        return Err(LockError::LeaseLost { keys });
    };
    tracing::Span::current().record("outcome", "ok");
    match hold_at_least.filter(|&hold| hold > held_for) {
        Some(hold) => lease.keep_for(hold - held_for).await,
        None => release(lease).await,
    }
    Ok(output)
}

/// Releases `lease`; a failure is left to its drop, which retries it (see `Lease::release`)
/// and warns if that fails for good.
async fn release(lease: Lease) {
    if let Err(error) = lease.release().await {
        tracing::debug!(%error, "distlock release failed; retrying in the background");
    }
}

/// A request's keys, sorted and de-duplicated, and the mode each is asked in: `keys` exclusively
/// (or as one of `permits`), `read` shared, a key asked both ways exclusively (which covers
/// reading it); with the class of each, where `classes` gives one per key (`keys`, then `read`).
fn prepare_keys(
    keys: Vec<String>,
    read: Vec<String>,
    permits: Option<u32>,
    classes: Option<&'static [&'static str]>,
) -> Result<(KeyModes, Classes), LockError> {
    if keys.is_empty() && read.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "no key given: lock_all needs at least one key",
        });
    }
    if let Some(empty) = keys.iter().chain(&read).find(|k| k.is_empty()) {
        return Err(LockError::InvalidKey {
            key: empty.clone(),
            reason: "a lock key must not be empty",
        });
    }
    let exclusive = match permits {
        None => LockMode::Exclusive,
        Some(0) => {
            return Err(LockError::InvalidConfig {
                what: "permits",
                reason: "permits(0): a semaphore needs at least one permit".to_owned(),
            })
        }
        Some(_) if !read.is_empty() => {
            return Err(LockError::InvalidConfig {
                what: "permits",
                reason: "permits with read_keys: a semaphore is one key, held as a permit; \
                         take the shared keys in a request of their own"
                    .to_owned(),
            })
        }
        Some(n) => LockMode::Permits(n),
    };
    // (A class list that does not match the keys, from an attribute that did not compile, is
    // left out.)
    let classes = classes.filter(|classes| classes.len() == keys.len() + read.len());
    let mut asked: Vec<(String, LockMode, Option<&'static str>)> = keys
        .into_iter()
        .map(|key| (key, exclusive))
        .chain(read.into_iter().map(|key| (key, LockMode::Shared)))
        .enumerate()
        .map(|(at, (key, mode))| (key, mode, classes.map(|classes| classes[at])))
        .collect();
    // By key, the exclusive first, so that de-duplication keeps it.
    asked.sort_unstable_by(|(a, m, _), (b, n, _)| {
        a.cmp(b)
            .then((*m == LockMode::Shared).cmp(&(*n == LockMode::Shared)))
    });
    asked.dedup_by(|later, first| later.0 == first.0);
    if permits.is_some() && asked.len() != 1 {
        return Err(LockError::InvalidConfig {
            what: "permits",
            reason: format!(
                "permits on {} keys: a semaphore is one key; lock(key).permits(n)",
                asked.len()
            ),
        });
    }
    let classes = classes.map(|_| asked.iter().filter_map(|asked| asked.2).collect());
    let (keys, modes): (Vec<String>, Vec<LockMode>) =
        asked.into_iter().map(|(key, mode, _)| (key, mode)).unzip();
    Ok(((keys.into(), modes.into()), classes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_and_deduplicated_and_empty_ones_refused() {
        let prepare =
            |keys: Vec<String>| prepare_keys(keys, Vec::new(), None, None).map(|(keys, _)| keys);
        let (keys, modes) = prepare(vec!["b".into(), "a".into(), "b".into()]).unwrap();
        assert_eq!(&*keys, ["a", "b"]);
        assert_eq!(&*modes, [LockMode::Exclusive; 2]);
        assert!(matches!(
            prepare(vec!["a".into(), String::new()]),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(matches!(prepare(vec![]), Err(LockError::InvalidKey { .. })));
    }

    #[test]
    fn shared_keys_join_the_sorted_keys_and_a_key_asked_both_ways_is_exclusive() {
        // Each key's class (an attribute's) follows it through the sort.
        let given: &'static [&'static str] = &["B", "C", "B'", "A", "C'"];
        let ((keys, modes), classes) = prepare_keys(
            vec!["b".into()],
            vec!["c".into(), "b".into(), "a".into(), "c".into()],
            None,
            Some(given),
        )
        .unwrap();
        assert_eq!(&*keys, ["a", "b", "c"]);
        assert_eq!(classes.as_deref(), Some(&["A", "B", "C"][..]));
        use LockMode::{Exclusive, Shared};
        assert_eq!(&*modes, [Shared, Exclusive, Shared]);
        let (keys, modes) = prepare_keys(Vec::new(), vec!["doc".into()], None, None)
            .map(|(keys, _)| keys)
            .unwrap();
        assert_eq!((&*keys, &*modes), (&["doc".to_owned()][..], &[Shared][..]));
    }

    #[test]
    fn permits_take_one_key_and_at_least_one_permit() {
        let one = prepare_keys(
            vec!["pool".into(), "pool".into()],
            Vec::new(),
            Some(8),
            None,
        )
        .map(|(keys, _)| keys)
        .unwrap();
        assert_eq!(&*one.1, [LockMode::Permits(8)]);
        for (keys, read, n) in [
            (vec!["pool"], vec![], 0),
            (vec!["a", "b"], vec![], 2),
            (vec!["pool"], vec!["doc"], 2),
        ] {
            let keys = keys.into_iter().map(String::from).collect();
            let read = read.into_iter().map(String::from).collect();
            assert!(matches!(
                prepare_keys(keys, read, Some(n), None).map(|(keys, _)| keys),
                Err(LockError::InvalidConfig {
                    what: "permits",
                    ..
                })
            ));
        }
    }
}
