//! The acquire loop, and the in-doubt release policy.
//!
//! One acquire ([`Ask`]: what a request asks for) makes attempts until it holds every key, the
//! wait runs out, or Redis fails. Where it stands is a [`Stage`]: an attempt goes out next
//! (one script call: [`Places::take`] where the keys live, or a fair request's
//! [`FairAttempts::send`]), it waits (a [`Waiter`] sleeps until a release notification, the
//! holder's expiry or the deadline, and a fair waiter may be handed the lock instead), or it
//! holds the keys.
//!
//! **In doubt.** A request that may have taken the lock, when the acquire does not end with a
//! lease, is released by its token, so no lock is left held by nobody until its ttl; what it
//! may have left is its [`Exposure`]:
//! - the call is cancelled or times out while its request is out: released, and again after a
//!   response timeout in case the request runs late ([`Leaving::InFlight`]);
//! - Redis ran it and answered with an error (scripts are not rolled back), or answered after
//!   the lease it granted had expired: released once;
//! - the request was never sent (no connection, or one already closed by the server, which
//!   fails the request before it is handed over), or Redis refused it before running it
//!   (`READONLY`, `OOM`, a key the user may not touch): nothing to undo;
//! - a fair waiter that leaves between attempts releases once, which takes it out of the
//!   queue and passes on a hand-off it was given ([`Leaving::Queued`]).
//!
//! A quorum round that left a node in doubt (its acquire may still run and grant) ends the use
//! of that owner token: it is released in the background, and the next attempt goes out under
//! a new one (see `places.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::context::Context;
use crate::error::LockError;
use crate::failed::Reached;
use crate::fair::{claim_renewal, ClaimRenewal, FairAttempts, Handoff};
use crate::ids::{id_text, random_ids};
use crate::keys::{LockKeys, Seat};
use crate::lease::{Holding, Lease};
use crate::mode::LockMode;
use crate::release::{release_in_background, Leaving};
use crate::scripts::{Acquire, Taken, Unconfirmed, Waiting};
use crate::telemetry::{self, Tags};
use crate::topology::Serial;
use crate::validity::LeaseState;
use crate::wait::{Wait, Waiter, Wake};

mod places;

use places::Places;

/// What one request asks for, passed whole to the acquire.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    /// The user's keys, sorted and de-duplicated.
    pub(crate) keys: Arc<[String]>,
    /// The mode each key is asked in.
    pub(crate) modes: Arc<[LockMode]>,
    pub(crate) ttl: Duration,
    pub(crate) wait: Wait,
    pub(crate) renew: bool,
    /// Waiters are served in arrival order, through the key's queue in Redis (one key only;
    /// see `fair/`), rather than whoever asks first after a release.
    pub(crate) fair: bool,
    /// Names the request in metrics (its key template, and its keys' modes).
    pub(crate) tags: Tags,
}

/// Takes the locks `ask` asks for: the loop behind every request, fair or not.
pub(crate) async fn acquire(context: &Arc<Context>, ask: Ask) -> Result<Lease, LockError> {
    let (started, tags) = (ask.wait.started, ask.tags);
    let (outcome, attempts) = match Acquiring::new(context, ask) {
        Ok(mut acquiring) => (acquiring.run().await, acquiring.attempts),
        Err(error) => (Err(error), 0),
    };
    let took = started.elapsed();
    telemetry::acquisition(tags, outcome.as_ref().map(|_| took), attempts > 1);
    if outcome.is_ok() {
        telemetry::waited(tags, took);
    }
    outcome
}

/// Where a request stands.
#[derive(Debug)]
enum Stage {
    /// An attempt goes out next.
    Attempting,
    /// The attempt sent at `sent` found the key at `first_held` (among the request's keys)
    /// held, for `remaining` if its holder's lease expires: wait for a release, a hand-off,
    /// that expiry or the deadline.
    Waiting {
        first_held: usize,
        remaining: Option<Duration>,
        sent: Instant,
    },
    /// Every key is held, with `fencing_token`, by the attempt sent at `sent` (or handed over
    /// after it).
    Holding { fencing_token: u64, sent: Instant },
}

/// What a request may have left in Redis, were it to end now without a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Exposure {
    /// Nothing.
    Clean,
    /// Something a release by token undoes at once: a queue entry, or what an attempt that ran
    /// wrote.
    Written,
    /// An attempt is out (or was given up unanswered): it may still run.
    InFlight,
    /// A quorum node's acquire may still run and grant (see `places.rs`).
    Late,
}

/// How a request's attempts go out.
enum Attempts<'a> {
    /// Where the keys live, by the deployment's grant rule (see `places.rs`).
    Places(Places),
    /// One key, fairly: the queueing script, on the one server that holds it.
    Fair(Box<FairAttempts>, &'a Serial),
}

/// One acquire under way.
struct Acquiring<'a> {
    context: &'a Arc<Context>,
    ask: Ask,
    /// The lease it forms, set up before the first request goes out: a lease it gets can never
    /// miss renewal.
    holding: Holding,
    attempts_by: Attempts<'a>,
    /// Whether it waits, and has waited: says whether an attempt marks a held key.
    waiting: Waiting,
    waiter: Waiter<'a>,
    /// What is exposed now, and what stays exposed between attempts (a fair waiter's entry).
    exposure: Exposure,
    between: Exposure,
    /// Attempts sent.
    attempts: u32,
    /// With `min_replicas`: the last attempt found a key held and the replicas did not confirm
    /// it. A request that ends on it fails with [`LockError::Replication`], not as contention:
    /// while the replicas confirm nothing, no acquire can count, and the holder it found may be
    /// another acquire waiting for its own replicas.
    unconfirmed: Option<Unconfirmed>,
}

impl<'a> Acquiring<'a> {
    fn new(context: &'a Arc<Context>, ask: Ask) -> Result<Self, LockError> {
        let redis = context.redis();
        // A quorum's permits sit in slots (see `places.rs`): renewed and released in whichever
        // slot the token holds.
        let seat = if redis.permits_in_slots() {
            Seat::AnySlot
        } else {
            Seat::Counted
        };
        let redis_keys: Arc<[LockKeys]> = (ask.keys.iter().zip(ask.modes.iter()))
            .map(|(key, &mode)| context.lock_keys(key).held(mode).seated(seat))
            .collect();
        // The owner token, and the secret of a fair request's first attempt, from one OS call.
        let [token_id, first_secret] = random_ids();
        let token = owner_token(context, token_id);
        let waiting = if ask.wait.is_try() {
            Waiting::Never
        } else {
            Waiting::NotYet
        };
        let attempts_by = if ask.fair {
            let serial = redis.fair().map_err(|reason| LockError::InvalidConfig {
                what: "fair",
                reason: reason.to_owned(),
            })?;
            let fair = FairAttempts::new(&redis_keys[0], ask.ttl, first_secret);
            Attempts::Fair(Box::new(fair), serial)
        } else {
            Attempts::Places(Places::new(
                redis,
                &redis_keys,
                &token,
                (ask.ttl, deadline(&ask.wait)),
                waiting,
            ))
        };
        let fair_token = ask
            .fair
            .then(|| (Arc::clone(&token), crate::fair::presence(ask.ttl)));
        let waiter = Waiter::new(
            ask.wait.deadline(),
            context.notifications.as_ref(),
            fair_token,
        );
        let state = Arc::new(LeaseState::new(ask.ttl, ask.renew));
        let holding = Holding::new(context, ask.renew, redis_keys, token, state);
        Ok(Self {
            context,
            ask,
            holding,
            attempts_by,
            waiting,
            waiter,
            exposure: Exposure::Clean,
            between: Exposure::Clean,
            attempts: 0,
            unconfirmed: None,
        })
    }

    async fn run(&mut self) -> Result<Lease, LockError> {
        let mut stage = Stage::Attempting;
        loop {
            stage = match stage {
                Stage::Attempting => self.attempt().await?,
                Stage::Waiting {
                    first_held,
                    remaining,
                    sent,
                } => self.wait(first_held, remaining, sent).await?,
                Stage::Holding {
                    fencing_token,
                    sent,
                } => return self.hold(fencing_token, sent),
            };
        }
    }

    /// Sends one attempt.
    async fn attempt(&mut self) -> Result<Stage, LockError> {
        self.attempts += 1;
        // Taken first: validity is counted from a moment before the request is sent.
        let sent = Instant::now();
        let deadline = self.ask.wait.deadline();
        let secret = match &mut self.attempts_by {
            Attempts::Fair(fair, _) => Some(fair.next_secret(sent, deadline)),
            Attempts::Places(_) => None,
        };
        self.waiter.before_attempt(self.holding.lock_key(0), secret);
        // If this call is cancelled or fails while the request is out, the lock may have been
        // taken: release it (by token) rather than leave it until its ttl.
        self.exposure = Exposure::InFlight;
        let stats = &self.context.stats;
        stats.acquire_requests.fetch_add(1, Ordering::Relaxed);
        let taken = match &mut self.attempts_by {
            Attempts::Places(places) => places.take(self.context.redis()).await,
            Attempts::Fair(fair, serial) => {
                let (token, waiting) = (&self.holding.token, self.waiting);
                fair.send(serial, token, sent, deadline, waiting)
                    .await
                    .map(|answer| Taken {
                        answer,
                        late: false,
                    })
            }
        };
        let taken = taken.map_err(|failed| {
            self.exposure = match failed.reached {
                // Never sent, or refused before it ran: nothing to undo (but a queued fair
                // waiter still leaves).
                Reached::No | Reached::Refused => self.between,
                // Ran and failed: scripts are not rolled back, so whatever it wrote (a lock, a
                // queue entry) is released by token, once.
                Reached::Answered => Exposure::Written,
                // May still arrive: released, and again in case it runs later.
                Reached::Maybe => Exposure::InFlight,
            };
            failed.error
        })?;
        self.exposure = self.between;
        match taken.answer {
            Acquire::Acquired { fencing_token } => {
                let shared = self.ask.modes.iter().any(|&m| m != LockMode::Exclusive);
                self.waiter.took(shared);
                self.holding.took(sent, self.ask.ttl);
                if taken.late {
                    // Were this lease to end unheld (answered too late), its late grants too.
                    self.between = Exposure::Late;
                }
                Ok(Stage::Holding {
                    fencing_token,
                    sent,
                })
            }
            Acquire::Held {
                first_held,
                remaining,
                unconfirmed,
            } => {
                self.unconfirmed = unconfirmed;
                self.found_held(first_held, remaining, sent, taken.late)
            }
        }
    }

    /// After the attempt sent at `sent` found the key at `first_held` held.
    fn found_held(
        &mut self,
        first_held: usize,
        remaining: Option<Duration>,
        sent: Instant,
        late: bool,
    ) -> Result<Stage, LockError> {
        if late {
            // Also for a try-lock that ends here: its late grants are taken back.
            self.new_token();
        }
        if self.waiting == Waiting::Never {
            return Err(self.ended(LockError::NotAcquired {
                key: self.key(first_held),
            }));
        }
        if self.waiting == Waiting::NotYet || late {
            // Keys taken from now on are marked as waited on (see `scripts/`): other waiters
            // may still wait for them.
            self.waiting = Waiting::Waited;
            if let Attempts::Places(places) = &mut self.attempts_by {
                let holding = &self.holding;
                let mut next = Places::new(
                    self.context.redis(),
                    &holding.redis_keys,
                    &holding.token,
                    (self.ask.ttl, deadline(&self.ask.wait)),
                    self.waiting,
                );
                let at_once = late && next.after_doubt(places);
                *places = next;
                if at_once {
                    // A quorum semaphore's other slots, asked by the new token now.
                    return Ok(Stage::Attempting);
                }
            }
        }
        // A plain attempt marks the first held key; a fair one marks its holder when it
        // queued, which it does with any wait left.
        let marked = match &self.attempts_by {
            Attempts::Places(_) => true,
            Attempts::Fair(..) => {
                self.between = Exposure::Written;
                self.exposure = Exposure::Written;
                FairAttempts::marked(sent, self.ask.wait.deadline())
            }
        };
        self.waiter
            .found_held(self.holding.lock_key(first_held), marked);
        Ok(Stage::Waiting {
            first_held,
            remaining,
            sent,
        })
    }

    /// Ends the use of the owner token (a place may still grant under it, late): releases it in
    /// the background, and takes a new one for the attempts to come.
    fn new_token(&mut self) {
        self.release_later(Leaving::Late);
        let token = owner_token(self.context, random_ids()[0]);
        // The old token's renewal ends before the new one's begins.
        self.holding.registration = None;
        self.holding = Holding::new(
            self.context,
            self.ask.renew,
            Arc::clone(&self.holding.redis_keys),
            token,
            Arc::clone(&self.holding.state),
        );
    }

    /// Releases the keys under the current owner token from a background task, as `leaving`
    /// says.
    fn release_later(&self, leaving: Leaving) {
        release_in_background(
            self.context,
            Arc::clone(&self.holding.redis_keys),
            Arc::clone(&self.holding.token),
            self.ask.ttl,
            leaving,
        );
    }

    /// Waits after the attempt sent at `sent` found the key at `first_held` held.
    async fn wait(
        &mut self,
        first_held: usize,
        remaining: Option<Duration>,
        sent: Instant,
    ) -> Result<Stage, LockError> {
        let held_key = self.holding.lock_key(first_held);
        match self.waiter.wait(held_key, remaining, sent).await {
            Wake::Retry => {
                self.keep_siblings_queued().await;
                Ok(Stage::Attempting)
            }
            Wake::Deadline => Err(self.ended(LockError::Timeout {
                key: self.key(first_held),
                waited: self.ask.wait.started.elapsed(),
            })),
            Wake::Handed(handoff) => Ok(self.handed(&handoff, sent)),
        }
    }

    /// A fair waiter that is the first of its key in this process keeps the others queued (see
    /// `fair/mod.rs`, "Queue"), before its own attempt, within its deadline.
    async fn keep_siblings_queued(&mut self) {
        let Attempts::Fair(fair, serial) = &mut self.attempts_by else {
            return;
        };
        let now = Instant::now();
        if !fair.may_keep_queued(now) {
            return;
        }
        let siblings = self.waiter.fair_siblings();
        let keeping = fair.keep_queued(serial, &siblings, now);
        if let Ok(gone) = tokio::time::timeout_at(self.ask.wait.deadline(), keeping).await {
            self.waiter.wake_fair(&gone);
        }
    }

    /// A release handed this (fair) request the lock.
    fn handed(&mut self, handoff: &Handoff, sent: Instant) -> Stage {
        let Attempts::Fair(fair, _) = &self.attempts_by else {
            return Stage::Attempting;
        };
        let Some(start) = fair.trust(handoff) else {
            // Learned too late to trust the claim (or undated): an attempt confirms the
            // hand-off, or queues again if it lapsed.
            return Stage::Attempting;
        };
        let (claim, ttl) = (handoff.claim, self.ask.ttl);
        self.holding.state.handed(start, claim, ttl);
        // A claim shorter than the ttl gets to the ttl as the protocol says.
        match claim_renewal(self.ask.renew, claim, ttl) {
            ClaimRenewal::ByRenewal => {
                if let Some(registration) = &self.holding.registration {
                    registration.schedule(start, claim);
                }
            }
            ClaimRenewal::Once => self.holding.renew_once(self.context),
            ClaimRenewal::Needless => {}
        }
        let stats = &self.context.stats;
        stats.handed_over.fetch_add(1, Ordering::Relaxed);
        telemetry::handed_over(self.ask.tags);
        Stage::Holding {
            fencing_token: handoff.fencing_token,
            sent,
        }
    }

    /// Every key is held: the lease, unless its answer came after it had run out.
    fn hold(&mut self, fencing_token: u64, sent: Instant) -> Result<Lease, LockError> {
        if self.holding.state.is_lost() {
            // Redis took the keys, but said so after the lease had expired: released once (and
            // again later where a quorum node may still grant).
            self.exposure = self.between.max(Exposure::Written);
            return Err(LockError::AnsweredTooLate {
                keys: self.ask.keys.to_vec(),
                after: sent.elapsed(),
                ttl: self.ask.ttl,
            });
        }
        self.exposure = Exposure::Clean;
        if self.attempts > 1 {
            tracing::debug!(keys = ?self.ask.keys, waited = ?self.ask.wait.started.elapsed(), attempts = self.attempts, "distlock acquired after waiting");
        }
        Ok(Lease::new(
            Arc::clone(self.context),
            Arc::clone(&self.ask.keys),
            &mut self.holding,
            fencing_token,
        ))
    }

    /// Why a request that found a key held ends: `contention`, unless the replicas did not
    /// confirm its last attempt.
    fn ended(&self, contention: LockError) -> LockError {
        self.unconfirmed.map_or(contention, Unconfirmed::error)
    }

    /// The user's key at `index` among the request's keys.
    fn key(&self, index: usize) -> String {
        self.ask.keys.get(index).cloned().unwrap_or_default()
    }
}

impl Drop for Acquiring<'_> {
    fn drop(&mut self) {
        let fair = matches!(self.attempts_by, Attempts::Fair(..));
        let leaving = match self.exposure {
            Exposure::Clean => return,
            Exposure::InFlight if fair => FairAttempts::leaving(true),
            Exposure::InFlight => Leaving::InFlight,
            Exposure::Written if fair => FairAttempts::leaving(false),
            Exposure::Written => Leaving::Queued,
            Exposure::Late => Leaving::Late,
        };
        self.release_later(leaving);
    }
}

/// When the wait of a request ends, if it waits (not a try-lock).
fn deadline(wait: &Wait) -> Option<Instant> {
    (!wait.is_try()).then(|| wait.deadline())
}

/// A lease's owner token from the random id `id`, with the manager's holder label.
fn owner_token(context: &Context, id: [u8; 16]) -> Arc<str> {
    match &context.holder_label {
        Some(label) => format!("{}:{label}", id_text(id)).into(),
        None => id_text(id),
    }
}
