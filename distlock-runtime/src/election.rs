//! Leader election: one leader per name across the fleet ([`Election`]), a leader's time in
//! office ([`Term`]), and who leads now ([`LeaderInfo`]).
//!
//! An election is a fair, renewed lock on the key `election:NAME` (under the manager's prefix):
//! its holder leads, its fair waiters are the candidates, in arrival order. Everything a lease
//! guarantees holds for a term: at most one valid term at a time, a fencing token greater than
//! every earlier term's (also after Redis lost its data), loss when renewal fails past the
//! validity or the key is taken or force-released. A leader that resigns (or whose term is
//! dropped) releases the key, which hands it to the oldest live candidate at once; one that dies
//! leaves its key to expire, and the candidates, who wake at its expiry, take it then.
//!
//! Waiting costs no polling: a candidate is a queued fair waiter, woken by the hand-off that
//! makes it leader; in each process only the first candidate also tries at the leader's expiry,
//! and keeps the others queued (see `fair/`). Observers ([`Election::watch`]) follow the key's
//! release notifications, and read the leader again at its expiry and every renewal interval (a
//! third of the ttl), and soon after while nobody leads: that is how a death and a take-over
//! without a release are seen.
//!
//! On a topology that cannot serve fair locks (a quorum, or `min_replicas`), candidates wait as
//! unfair waiters: a resigning leader's release wakes them, and whoever asks first leads.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::LockError;
use crate::failed::Failed;
use crate::lease::Lease;
use crate::manager::LockManager;
use crate::retry::{Decision, Retry, Tried};
use crate::sync::lock;
use crate::validity::LeaseState;

/// The metrics and spans label of an election's lock requests.
const LABEL: &str = "election";

/// How long [`Election::run`] waits before it campaigns again after the leader's function
/// returned by itself (so one that returns at once does not spin on Redis).
const AFTER_RETURN: Duration = Duration::from_secs(1);

/// A leader election: at most one candidate of the fleet leads `name` at a time, for a term
/// that ends when it resigns, dies, or loses its lease. Made by [`LockManager::election`];
/// cheap to clone, and every method takes `&self`. The manager's
/// [`holder_label`](crate::LockManagerBuilder::holder_label) names the candidate to observers.
///
/// ```no_run
/// use std::time::Duration;
/// # async fn tick(_fencing_token: u64) {}
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// // Every instance runs this; one at a time ticks. A leader that dies is replaced within
/// // 15 s (plus a renewal interval, 5 s); one that stops (or panics) hands over at once.
/// let election = locks.election("scheduler").ttl(Duration::from_secs(15));
/// let never = election
///     .run(|term| async move {
///         loop {
///             tick(term.fencing_token()).await;
///             tokio::time::sleep(Duration::from_secs(1)).await;
///         }
///     })
///     .await; // returns only for a misconfiguration: Err(e) with e.is_misconfigured()
/// # let _ = never;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Election {
    manager: LockManager,
    name: Arc<str>,
    ttl: Duration,
    /// The observer task's channel and the task, shared by clones made after [`ttl`](Self::ttl).
    watcher: Arc<Mutex<Option<Watcher>>>,
}

/// The observer task of an election's [`watch`](Election::watch), and its channel.
#[derive(Debug)]
struct Watcher {
    sender: watch::Sender<Option<LeaderInfo>>,
    task: tokio::task::JoinHandle<()>,
}

/// A candidate's time as leader, from [`Election::campaign`] (or handed to the function of
/// [`Election::run`]): valid until it is lost or resigned. Its lease is renewed every third of
/// the election's ttl. Dropping a term from `campaign` resigns (from a background task);
/// [`resign`](Self::resign) waits for Redis. The term `run` hands its function is kept by `run`
/// until the function ends: dropping it there changes nothing.
#[must_use = "dropping a Term from campaign() resigns at once; keep it while leading"]
pub struct Term {
    office: Arc<Office>,
}

/// What a term holds, shared by the [`Term`] and, under [`Election::run`], by `run` itself.
struct Office {
    /// The lease, until the term is resigned (`None` from then on); dropped with the last
    /// holder of the office, which releases it in the background.
    lease: Mutex<Option<Lease>>,
    state: Arc<LeaseState>,
    fencing_token: u64,
    election: Arc<str>,
    /// Cancelled when the term ends by itself (resigned, or its office dropped): its loss is
    /// no longer watched, and `run` stops its leader.
    ended: CancellationToken,
}

impl Drop for Office {
    fn drop(&mut self) {
        self.ended.cancel();
    }
}

impl Office {
    /// Releases the lease, if still held, and ends the term.
    async fn resign(&self) -> Result<(), LockError> {
        let lease = lock(&self.lease).take();
        let mut released = Ok(());
        if let Some(lease) = lease {
            tracing::info!(election = %self.election, fencing_token = self.fencing_token, "distlock resigns the election");
            released = lease.release().await;
        }
        self.ended.cancel();
        released
    }
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("election", &self.office.election)
            .field("fencing_token", &self.office.fencing_token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Who leads an election, from [`Election::leader`] and [`Election::watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The election's name.
    pub election: String,
    /// The leader's [`holder_label`](crate::LockManagerBuilder::holder_label), if its manager
    /// set one.
    pub label: Option<String>,
    /// The first 8 hex digits of the leader's owner token: tells leaders apart when no label
    /// does, without letting anyone release its term.
    pub token_prefix: String,
    /// The fencing token of the leader's term: a new leader always has a greater one.
    pub fencing_token: u64,
    /// How long the term lasts at most unless renewed (its key's expiry in Redis), when read.
    pub remaining: Duration,
    /// Candidates queued to lead next (0 where candidates do not queue: a quorum).
    pub candidates: usize,
}

impl LeaderInfo {
    /// Whether `other` describes the same term (same leader, same fencing token), whatever
    /// either's `remaining`.
    pub fn same_term(&self, other: &LeaderInfo) -> bool {
        self.fencing_token == other.fencing_token && self.token_prefix == other.token_prefix
    }
}

impl LockManager {
    /// The election `name`: one leader at a time across every process that campaigns for it
    /// with a manager on the same Redis and prefix. Its ttl is the manager's default ttl until
    /// [`Election::ttl`] sets it. No I/O until a method is awaited.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let election = locks.election("billing-scheduler");
    /// if let Some(leader) = election.leader().await? {
    ///     println!("led by {:?} (term {})", leader.label, leader.fencing_token);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            ttl: self.context().default_ttl,
            manager: self.clone(),
            name: name.into().into(),
            watcher: Arc::default(),
        }
    }
}

impl Election {
    /// The term's lease length: a leader that dies is replaced within it (plus one renewal
    /// interval, a third of it); a live leader renews every third of it. Default: the manager's
    /// default ttl. From [`MIN_TTL`](crate::MIN_TTL) to [`MAX_TTL`](crate::MAX_TTL) (checked
    /// when campaigning).
    ///
    /// ```no_run
    /// # fn demo(locks: distlock_runtime::LockManager) {
    /// let election = locks.election("warmer").ttl(std::time::Duration::from_secs(10));
    /// # }
    /// ```
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self.watcher = Arc::default();
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock key behind the election (`election:NAME`, without the manager's prefix): what
    /// [`LockManager::inspect`] and the `distlock` tool show. Lock it only through the
    /// election.
    pub fn key(&self) -> String {
        format!("election:{}", self.name)
    }

    /// [`key`](Self::key), once the name is known not to be empty.
    fn checked_key(&self) -> Result<String, LockError> {
        if self.name.is_empty() {
            return Err(LockError::InvalidKey {
                key: String::new(),
                reason: "an election needs a name",
            });
        }
        Ok(self.key())
    }

    /// Waits until this candidate leads, in arrival order among the candidates, for as long as
    /// it takes.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let term = locks.election("compactor").campaign().await?;
    /// tokio::select! {
    ///     () = term.lost() => println!("lost the lead: stopped"),
    ///     () = async { /* compact, passing term.fencing_token() to storage */ } => {}
    /// }
    /// term.resign().await?; // the next candidate leads now
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for an empty name; [`LockError::InvalidConfig`] for a ttl out
    /// of range; [`LockError::Redis`] / [`LockError::RedisTimeout`] (and the other errors of
    /// [`LockRequest::acquire`](crate::LockRequest::acquire)) when Redis fails while this
    /// candidate waits: it has left the queue, and may campaign again.
    pub async fn campaign(&self) -> Result<Term, LockError> {
        let key = self.checked_key()?;
        let fair = self.manager.context().redis().fair().is_ok();
        let lease = self
            .manager
            .lock(key)
            .ttl(self.ttl)
            .wait(Duration::MAX)
            .renew(true)
            .fair(fair)
            .metrics_label(LABEL)
            .acquire()
            .await?;
        Ok(Term::new(lease, Arc::clone(&self.name)))
    }

    /// Serves for the process's life: campaigns, calls `lead(term)` while this candidate leads,
    /// stops that future (drops it at its next await point) when the term is lost, logs the
    /// loss once, and campaigns again. `run` keeps the term while `lead`'s future runs (a
    /// function that drops its term, or never looks at it, still leads). If that future ends,
    /// whatever it returns (which is dropped: report errors inside it), the term is resigned
    /// (handed to the next candidate) and this candidate campaigns again a second later; so
    /// too when the leader resigns its term itself (its future is stopped then). A panic in
    /// `lead` unwinds through `run`, and resigns on the way.
    ///
    /// Redis failing while it campaigns is retried (the pause doubling from 100 ms to a third
    /// of the ttl), logged at `warn` each time.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) {
    /// let error = locks
    ///     .election("mailer")
    ///     .run(|term| async move {
    ///         println!("leading with fencing token {}", term.fencing_token());
    ///         std::future::pending::<()>().await // lead until the term is lost
    ///     })
    ///     .await
    ///     .unwrap_err();
    /// eprintln!("cannot campaign: {error}"); // a misconfiguration, retrying would not help
    /// # }
    /// ```
    ///
    /// # Errors
    /// Only an error that retrying cannot fix: [`LockError::is_misconfigured`] (refused
    /// credentials or ACL rights, a ttl out of range, ...) or [`LockError::is_caller_bug`] (an
    /// empty name, a `run` inside a body that holds the election's key).
    pub async fn run<F, Fut>(&self, mut lead: F) -> Result<Infallible, LockError>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future,
    {
        let (retry, mut tried) = (Retry::campaign(self.ttl), Tried::default());
        loop {
            let term = match self.campaign().await {
                Ok(term) => term,
                Err(error) => {
                    let failed = Failed::maybe(error);
                    let Decision::After(pause) = retry.decide(&failed, &mut tried, Instant::now())
                    else {
                        return Err(failed.error);
                    };
                    tracing::warn!(election = %self.name, error = %failed.error, retry_in = ?pause, "distlock could not campaign; trying again");
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            tried = Tried::default();
            // `run` keeps the office while the leader's function runs (the function may drop
            // its term), and stops the function when the term is lost or the leader resigned.
            // The term's own watcher logs a loss.
            let office = Arc::clone(&term.office);
            let stepped_down = tokio::select! {
                biased;
                () = office.state.lost() => false,
                () = office.ended.cancelled() => true,
                _ = lead(term) => true,
            };
            if stepped_down {
                if let Err(error) = office.resign().await {
                    // Retried in the background, and the key expires at its ttl at the latest.
                    tracing::debug!(election = %self.name, %error, "distlock could not resign at once");
                }
                drop(office);
                tracing::debug!(election = %self.name, "distlock leader returned or resigned; campaigning again in a second");
                tokio::time::sleep(AFTER_RETURN).await;
            }
        }
    }

    /// Who leads now; `None` when nobody does. Reads only (one script call).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// match locks.election("scheduler").leader().await? {
    ///     Some(leader) => println!(
    ///         "{} leads, term {}, {:?} left unless renewed",
    ///         leader.label.as_deref().unwrap_or(&leader.token_prefix),
    ///         leader.fencing_token,
    ///         leader.remaining
    ///     ),
    ///     None => println!("no leader"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Those of [`LockManager::inspect`].
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, LockError> {
        let info = self.manager.inspect(&self.checked_key()?).await?;
        Ok(info.map(|info| LeaderInfo {
            election: self.name.to_string(),
            label: info.holder,
            token_prefix: info.token_prefix,
            fencing_token: info.fencing_token,
            remaining: info.remaining,
            candidates: info.waiters,
        }))
    }

    /// Follows who leads: the receiver holds the latest [`leader`](Self::leader) and changes
    /// when the leader (or its term) does. A resignation is seen at once (through the key's
    /// release notifications, when the manager has them), a dead leader gone at its expiry, a
    /// leader who takes a free key within 50 ms of it for a while (the reads while nobody leads
    /// back off to a renewal interval, a third of the ttl), any other change within a renewal
    /// interval. Between changes, `remaining` is refreshed without waking
    /// the receivers. While Redis cannot be read, the last leader stays until its `remaining`
    /// has passed, then `None`.
    ///
    /// After a hand-off that its recipient confirms by an attempt (rather than by the
    /// message), receivers are woken twice for one term: with the hand-off's fencing token,
    /// then with the term's own (greater) one.
    ///
    /// One background task per election (shared by its clones) reads for every receiver; it
    /// stops when the last receiver is dropped. Call it inside a Tokio runtime: outside one,
    /// the receiver holds `None` and its `changed()` fails at once.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) {
    /// let mut leaders = locks.election("scheduler").watch();
    /// while leaders.changed().await.is_ok() {
    ///     match &*leaders.borrow_and_update() {
    ///         Some(leader) => println!("now led by {:?}", leader.label),
    ///         None => println!("no leader"),
    ///     }
    /// }
    /// # }
    /// ```
    pub fn watch(&self) -> watch::Receiver<Option<LeaderInfo>> {
        let mut watcher = lock(&self.watcher);
        if let Some(running) = watcher.as_ref().filter(|w| !w.task.is_finished()) {
            return running.sender.subscribe();
        }
        let (sender, receiver) = watch::channel(None);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(election = %self.name, "distlock Election::watch called outside a Tokio runtime: the receiver will not follow the leader");
            return receiver;
        };
        // A task that ended without its receivers (its runtime shut down) is replaced; dropping
        // its channel tells its receivers.
        let task = runtime.spawn(follow(self.clone(), sender.clone()));
        *watcher = Some(Watcher { sender, task });
        receiver
    }
}

/// The observer task of [`Election::watch`]: reads the leader after each message on the key's
/// channel, every renewal interval, at the leader's expiry, and soon after (50 ms, doubling)
/// while nobody leads or while a release was announced and the leader it ended still shows;
/// stops with the last receiver.
async fn follow(election: Election, sender: watch::Sender<Option<LeaderInfo>>) {
    // A ttl out of range (refused only when campaigning) reads no more often than every 100 ms.
    let every = (election.ttl / 3).clamp(Duration::from_millis(100), crate::MAX_TTL);
    let context = election.manager.context();
    let channel = context.lock_keys(&election.key()).lock().to_owned();
    let ticket = context.notifications.as_ref().map(|n| n.observe(&channel));
    // Until when the last leader read stands while Redis cannot be read.
    let mut stands_until: Option<Instant> = None;
    // Reads in a row that came soon after each other ([`Retry::unled`]): while nobody leads (a
    // new leader, a candidate that took the free key, announces nothing), or while a release
    // was announced and the leader before it still shows.
    let mut soon = 0;
    // A release was announced since the leader last changed: on a quorum it reaches the nodes
    // one by one, so a read right after its notice may still show the leader it ended.
    let mut announced = false;
    loop {
        if let Some(ticket) = ticket.as_ref().filter(|t| t.subscribed_since().is_none()) {
            ticket.subscribe(Instant::now() + every).await;
        }
        let read = election.leader().await;
        let now = Instant::now();
        let mut next = now + every;
        match read {
            Ok(leader) => {
                let before_notice = announced
                    && matches!((&*sender.borrow(), &leader), (Some(was), Some(is)) if was.same_term(is));
                if let Some(leader) = &leader {
                    // A key without expiry reads as `Duration::MAX`.
                    let remaining = leader.remaining.saturating_add(Duration::from_millis(1));
                    let expiry = now.checked_add(remaining).unwrap_or(next);
                    stands_until = Some(expiry);
                    next = next.min(expiry);
                }
                let pause = Retry::unled(every).pause(soon + 1, now).unwrap_or(every);
                if leader.is_none() || (before_notice && pause < every) {
                    next = next.min(now + pause);
                    soon += 1;
                    announced &= leader.is_some();
                } else {
                    (soon, announced) = (0, false);
                }
                publish(&sender, leader);
            }
            Err(error) => {
                tracing::debug!(election = %election.name, %error, "distlock could not read the leader; trying again");
                if stands_until.take_if(|until| *until <= now).is_some() {
                    publish(&sender, None);
                }
            }
        }
        tokio::select! {
            () = sender.closed() => {
                let mut watcher = lock(&election.watcher);
                if sender.receiver_count() == 0 {
                    if watcher.as_ref().is_some_and(|w| w.sender.same_channel(&sender)) {
                        *watcher = None;
                    }
                    return;
                }
            }
            // Without notifications (no ticket), a branch that never matches.
            Some(_) = async { Some(ticket.as_ref()?.woken().await) } => {
                (soon, announced) = (0, true);
            }
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

/// Sends `leader` to the receivers: waking them when it is another term (or none), else only
/// refreshing its `remaining`.
fn publish(sender: &watch::Sender<Option<LeaderInfo>>, leader: Option<LeaderInfo>) {
    sender.send_if_modified(|current| {
        let changed = match (&*current, &leader) {
            (Some(was), Some(now)) => !was.same_term(now),
            (None, None) => false,
            _ => true,
        };
        *current = leader;
        changed
    });
}

impl Term {
    fn new(lease: Lease, election: Arc<str>) -> Self {
        let ended = CancellationToken::new();
        let fencing_token = lease.fencing_token();
        tracing::info!(%election, fencing_token, "distlock leads the election");
        crate::telemetry::term_started(&election);
        let state = Arc::clone(lease.state());
        // Reports the loss once (a warning and the `distlock_terms_lost_total` metric), unless
        // the term ends first.
        let watched = {
            let (state, election, ended) =
                (Arc::clone(&state), Arc::clone(&election), ended.clone());
            async move {
                // Lost first: `run` drops a term it saw lost, so both may be ready at once.
                tokio::select! {
                    biased;
                    () = state.lost() => {
                        let why = state.cause();
                        tracing::warn!(%election, fencing_token, "distlock term lost: {why}; no longer the leader");
                        crate::telemetry::term_lost(&election);
                    }
                    () = ended.cancelled() => {}
                }
            }
        };
        // A term is granted on a Tokio runtime (its renewal runs there).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watched);
        }
        Self {
            office: Arc::new(Office {
                lease: Mutex::new(Some(lease)),
                state,
                fencing_token,
                election,
                ended,
            }),
        }
    }

    /// The fencing token of this term: greater than every earlier term's of the election (also
    /// after Redis lost its data). Pass it to storage that refuses writes with a smaller token
    /// than it has seen, so a leader that lost its term (paused, cut off) cannot overwrite its
    /// successor's work.
    ///
    /// ```no_run
    /// # async fn demo(term: distlock_runtime::Term) {
    /// let token = term.fencing_token();
    /// let write = format!(
    ///     "UPDATE schedule SET next_run = now() + interval '1 minute', fence = {token} \
    ///      WHERE job = 'report' AND fence < {token}"
    /// );
    /// # }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.office.fencing_token
    }

    /// The election's name.
    pub fn election(&self) -> &str {
        &self.office.election
    }

    /// Resolves when the term is lost: its key was force-released (heard at once), renewal
    /// found the key gone or taken by someone else, or kept failing until the term's validity
    /// ran out; or when it ended (resigned). Never resolves while the term stays valid.
    pub async fn lost(&self) {
        tokio::select! {
            () = self.office.state.lost() => {}
            () = self.office.ended.cancelled() => {}
        }
    }

    /// True once the term is known to be lost, or its validity has run out without renewal, or
    /// it was resigned: stop acting as leader.
    pub fn is_lost(&self) -> bool {
        self.office.ended.is_cancelled() || self.office.state.is_lost()
    }

    /// How much longer the term is valid unless renewed (see [`Lease::remaining`]); zero once
    /// it is lost or resigned.
    pub fn remaining(&self) -> Duration {
        lock(&self.office.lease)
            .as_ref()
            .map_or(Duration::ZERO, Lease::remaining)
    }

    /// Steps down: releases the election's key, which hands it at once to the oldest waiting
    /// candidate. Under [`Election::run`], the leader's function is stopped then.
    ///
    /// # Errors
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis cannot be asked (the
    /// release is retried in the background, and the key expires at its ttl at the latest).
    pub async fn resign(self) -> Result<(), LockError> {
        self.office.resign().await
    }
}
