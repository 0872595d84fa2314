//! Releasing by token: the release script call, and the background release that repeats it
//! when nobody waits for the answer (a lease dropped instead of released, an acquire that ended
//! not knowing whether it took the lock, a fair waiter leaving its queue).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::background::MAX_PENDING;
use crate::context::Context;
use crate::error::LockError;
use crate::failed::Failed;
use crate::keys::LockKeys;
use crate::retry::{Decision, Retry, Tried};
use crate::scripts::{self, Queued};
use crate::sync::lock;
use crate::topology::by_shard;

/// Deletes the keys still held by `token` (handing each to its oldest fair waiter, if it
/// has one); returns how many were. With [`Queued::Maybe`], `token` also leaves the keys' fair
/// queues: a fair waiter that gives up, or whose attempt may have queued it. One script call
/// per shard (one but on a cluster, where a lease may span slots).
pub(crate) async fn release_keys(
    context: &Context,
    redis_keys: &[LockKeys],
    token: &str,
    queued: Queued,
) -> Result<usize, LockError> {
    let redis = context.redis();
    let mut released = 0;
    for group in by_shard(redis, redis_keys) {
        let keys = group.iter().map(|&i| &redis_keys[i]);
        let call = scripts::release_call(redis.announce(), keys, token, queued);
        released += redis.release(&call).await?;
    }
    Ok(released)
}

/// Releases from a spawned task: the fallback when a lease is dropped instead of released,
/// or an acquire ended without knowing whether it took the lock, or a fair waiter left its
/// queue (see [`Leaving`]). Retries failed attempts until `ttl` from now, when the keys have
/// expired anyway.
///
/// **Bounded while Redis is away.** At most [`MAX_PENDING`] such releases wait per manager
/// (one more is dropped, with a warning at most once a second: its keys expire by their ttl),
/// and at most [`IN_FLIGHT`](crate::background::IN_FLIGHT) of their requests are out at once:
/// when Redis comes back, the releases that piled up during the outage go out a few at a time,
/// beside the callers' own requests, never in a flood ahead of them.
pub(crate) fn release_in_background(
    context: &Arc<Context>,
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
    let pending = context
        .background
        .enter()
        .then(|| Pending(Arc::clone(context)));
    let Some(pending) = pending else {
        let dropped = lock(&context.background.dropped).note(Instant::now());
        if let Some(dropped) = dropped {
            tracing::warn!(
                dropped,
                limit = MAX_PENDING,
                "distlock background releases pile up (Redis unreachable?); more are dropped, \
                 their locks expire after their ttl"
            );
        }
        return;
    };
    if leaving != Leaving::Dropped {
        tracing::debug!(keys = ?lock_names(&redis_keys), ?leaving, "distlock releasing in the background");
    }
    let give_up = Instant::now() + ttl;
    runtime.spawn(async move { pending.release(&redis_keys, &token, leaving, give_up).await });
}

/// One background release counted in [`Background::pending`](crate::background::Background::pending) (uncounted when dropped, also
/// with its runtime).
struct Pending(Arc<Context>);

impl Pending {
    /// Releases `redis_keys` by `token`, repeated as `leaving` says, and retried as
    /// [`Retry::release`] says until `give_up`.
    async fn release(
        &self,
        redis_keys: &[LockKeys],
        token: &str,
        leaving: Leaving,
        give_up: Instant,
    ) {
        let context = &self.0;
        let (retry, mut tried) = (Retry::release(give_up), Tried::default());
        let mut repeats = match leaving {
            Leaving::InFlight | Leaving::InFlightFair | Leaving::Late => 2,
            Leaving::Dropped | Leaving::Queued | Leaving::Lost => 0,
        };
        loop {
            let released = {
                // Its turn among the manager's background requests, but not past the keys'
                // ttl: they are gone by then anyway.
                let turn = context.background.in_flight.acquire();
                let Ok(_turn) = tokio::time::timeout_at(give_up, turn).await else {
                    tracing::debug!(keys = ?lock_names(redis_keys), "distlock background release gave up waiting for its turn; the keys expire by their ttl");
                    return;
                };
                release_keys(context, redis_keys, token, leaving.queued()).await
            };
            let pause = match released {
                Ok(released)
                    if repeats > 0
                        && (released == 0
                            || matches!(leaving, Leaving::InFlightFair | Leaving::Late))
                        && Instant::now() < give_up =>
                {
                    repeats -= 1;
                    context.redis().response_timeout
                }
                Ok(_) => return,
                Err(error) => {
                    let failed = Failed::maybe(error);
                    let Decision::After(pause) = retry.decide(&failed, &mut tried, Instant::now())
                    else {
                        return gave_up(context, redis_keys, leaving, failed.error);
                    };
                    tracing::debug!(keys = ?lock_names(redis_keys), error = %failed.error, "distlock background release failed; retrying");
                    pause
                }
            };
            tokio::time::sleep(pause).await;
        }
    }
}

/// Logs a background release that failed for good, as loudly as `leaving` deserves.
fn gave_up(context: &Context, redis_keys: &[LockKeys], leaving: Leaving, error: LockError) {
    let keys = lock_names(redis_keys);
    match leaving {
        // A lease its owner let go of: the lock is held, and others wait for it.
        Leaving::Dropped => {
            let unreported = lock(&context.background.failed).note(Instant::now());
            if let Some(unreported) = unreported {
                tracing::warn!(?keys, %error, unreported, "distlock release failed; the lock expires after its ttl");
            }
        }
        Leaving::Lost => {
            tracing::debug!(?keys, %error, "distlock could not release a lost lease; its keys expire after their ttl at the latest")
        }
        // Nothing is known to be held: an acquire that may never have run, a waiter's queue
        // entry (which lapses by itself).
        _ => {
            tracing::debug!(?keys, %error, ?leaving, "distlock could not undo an acquire that may have reached Redis; if it took the lock, the lock expires after its ttl")
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.background.leave();
    }
}

/// The lock keys' Redis names, for logs.
fn lock_names(redis_keys: &[LockKeys]) -> Vec<&str> {
    redis_keys.iter().map(|k| k.lock()).collect()
}

/// Why a release runs in the background, which decides how often it is repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leaving {
    /// A lease dropped instead of released: released once.
    Dropped,
    /// A lease dropped after it was lost: its keys are most likely gone or someone else's (an
    /// extension answered too late may have prolonged them), so it is released like a dropped
    /// one, but a failure is logged at debug level only: the loss was reported already.
    Lost,
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
    /// A quorum round left nodes whose acquire may still run and grant, under an owner token
    /// the request no longer uses: released at once and twice more, a response timeout apart,
    /// whatever the releases find (one node's grant found says nothing of another's to come).
    Late,
}

impl Leaving {
    /// Whether the release's owner may be queued as a fair waiter, and so leaves the queues.
    fn queued(self) -> Queued {
        match self {
            Self::Queued | Self::InFlightFair => Queued::Maybe,
            Self::Dropped | Self::Lost | Self::InFlight | Self::Late => Queued::No,
        }
    }
}
