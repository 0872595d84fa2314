//! Lease renewal: one driver task per manager extends every renewing lease about every ttl/3.
//!
//! A lease is registered before its acquire request is sent (so no acquired lease can miss its
//! renewal) and deregistered synchronously when it is released, dropped or its `run` is
//! cancelled, so nothing renews a lease its owner has let go. Leases due in the same tick are
//! extended by one script call; each lease's answer is its own, so a lease found gone is marked
//! lost without touching the others. Redis errors are retried until the lease's own validity has
//! run out, then the lease is lost. The driver stops after [`IDLE`] without leases.
//!
//! The driver is woken only when a lease becomes due before the driver's planned wake-up, so a
//! lock cycle that ends before its first renewal costs a registry insert and remove, no task
//! wake-up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::conn::{lock, millis, Redis};
use crate::keys::LockKeys;
use crate::scripts;
use crate::validity::LeaseState;

/// How many leases one renewal script call carries at most. A batch holds Redis for roughly
/// 1 to 2 µs per key, so 10,000 leases cost one ~15 ms call per renewal interval.
const MAX_BATCH: usize = 10_000;

/// How long the driver waits without leases before it stops.
const IDLE: Duration = Duration::from_secs(5);

/// The renewal side of one manager.
pub(crate) struct Renewals {
    shared: Arc<Shared>,
}

struct Shared {
    registry: Mutex<Registry>,
    wake: Notify,
    redis: Arc<Redis>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    /// The id of the running driver task, if one runs.
    driver: Option<u64>,
    /// While the driver sleeps: when it will wake (`None`: only when notified).
    asleep_until: Option<Option<Instant>>,
    /// Since when the registry has been empty.
    idle_since: Option<Instant>,
    leases: HashMap<u64, Entry>,
}

struct Entry {
    keys: Arc<[LockKeys]>,
    token: Arc<str>,
    state: Arc<LeaseState>,
    /// When to renew next; `None` while the acquire request is still out.
    due: Option<Instant>,
    /// Extend once, then leave the registry: the claim of a lease without renewal that was
    /// handed over for a claim time shorter than its ttl.
    once: bool,
}

/// A lease's place in the renewal registry; dropping it stops the lease's renewal at once.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl Renewals {
    pub(crate) fn new(redis: Arc<Redis>) -> Self {
        Self {
            shared: Arc::new(Shared {
                registry: Mutex::new(Registry::default()),
                wake: Notify::new(),
                redis,
            }),
        }
    }

    /// Registers a lease about to be requested; it is not renewed until
    /// [`Registration::schedule`].
    /// Must be called inside a Tokio runtime (it may start the driver task).
    pub(crate) fn register(
        &self,
        keys: Arc<[LockKeys]>,
        token: Arc<str>,
        state: Arc<LeaseState>,
    ) -> Registration {
        self.insert(keys, token, state, false)
    }

    /// Registers a lease without renewal for one extension to its ttl, due now: it was handed
    /// over for a shorter claim time.
    pub(crate) fn register_once(
        &self,
        keys: Arc<[LockKeys]>,
        token: Arc<str>,
        state: Arc<LeaseState>,
    ) -> Registration {
        let registration = self.insert(keys, token, state, true);
        registration.schedule_at(Instant::now());
        registration
    }

    fn insert(
        &self,
        keys: Arc<[LockKeys]>,
        token: Arc<str>,
        state: Arc<LeaseState>,
        once: bool,
    ) -> Registration {
        let mut registry = lock(&self.shared.registry);
        registry.next_id += 1;
        let id = registry.next_id;
        registry.leases.insert(
            id,
            Entry {
                keys,
                token,
                state,
                due: None,
                once,
            },
        );
        start_driver(&self.shared, &mut registry);
        Registration {
            shared: Arc::clone(&self.shared),
            id,
        }
    }
}

impl Registration {
    /// The keys' expiry was set to `ttl` by a request sent at `sent` (the acquire, or a manual
    /// extend): renew a third of `ttl` after it.
    pub(crate) fn schedule(&self, sent: Instant, ttl: Duration) {
        self.schedule_at(sent + interval(ttl));
    }

    /// Renew at `due` (now, for a lease handed over for a short claim time).
    pub(crate) fn schedule_at(&self, due: Instant) {
        let mut registry = lock(&self.shared.registry);
        if let Some(entry) = registry.leases.get_mut(&self.id) {
            entry.due = Some(due);
        }
        // The driver may have died with the runtime it ran on since this lease registered.
        start_driver(&self.shared, &mut registry);
        // Wake it only if it would sleep past this lease's renewal; a busy driver collects
        // again when its round trip ends.
        let wake = matches!(registry.asleep_until, Some(until) if until.is_none_or(|t| due < t));
        if wake {
            registry.asleep_until = None;
        }
        drop(registry);
        if wake {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(&self.shared.registry).leases.remove(&self.id);
    }
}

/// How often a lease of `ttl` is renewed.
pub(crate) fn interval(ttl: Duration) -> Duration {
    ttl / 3
}

/// How soon to retry a renewal that failed with a Redis error.
fn retry_delay(ttl: Duration) -> Duration {
    (interval(ttl) / 4).clamp(Duration::from_millis(5), Duration::from_millis(250))
}

/// One lease of a batch, copied out of the registry so no lock is held across the round trip.
struct Due {
    id: u64,
    keys: Arc<[LockKeys]>,
    token: Arc<str>,
    ttl: Duration,
    due: Instant,
}

/// Spawns the driver on the current runtime unless one is running.
fn start_driver(shared: &Arc<Shared>, registry: &mut Registry) {
    if registry.driver.is_none() {
        registry.next_id += 1;
        let id = registry.next_id;
        registry.driver = Some(id);
        registry.asleep_until = None;
        tokio::spawn(drive(Arc::clone(shared), id));
    }
}

/// Marks the driver stopped however its task ends, also when it is dropped with its runtime.
struct DriverRunning<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for DriverRunning<'_> {
    fn drop(&mut self) {
        let mut registry = lock(&self.shared.registry);
        if registry.driver == Some(self.id) {
            registry.driver = None;
            registry.asleep_until = None;
        }
    }
}

async fn drive(shared: Arc<Shared>, id: u64) {
    let _running = DriverRunning {
        shared: &shared,
        id,
    };
    loop {
        let batch = match collect_due(&shared) {
            Collected::Stop => return,
            Collected::Sleep(until) => {
                let sleep = async {
                    match until {
                        Some(until) => tokio::time::sleep_until(until).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = sleep => {}
                    () = shared.wake.notified() => {}
                }
                continue;
            }
            Collected::Batch(batch) => batch,
        };
        renew_batch(&shared, batch).await;
    }
}

enum Collected {
    Stop,
    Sleep(Option<Instant>),
    Batch(Vec<Due>),
}

fn collect_due(shared: &Shared) -> Collected {
    let mut registry = lock(&shared.registry);
    let now = Instant::now();
    if registry.leases.is_empty() {
        let idle_since = *registry.idle_since.get_or_insert(now);
        if now >= idle_since + IDLE {
            // Cleared under the same lock as the check, so a lease registered next starts a
            // new driver.
            registry.driver = None;
            registry.asleep_until = None;
            return Collected::Stop;
        }
        let until = Some(idle_since + IDLE);
        registry.asleep_until = Some(until);
        return Collected::Sleep(until);
    }
    registry.idle_since = None;
    // A lost lease is never renewed again (its `run` is stopping it).
    registry
        .leases
        .retain(|_, entry| !entry.state.is_lost_flag());
    let mut batch = Vec::new();
    let mut next: Option<Instant> = None;
    for (&id, entry) in &registry.leases {
        let Some(due) = entry.due else { continue };
        let ttl = entry.state.ttl();
        // Renewing up to a quarter interval early lets every lease due soon share this round
        // trip; renewed together, they stay due together, so the renewal cost follows the
        // number of distinct intervals, not the number of leases.
        let slack = interval(ttl) / 4;
        if due <= now + slack && batch.len() < MAX_BATCH {
            batch.push(Due {
                id,
                keys: Arc::clone(&entry.keys),
                token: Arc::clone(&entry.token),
                ttl,
                due,
            });
        } else {
            next = Some(next.map_or(due, |n| n.min(due)));
        }
    }
    if batch.is_empty() {
        registry.asleep_until = Some(next);
        Collected::Sleep(next)
    } else {
        registry.asleep_until = None;
        Collected::Batch(batch)
    }
}

async fn renew_batch(shared: &Shared, batch: Vec<Due>) {
    let mut invocation = scripts::EXTEND.prepare_invoke();
    for lease in &batch {
        for keys in lease.keys.iter() {
            invocation.key(keys.lock.as_str());
        }
        invocation
            .arg(&*lease.token)
            .arg(millis(lease.ttl))
            .arg(lease.keys.len());
    }
    let sent = Instant::now();
    let answer: Result<Vec<i64>, _> = shared.redis.invoke("renew", &invocation).await;
    let now = Instant::now();
    let failure = match &answer {
        Ok(owned) if owned.len() == batch.len() => None,
        Ok(_) => Some("renewal script answered for a different number of leases".to_owned()),
        Err(error) => Some(error.to_string()),
    };
    let mut events = Vec::new();
    let mut registry = lock(&shared.registry);
    for (i, lease) in batch.iter().enumerate() {
        // A lease released while its renewal was in flight is simply gone.
        let Some(entry) = registry.leases.get_mut(&lease.id) else {
            continue;
        };
        let outcome = match (&failure, &answer) {
            (None, Ok(owned)) if owned[i] == 1 => {
                let current = entry.state.renewed(sent, lease.ttl);
                if entry.state.is_lost_flag() {
                    Event::ExpiredBeforeRenewal
                } else {
                    if entry.once {
                        registry.leases.remove(&lease.id);
                        continue;
                    }
                    if current {
                        entry.due = Some(sent + interval(lease.ttl));
                    }
                    if sent > lease.due + interval(lease.ttl) / 2 {
                        events.push((Arc::clone(&entry.keys), Event::Late(sent - lease.due)));
                    }
                    continue;
                }
            }
            (None, _) => Event::NotOwned,
            (Some(error), _) if entry.state.valid_until() <= now => {
                Event::FailedUntilExpiry(error.clone())
            }
            (Some(error), _) => {
                entry.due = Some(now + retry_delay(lease.ttl));
                events.push((Arc::clone(&entry.keys), Event::Failed(error.clone())));
                continue;
            }
        };
        entry.state.mark_lost();
        events.push((Arc::clone(&entry.keys), outcome));
        registry.leases.remove(&lease.id);
    }
    drop(registry);
    for (keys, event) in events {
        event.log(&keys);
    }
}

/// What a renewal found, logged after the registry lock is released.
enum Event {
    Late(Duration),
    Failed(String),
    NotOwned,
    FailedUntilExpiry(String),
    ExpiredBeforeRenewal,
}

impl Event {
    fn log(&self, keys: &[LockKeys]) {
        let keys: Vec<&str> = keys.iter().map(|k| k.lock.as_str()).collect();
        match self {
            Self::Late(late_by) => tracing::warn!(
                ?keys,
                ?late_by,
                "distlock lease renewed late; the process or Redis may be overloaded"
            ),
            Self::Failed(error) => {
                tracing::warn!(?keys, %error, "distlock lease renewal failed; retrying");
            }
            Self::NotOwned => tracing::warn!(
                ?keys,
                "distlock lease lost: the lock was deleted or taken by another owner"
            ),
            Self::FailedUntilExpiry(error) => tracing::warn!(
                ?keys,
                %error,
                "distlock lease lost: renewal kept failing until the lease expired"
            ),
            Self::ExpiredBeforeRenewal => tracing::warn!(
                ?keys,
                "distlock lease lost: it expired before its renewal was answered"
            ),
        }
    }
}
