//! Lease renewal: one driver task per manager extends every renewing lease about every ttl/3.
//!
//! A lease is registered before its acquire request is sent (so no acquired lease can miss its
//! renewal) and deregistered synchronously when it is released, dropped or its `run` is
//! cancelled, so nothing renews a lease its owner has let go. Leases due in the same tick are
//! extended by one script call; each lease's answer is its own, so a lease found gone is marked
//! lost without touching the others. Redis errors are retried with jittered exponential backoff
//! (see [`Retry::renewal`]) until the lease's own validity has run out, then the lease is lost; a
//! failing Redis is reported once, then at most once a second with a count ([`FailureLog`]), so an
//! outage costs neither a core nor a flood of log lines. The driver stops after [`IDLE`] without
//! leases.
//!
//! The driver is woken only when a lease becomes due before the driver's planned wake-up, so a
//! lock cycle that ends before its first renewal costs a registry insert and remove, no task
//! wake-up.
//!
//! **Forced releases.** Every lease registers, also one without renewal (never due), so that a
//! forced release can end it at once: while it runs, the driver keeps the manager's
//! forced-release channel subscribed (see `notify/`), and a notice naming a lease's owner token
//! marks it lost ([`Loss::Forced`]) and drops it from the registry. Without the notice (no
//! channel rights, no subscriber connection) a renewing lease learns of it at its next renewal.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::call::{Confirm, ScriptCall};
use crate::error::LockError;
use crate::forced::Notice;
use crate::keys::LockKeys;
use crate::lease::Holding;
use crate::mode::{LockMode, Words};
use crate::notify::Forced;
use crate::retry::Retry;
use crate::scripts;
use crate::sync::lock;
use crate::telemetry::Throttle;
use crate::time::millis;
use crate::topology::{by_shard, Deployment};
use crate::validity::{LeaseState, Loss};

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
    redis: Arc<Deployment>,
    failures: Mutex<FailureLog>,
    /// The manager's forced-release notices, listened to while the driver runs; `None` without
    /// a subscriber connection (a caller's pool).
    forced: Option<Forced>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    /// The id of the running driver task, if one runs.
    driver: Option<u64>,
    /// Whether, and until when, the driver sleeps.
    sleep: Sleep,
    /// Since when the registry has been empty.
    idle_since: Option<Instant>,
    leases: HashMap<u64, Entry>,
}

/// Whether, and until when, the renewal driver sleeps: a lease that registers wakes it only if
/// it would sleep past the lease's renewal.
#[derive(Clone, Copy, Default)]
enum Sleep {
    /// Collecting or renewing (or no driver runs): it collects again when done.
    #[default]
    Awake,
    /// Asleep until a lease wakes it.
    UntilWoken,
    /// Asleep until then, or until a lease wakes it.
    Until(Instant),
}

struct Entry {
    keys: Arc<[LockKeys]>,
    token: Arc<str>,
    state: Arc<LeaseState>,
    /// Whether it is renewed: a lease without renewal is registered only to hear of a forced
    /// release, and is never due (but for `once`).
    renews: bool,
    /// Whether its request made a lease of it ([`Registration::held`]): only then does a
    /// forced release end it. An attempt still under way may hold a key a moment (a grant on
    /// one quorum node, or one cluster shard, undone after), which the request outlives.
    held: bool,
    /// When to renew next; `None` while the acquire request is still out, and for good
    /// without renewal.
    due: Option<Instant>,
    /// How early the renewal may go with others due sooner: a quarter of the interval that
    /// led to `due`, so a lease handed over for a short claim is not renewed at once because
    /// its ttl is long.
    slack: Duration,
    /// Extend once, then leave the registry: the claim of a lease without renewal that was
    /// handed over for a claim time shorter than its ttl.
    once: bool,
    /// Renewals of this lease that failed in a row; a retry is due exactly when scheduled.
    failures: u32,
}

/// A lease's place in the renewal registry; dropping it stops the lease's renewal at once.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

/// How a registered lease is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renew {
    /// Every third of its ttl, once [`Registration::schedule`]d.
    Always,
    /// Never: registered only to hear of a forced release.
    Never,
    /// Extended once to its ttl, now, then never: a lease without renewal that was handed
    /// over for a claim time shorter than its ttl.
    Once,
}

impl Renewals {
    /// The renewals of the leases on `redis`, which learn of forced releases from `forced`.
    pub(crate) fn new(redis: Arc<Deployment>, forced: Option<Forced>) -> Self {
        Self {
            shared: Arc::new(Shared {
                registry: Mutex::new(Registry::default()),
                wake: Notify::new(),
                redis,
                failures: Mutex::new(FailureLog::default()),
                forced,
            }),
        }
    }

    /// Registers the lease of `holding`, about to be requested, renewed as `renew` says.
    /// Must be called inside a Tokio runtime (it may start the driver task).
    pub(crate) fn register(&self, holding: &Holding, renew: Renew) -> Registration {
        let once = renew == Renew::Once;
        let mut registry = lock(&self.shared.registry);
        registry.next_id += 1;
        let id = registry.next_id;
        let entry = Entry {
            keys: Arc::clone(&holding.redis_keys),
            token: Arc::clone(&holding.token),
            state: Arc::clone(&holding.state),
            renews: renew == Renew::Always,
            held: false,
            due: None,
            slack: Duration::ZERO,
            once,
            failures: 0,
        };
        registry.leases.insert(id, entry);
        start_driver(&self.shared, &mut registry);
        drop(registry);
        let shared = Arc::clone(&self.shared);
        let registration = Registration { shared, id };
        if once {
            registration.schedule_with(Instant::now(), Duration::ZERO);
        }
        registration
    }
}

impl Registration {
    /// The keys' expiry was set to `ttl` by a request sent at `sent` (the acquire, or a manual
    /// extend): renew a third of `ttl` after it.
    pub(crate) fn schedule(&self, sent: Instant, ttl: Duration) {
        self.schedule_with(sent + interval(ttl), interval(ttl) / 4);
    }

    /// The request made a lease of it: a forced release naming its token ends it from now on.
    pub(crate) fn held(&self) {
        if let Some(entry) = lock(&self.shared.registry).leases.get_mut(&self.id) {
            entry.held = true;
        }
    }

    fn schedule_with(&self, due: Instant, slack: Duration) {
        let mut registry = lock(&self.shared.registry);
        let entry = registry.leases.get_mut(&self.id);
        let Some(entry) = entry.filter(|entry| entry.renews || entry.once) else {
            // Never renewed: nothing to wake the driver for.
            return;
        };
        entry.due = Some(due);
        entry.slack = slack;
        // Scheduled from a request that went through (an acquire, a hand-off, an extend).
        entry.failures = 0;
        // The driver may have died with the runtime it ran on since this lease registered.
        start_driver(&self.shared, &mut registry);
        // Wake it only if it would sleep past this lease's renewal; a busy driver collects
        // again when its round trip ends.
        let wake = match registry.sleep {
            Sleep::Awake => false,
            Sleep::UntilWoken => true,
            Sleep::Until(until) => due < until,
        };
        if wake {
            registry.sleep = Sleep::Awake;
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

/// The shortest pause between two renewal attempts of a lease.
const MIN_RETRY: Duration = Duration::from_millis(5);

/// When to retry the renewal of a lease of `ttl`, valid until `valid_until`, after its
/// `failures`-th failure in a row at `now`: as [`Retry::renewal`] says (never past the lease's
/// last chance), but never sooner than [`MIN_RETRY`] (no tight loop).
fn next_retry(now: Instant, valid_until: Instant, ttl: Duration, failures: u32) -> Instant {
    let pause = Retry::renewal(ttl, valid_until).pause(failures, now);
    now + pause.map_or(MIN_RETRY, |pause| pause.max(MIN_RETRY))
}

/// Rate-limits the warning for failed renewals: the first failure is logged at once, later ones
/// at most once a second, with how many failed since the last line ([`Throttle`]); a success
/// after a logged failure is logged once. A Redis that flaps logs no more than one that stays
/// down.
#[derive(Default)]
struct FailureLog {
    throttle: Throttle,
    /// A warning was logged, and no recovery since.
    reported: bool,
}

impl FailureLog {
    /// Counts a failed round trip for `leases` leases; logs it unless a warning was logged less
    /// than a second ago.
    fn failed(&mut self, now: Instant, leases: usize, error: &LockError) {
        if let Some(held_back) = self.throttle.note(now) {
            tracing::warn!(
                leases,
                failures = held_back + 1,
                %error,
                "distlock lease renewal failed; retrying with backoff until the leases expire"
            );
            self.reported = true;
        }
    }

    /// A round trip succeeded: says so once after a logged failure.
    fn succeeded(&mut self) {
        if self.reported {
            self.reported = false;
            tracing::info!(
                unreported_failures = self.throttle.take_held_back(),
                "distlock lease renewal works again"
            );
        }
    }
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
        registry.sleep = Sleep::Awake;
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
            registry.sleep = Sleep::Awake;
        }
    }
}

async fn drive(shared: Arc<Shared>, id: u64) {
    let _running = DriverRunning {
        shared: &shared,
        id,
    };
    // Listened to while the driver runs, that is while leases are registered (and for `IDLE`
    // after the last).
    let _listening = shared.forced.as_ref().and_then(|forced| {
        let shared = Arc::downgrade(&shared);
        forced.listen(Arc::new(move |notice: &[u8]| {
            if let Some(shared) = shared.upgrade() {
                force_released(&shared, notice);
            }
        }))
    });
    loop {
        match collect_due(&shared) {
            Collected::Stop => return,
            Collected::Batch(batch) => renew_batch(&shared, batch).await,
            Collected::Sleep(until) => {
                let sleep = tokio::time::sleep_until(until.unwrap_or_else(Instant::now));
                tokio::select! {
                    // Without a time, only a lease wakes it.
                    () = sleep, if until.is_some() => {}
                    () = shared.wake.notified() => {}
                }
            }
        }
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
    let (mut batch, mut next) = (Vec::new(), None::<Instant>);
    if registry.leases.is_empty() {
        let idle_since = *registry.idle_since.get_or_insert(now);
        if now >= idle_since + IDLE {
            // Cleared under the same lock as the check, so a lease registered next starts a
            // new driver.
            registry.driver = None;
            registry.sleep = Sleep::Awake;
            return Collected::Stop;
        }
        // Nothing to renew: asleep until then, unless a lease registers.
        next = Some(idle_since + IDLE);
    } else {
        registry.idle_since = None;
    }
    // A lost lease is never renewed again (its `run` is stopping it).
    registry
        .leases
        .retain(|_, entry| entry.state.loss().is_none());
    for (&id, entry) in &registry.leases {
        let Some(due) = entry.due else { continue };
        // Renewing up to a quarter interval early lets every lease due soon share this round
        // trip; renewed together, they stay due together, so the renewal cost follows the
        // number of distinct intervals, not the number of leases.
        // A retry after a failure is due exactly when its backoff says.
        let slack = if entry.failures == 0 {
            entry.slack
        } else {
            Duration::ZERO
        };
        if due <= now + slack && batch.len() < MAX_BATCH {
            batch.push(Due {
                id,
                keys: Arc::clone(&entry.keys),
                token: Arc::clone(&entry.token),
                ttl: entry.state.ttl(),
                due,
            });
        } else {
            next = Some(next.map_or(due, |n| n.min(due)));
        }
    }
    if batch.is_empty() {
        registry.sleep = next.map_or(Sleep::UntilWoken, Sleep::Until);
        Collected::Sleep(next)
    } else {
        registry.sleep = Sleep::Awake;
        Collected::Batch(batch)
    }
}

async fn renew_batch(shared: &Shared, batch: Vec<Due>) {
    let leases: Vec<_> = batch
        .iter()
        .map(|lease| (&*lease.keys, &*lease.token, lease.ttl))
        .collect();
    let sent = Instant::now();
    let answers = extend_leases(&shared.redis, "renew", &leases).await;
    let now = Instant::now();
    // The first failure, for the log: each lease fails only on its own shards' calls.
    let failure = answers.iter().find_map(|answer| answer.as_ref().err());
    let failed = answers.iter().filter(|answer| answer.is_err()).count();
    crate::telemetry::renewal(failure.is_none());
    let mut events = Vec::new();
    // The largest lateness among leases renewed late in this batch, and how many.
    let mut late: Option<(Duration, usize)> = None;
    let mut registry = lock(&shared.registry);
    for (lease, answer) in batch.iter().zip(&answers) {
        // A lease released while its renewal was in flight is simply gone.
        let Some(entry) = registry.leases.get_mut(&lease.id) else {
            continue;
        };
        let valid_until = entry.state.valid_until();
        let outcome = match answer {
            Ok(true) => {
                let current = entry.state.renewed(sent, lease.ttl);
                if entry.state.loss().is_some() {
                    Event::ExpiredBeforeRenewal
                } else {
                    if entry.once {
                        // Extended: from now on only listening for a forced release.
                        (entry.once, entry.due) = (false, None);
                        continue;
                    }
                    entry.failures = 0;
                    if current {
                        entry.due = Some(sent + interval(lease.ttl));
                        entry.slack = interval(lease.ttl) / 4;
                    }
                    if sent > lease.due + interval(lease.ttl) / 2 {
                        let by = sent - lease.due;
                        late = Some(late.map_or((by, 1), |(most, n)| (most.max(by), n + 1)));
                    }
                    continue;
                }
            }
            Ok(false) => Event::NotOwned,
            Err(error) if valid_until <= now => Event::FailedUntilExpiry(error.clone()),
            Err(_) => {
                entry.failures = entry.failures.saturating_add(1);
                entry.due = Some(next_retry(now, valid_until, lease.ttl, entry.failures));
                continue;
            }
        };
        entry.state.lose(match outcome {
            Event::NotOwned => Loss::Taken,
            _ => Loss::Expired,
        });
        events.push((Arc::clone(&entry.keys), outcome));
        registry.leases.remove(&lease.id);
    }
    drop(registry);
    match &failure {
        Some(error) => lock(&shared.failures).failed(now, failed, error),
        None => lock(&shared.failures).succeeded(),
    }
    if let Some((late_by, leases)) = late {
        tracing::warn!(
            leases,
            ?late_by,
            "distlock leases renewed late; the process or Redis may be overloaded"
        );
    }
    for (keys, event) in events {
        event.log(&keys);
    }
}

/// A forced release freed the holders whose owner tokens `notice` lists: each registered lease
/// among them is lost at once, and renewed no more.
fn force_released(shared: &Shared, notice: &[u8]) {
    let Some(notice) = Notice::parse(notice) else {
        return;
    };
    let mut lost = Vec::new();
    lock(&shared.registry).leases.retain(|_, entry| {
        if !entry.held || !notice.tokens.contains(&&*entry.token) {
            return true;
        }
        entry.state.lose(Loss::Forced);
        lost.push(Arc::clone(&entry.keys));
        false
    });
    for keys in lost {
        Event::ForceReleased.log(&keys);
    }
}

/// What a renewal found, logged after the registry lock is released.
enum Event {
    NotOwned,
    ForceReleased,
    FailedUntilExpiry(LockError),
    ExpiredBeforeRenewal,
}

impl Event {
    fn log(&self, keys: &[LockKeys]) {
        // Each key as the lease holds it: its lock key, or its holders when shared or a permit.
        let keys: Vec<String> = keys
            .iter()
            .map(|k| match k.mode() {
                crate::mode::LockMode::Exclusive => k.lease_key().to_owned(),
                mode => format!("{} ({mode})", k.lease_key()),
            })
            .collect();
        match self {
            Self::NotOwned => tracing::warn!(
                ?keys,
                "distlock lease lost: the lock was deleted or taken by another owner"
            ),
            Self::ForceReleased => tracing::warn!(
                ?keys,
                "distlock lease lost: the lock was force-released (LockManager::force_release)"
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

/// Extends each lease (keys, owner token, new ttl) if its owner still holds every one of its
/// keys; says, per lease, whether it was (or why it could not be asked). One script call per
/// shard (one but on a cluster), all at once: a lease whose keys span shards is extended only if
/// every shard says so (a shard that did extend while another found a key gone extended a lost
/// lease's keys, which its release then deletes), and fails only when one of its own shards'
/// calls failed, so a slot that is failing over costs no lease elsewhere.
async fn extend_leases(
    redis: &Deployment,
    op: &'static str,
    leases: &[(&[LockKeys], &str, Duration)],
) -> Vec<Result<bool, LockError>> {
    let mut outcomes: Vec<Result<bool, LockError>> = vec![Ok(true); leases.len()];
    for (members, answer) in extend_calls(redis, op, leases).await {
        for (k, &lease) in members.iter().enumerate() {
            // The first error of a lease's calls stays.
            if let Ok(extended) = &mut outcomes[lease] {
                match &answer {
                    Ok(owned) => *extended &= owned[k],
                    Err(error) => outcomes[lease] = Err(error.clone()),
                }
            }
        }
    }
    outcomes
}

/// Extends one lease; whether its owner still held every key.
///
/// # Errors
/// The first error of the calls to its shards.
pub(crate) async fn extend_lease(
    redis: &Deployment,
    keys: &[LockKeys],
    token: &str,
    ttl: Duration,
) -> Result<bool, LockError> {
    // One lease in, one outcome out.
    extend_leases(redis, "extend", &[(keys, token, ttl)])
        .await
        .swap_remove(0)
}

/// The extension script calls for `leases`, one per shard, sent at once: each with the leases
/// its entries belong to, and its answer (one 0 or 1 per entry).
async fn extend_calls(
    redis: &Deployment,
    op: &'static str,
    leases: &[(&[LockKeys], &str, Duration)],
) -> Vec<(Vec<usize>, Result<Vec<bool>, LockError>)> {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    // Per shard: its entries, each a lease (its index in `leases`) and the indices of its keys
    // in that shard.
    let mut shards: BTreeMap<u16, Vec<(usize, Vec<usize>)>> = BTreeMap::new();
    for (i, (keys, _, _)) in leases.iter().enumerate() {
        for group in by_shard(redis, keys) {
            let shard = redis.shard(keys[group[0]].lock());
            shards.entry(shard).or_default().push((i, group));
        }
    }
    // One call per shard: every entry's keys, then every entry's arguments.
    let calls = shards.into_values().map(|entries| {
        // Per key: what its lease holds and its fencing counter; the lock key too when held
        // shared or as a permit (its SHARED covers the member: `scripts/extend.lua`).
        let names = |keys: &LockKeys| 2 + usize::from(keys.mode() != LockMode::Exclusive);
        let key_count = entries
            .iter()
            .flat_map(|(i, group)| group.iter().map(|&k| names(&leases[*i].0[k])))
            .sum();
        let mut call = ScriptCall::new(op, &scripts::EXTEND, Confirm::Write, key_count);
        for (i, group) in &entries {
            for &k in group {
                let keys = &leases[*i].0[k];
                call.key(keys.lease_key()).key(keys.fence());
                if keys.mode() != LockMode::Exclusive {
                    call.key(keys.lock());
                }
            }
        }
        for (i, group) in &entries {
            let (keys, token, ttl) = leases[*i];
            let modes = Words(group.iter().map(|&k| keys[k].word()));
            call.arg(token).arg(millis(ttl)).arg(modes);
        }
        let members: Vec<_> = entries.into_iter().map(|(i, _)| i).collect();
        async move {
            let answer = match redis.extend(&call).await {
                Ok(owned) if owned.len() == members.len() => Ok(owned),
                Ok(_) => Err(LockError::Redis {
                    op,
                    source: redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "renewal script answered for a different number of leases",
                    )),
                }),
                Err(error) => Err(error),
            };
            (members, answer)
        }
    });
    calls.collect::<FuturesUnordered<_>>().collect().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::LAST_TRY_BEFORE_EXPIRY;

    #[test]
    fn a_retry_never_waits_past_the_leases_last_chance_nor_spins() {
        let now = Instant::now();
        let ttl = Duration::from_secs(30);
        // Far from the end: the backoff alone (at least half its first step, 250 ms at this
        // ttl; at most 2 s).
        let valid_until = now + Duration::from_secs(20);
        for failures in 1..10 {
            let retry = next_retry(now, valid_until, ttl, failures);
            assert!(
                retry >= now + Duration::from_millis(125) && retry <= now + Duration::from_secs(2)
            );
        }
        // Close to the end: sent by the last chance, whatever the backoff says.
        let valid_until = now + Duration::from_millis(300);
        for failures in 5..10 {
            let retry = next_retry(now, valid_until, ttl, failures);
            assert!(
                retry <= valid_until - LAST_TRY_BEFORE_EXPIRY,
                "{:?}",
                retry - now
            );
        }
        // At or past the last chance: still a pause, never a tight loop.
        for valid_until in [now, now + Duration::from_millis(10)] {
            assert_eq!(next_retry(now, valid_until, ttl, 3), now + MIN_RETRY);
        }
    }
}
