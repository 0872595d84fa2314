//! The acquire state machine, and the in-doubt release policy.
//!
//! One acquire makes attempts until it holds every key, the wait runs out, or Redis fails:
//! each attempt is one script call ([`scripts::ACQUIRE`], or the fair queue's); between
//! attempts a [`Waiter`] sleeps until a release notification, the holder's expiry or the
//! deadline, and a fair waiter may be handed the lock instead (see `fair.rs`).
//!
//! **In doubt.** A request that may have taken the lock, when the acquire does not end with a
//! lease, is released by its token, so no lock is left held by nobody until its ttl:
//! - the call is cancelled or times out while its request is out: released, and again after a
//!   response timeout in case the request runs late ([`Leaving::InFlight`]);
//! - Redis ran it and answered with an error (scripts are not rolled back): released once;
//! - the request was never sent (no connection, or one already closed by the server, which
//!   fails the request before it is handed over), or Redis refused it before running it
//!   (`READONLY`, `OOM`, a key the user may not touch): nothing to undo;
//! - a fair waiter that leaves between attempts releases once, which takes it out of the
//!   queue and passes on a hand-off it was given ([`Leaving::Queued`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::call::{Kind, ScriptCall, Taking};
use crate::context::Context;
use crate::error::LockError;
use crate::failed::{Failed, Reached};
use crate::fair::{handoff_start, FairAnswer, FairRequest};
use crate::fence::raise_call;
use crate::keys::LockKeys;
use crate::lease::Lease;
use crate::release::{release_in_background, Leaving};
use crate::scripts::{self, Acquire, Waiting};
use crate::telemetry;
use crate::time::millis;
use crate::topology::{by_shard, Route};
use crate::validity::{validity, LeaseState};
use crate::wait::{Wait, Waiter, Wake};

/// Takes the locks on `keys` (sorted, de-duplicated) for `ttl`, waiting within `wait`: the
/// state machine behind every request, fair or not.
/// `label` names the request in metrics (its key template).
pub(crate) async fn acquire(
    context: &Arc<Context>,
    keys: Arc<[String]>,
    ttl: Duration,
    wait: Wait,
    renew: bool,
    fair: bool,
    label: &'static str,
) -> Result<Lease, LockError> {
    let started = wait.started;
    let mut attempts = 0u32;
    let outcome = attempt(context, keys, ttl, wait, renew, fair, label, &mut attempts).await;
    let took = started.elapsed();
    telemetry::acquisition(label, outcome.as_ref().map(|_| took), attempts > 1);
    if outcome.is_ok() {
        telemetry::waited(label, took);
    }
    outcome
}

/// The attempts of [`acquire`], counted in `attempts`.
#[allow(clippy::too_many_arguments)]
async fn attempt(
    context: &Arc<Context>,
    keys: Arc<[String]>,
    ttl: Duration,
    wait: Wait,
    renew: bool,
    fair: bool,
    label: &'static str,
    attempts: &mut u32,
) -> Result<Lease, LockError> {
    let redis_keys: Arc<[LockKeys]> = keys.iter().map(|k| context.lock_keys(k)).collect();
    // The owner token, and the secret of a fair request's first attempt, from one OS call.
    let [token_id, first_secret] = random_ids();
    let token: Arc<str> = match &context.holder_label {
        Some(label) => format!("{}:{label}", id_text(token_id)).into(),
        None => id_text(token_id),
    };
    let mut first_secret = fair.then_some(first_secret);
    let state = Arc::new(LeaseState::new(ttl, renew));
    // Registered before the request goes out: an acquired lease can never miss renewal.
    let mut registration = renew.then(|| {
        context.renewals.register(
            Arc::clone(&redis_keys),
            Arc::clone(&token),
            Arc::clone(&state),
        )
    });
    // Whether this request waits, and whether an attempt found a key held: later attempts
    // take keys marked as waited on, since other waiters may still wait for them (see
    // `scripts::Waiting`).
    let mut waiting = if wait.is_try() {
        Waiting::Never
    } else {
        Waiting::NotYet
    };
    let mut request = if fair {
        if let Some(reason) = context.redis().refuses_fair() {
            return Err(LockError::InvalidConfig {
                what: "fair",
                reason: reason.to_owned(),
            });
        }
        AcquireRequest::Fair(FairRequest::new(&redis_keys[0], ttl))
    } else {
        AcquireRequest::new(context.redis(), &redis_keys, &token, ttl, waiting)
    };

    let started = wait.started;
    let deadline = wait.deadline();
    let mut waiter = Waiter::new(
        deadline,
        context.notifications.as_ref(),
        fair.then(|| Arc::clone(&token)),
    );
    let mut in_doubt = InDoubt {
        context,
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
    // The secret of the latest fair attempt (see `fair.rs`).
    let mut secret: Option<Arc<str>> = None;
    loop {
        *attempts += 1;
        // Taken first: validity is counted from a moment before the request is sent.
        let sent = Instant::now();
        // A fair attempt that still waits stores a new secret in the queue, and only a
        // hand-off made after it (by the release script, which alone can read it) is signed
        // with it. The last attempt, at the deadline, stores nothing: it keeps the secret.
        if fair && (secret.is_none() || sent < deadline) {
            secret = Some(id_text(
                first_secret.take().unwrap_or_else(|| random_ids()[0]),
            ));
        }
        waiter.before_attempt(redis_keys[0].lock(), secret.clone());
        // If this call is cancelled or fails while the request is out, the lock may have
        // been taken: release it (by token) rather than leave it until its ttl.
        in_doubt.armed = true;
        in_doubt.in_flight = true;
        context
            .stats
            .acquire_requests
            .fetch_add(1, Ordering::Relaxed);
        let answer = match request
            .send(
                context.redis(),
                &token,
                secret.as_deref(),
                deadline,
                sent,
                waiting,
            )
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
                    // Never sent, or refused before it ran: nothing to undo, but a queued fair
                    // waiter still leaves.
                    Reached::No | Reached::Refused => {
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
                waiter.took();
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
                if wait.is_try() {
                    return Err(LockError::NotAcquired { key: key() });
                }
                if waiting == Waiting::NotYet {
                    waiting = Waiting::Waited;
                    if !fair {
                        request =
                            AcquireRequest::new(context.redis(), &redis_keys, &token, ttl, waiting);
                    }
                }
                queued = fair;
                in_doubt.armed = queued;
                let held_key = redis_keys.get(first_held).map_or("", |k| k.lock());
                // A plain attempt marks the first held key; a fair one marks its holder when it
                // queued, which it does with any wait left (see `fair.rs`).
                let marked = !fair || deadline.saturating_duration_since(sent).as_millis() > 0;
                waiter.found_held(held_key, marked);
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
                    *start + validity(handoff.claim) > Instant::now() + Duration::from_millis(1)
                });
                let Some(start) = trusted else {
                    // Learned too late to trust the claim (or undated): an attempt
                    // confirms the hand-off, or queues again if it lapsed.
                    continue;
                };
                state.handed(start, handoff.claim, ttl);
                context.stats.handed_over.fetch_add(1, Ordering::Relaxed);
                telemetry::handed_over(label);
                // A claim shorter than the ttl is renewed to the ttl like any lease, a third of
                // the claim after it began (a body that ends sooner spends no round trip on
                // it); a lease without renewal is extended to its ttl at once.
                let claimed = handoff.claim < ttl;
                match (&registration, claimed) {
                    (Some(registration), _) => registration.schedule(start, handoff.claim),
                    (None, true) => {
                        registration = Some(context.renewals.register_once(
                            Arc::clone(&redis_keys),
                            Arc::clone(&token),
                            Arc::clone(&state),
                        ));
                    }
                    (None, false) => {}
                }
                handoff.fencing_token
            }
        };
        if state.is_lost() {
            // The answer came after the lease it granted had run out.
            in_doubt.armed = true;
            return Err(LockError::AnsweredTooLate {
                keys: keys.to_vec(),
                after: sent.elapsed(),
                ttl,
            });
        }
        in_doubt.armed = false;
        if *attempts > 1 {
            tracing::debug!(keys = ?keys, waited = ?started.elapsed(), attempts = *attempts, "distlock acquired after waiting");
        }
        return Ok(Lease::new(
            Arc::clone(context),
            keys,
            redis_keys.clone(),
            token.clone(),
            fencing_token,
            state,
            registration,
        ));
    }
}

/// The acquire request of one lease, built once and sent at every attempt.
enum AcquireRequest {
    /// The all-or-nothing script, once per group of keys that share a shard (one group but on
    /// a cluster), groups in shard order.
    All(Vec<Group>),
    /// One key, fairly: the queueing script.
    Fair(FairRequest),
}

/// The keys of one request that share a shard, taken by one script call.
struct Group {
    /// The index of each of its keys among the request's sorted keys.
    indices: Vec<usize>,
    /// Its kind also makes this group's release (`undo`), sent when a later group finds its
    /// keys held, and names its fencing counters, raised to the lease's token
    /// (`fence::RAISE`) when another group drew a greater one.
    acquire: ScriptCall,
}

impl Group {
    fn taking(&self) -> Option<&Taking> {
        match &self.acquire.kind {
            Kind::Acquire(taking) => Some(taking),
            _ => None,
        }
    }
}

impl AcquireRequest {
    fn new(
        route: &dyn Route,
        redis_keys: &Arc<[LockKeys]>,
        token: &Arc<str>,
        ttl: Duration,
        waiting: Waiting,
    ) -> Self {
        // One global order (shard, then key: the keys are sorted), so two requests for
        // overlapping keys on several shards take them in the same order.
        let groups = by_shard(route, redis_keys)
            .into_iter()
            .map(|indices| {
                let taking = Taking {
                    keys: Arc::clone(redis_keys),
                    indices: indices.clone(),
                    token: Arc::clone(token),
                    ttl,
                    publish: route.publish_command(),
                    announce: route.announces(),
                    make_undo: crate::release::undo_of,
                };
                let mut acquire = ScriptCall::new(
                    "acquire",
                    &scripts::ACQUIRE,
                    Kind::Acquire(taking),
                    2 * indices.len(),
                );
                for &i in &indices {
                    acquire.key(redis_keys[i].lock());
                }
                for &i in &indices {
                    acquire.key(redis_keys[i].fence());
                }
                acquire.arg(&**token).arg(millis(ttl)).arg(waiting);
                Group { indices, acquire }
            })
            .collect();
        Self::All(groups)
    }

    /// Sends one attempt; returns the answer and, for a fair attempt that queued, Redis's clock
    /// (ms) when it ran.
    async fn send(
        &self,
        redis: &dyn Route,
        token: &str,
        secret: Option<&str>,
        deadline: Instant,
        now: Instant,
        waiting: Waiting,
    ) -> Result<(Acquire, Option<u64>), Failed> {
        match self {
            Self::All(groups) => take_groups(redis, groups)
                .await
                .map(|answer| (answer, None)),
            Self::Fair(fair) => {
                let wait_left = deadline.saturating_duration_since(now);
                fair.send(redis, token, secret.unwrap_or_default(), wait_left, waiting)
                    .await
                    .map(|answer| match answer {
                        FairAnswer::Acquired { fencing_token } => {
                            (Acquire::Acquired { fencing_token }, None)
                        }
                        FairAnswer::Queued {
                            remaining,
                            server_ms,
                        } => (
                            Acquire::Held {
                                first_held: 0,
                                remaining,
                            },
                            Some(server_ms),
                        ),
                    })
            }
        }
    }
}

/// Takes every group in order, all or nothing: a group whose keys are held releases the
/// groups taken before it. The lease's fencing token is the greatest any group drew, written
/// back to the counters of the groups that drew less, so the next lease of each key draws above
/// it. A failure after some group was taken says it ran (so the acquire releases by token).
async fn take_groups(redis: &dyn Route, groups: &[Group]) -> Result<Acquire, Failed> {
    let mut drawn: Vec<u64> = Vec::with_capacity(groups.len());
    let wrote = |failed: Failed, taken: bool| Failed {
        reached: match failed.reached {
            Reached::No | Reached::Refused if taken => Reached::Answered,
            reached => reached,
        },
        error: failed.error,
    };
    for group in groups {
        match redis.call::<Acquire>(&group.acquire).await {
            Ok(Acquire::Acquired { fencing_token }) => drawn.push(fencing_token),
            Ok(Acquire::Held {
                first_held,
                remaining,
            }) => {
                for undo in groups[..drawn.len()]
                    .iter()
                    .filter_map(|g| g.acquire.undo())
                {
                    redis
                        .call::<redis::Value>(&undo)
                        .await
                        .map_err(|failed| wrote(failed, true))?;
                }
                return Ok(Acquire::Held {
                    first_held: group.indices.get(first_held).copied().unwrap_or(0),
                    remaining,
                });
            }
            Err(failed) => return Err(wrote(failed, !drawn.is_empty())),
        }
    }
    let token = drawn.iter().copied().max().unwrap_or(0);
    for (taking, _) in groups
        .iter()
        .zip(&drawn)
        .filter(|(_, &t)| t < token)
        .filter_map(|(group, t)| Some((group.taking()?, t)))
    {
        redis
            .call::<redis::Value>(&raise_call(taking, token))
            .await
            .map_err(|failed| wrote(failed, true))?;
    }
    Ok(Acquire::Acquired {
        fencing_token: token,
    })
}

/// Releases a lock whose acquire request may have reached Redis when the acquire did not
/// finish, and takes a fair waiter that leaves out of its queue.
struct InDoubt<'a> {
    context: &'a Arc<Context>,
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
            release_in_background(
                self.context,
                Arc::clone(self.redis_keys),
                Arc::clone(self.token),
                self.ttl,
                leaving,
            );
        }
    }
}

/// Two random 128-bit ids from the OS random source, in one call: a request's owner token and
/// its first fair secret. Not from a seeded per-thread generator: a fork, a restored VM snapshot
/// or a call that reseeds such a generator would repeat its tokens, and an acquire that finds
/// its own token counts as success.
fn random_ids() -> [[u8; 16]; 2] {
    let mut ids = [[0; 16]; 2];
    // As `uuid::Uuid::new_v4` does: without an OS random source no token is safe to use.
    getrandom::fill(ids.as_flattened_mut()).expect("distlock: the OS random source failed");
    ids
}

/// An id as a uuid v4 in 32 hex digits.
fn id_text(random: [u8; 16]) -> Arc<str> {
    let mut digits = [0; uuid::fmt::Simple::LENGTH];
    let id = uuid::Builder::from_random_bytes(random).into_uuid();
    Arc::from(&*id.simple().encode_lower(&mut digits))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_uuid_v4_hex_and_distinct() {
        let [a, b] = random_ids().map(id_text);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a.as_bytes()[12], b'4', "version 4: {a}");
        assert_ne!(a, b);
    }
}
