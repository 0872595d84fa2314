//! The fair hand-off protocol, end to end, in one place: how waiters queue in Redis, how a
//! release hands the lock to the oldest live waiter and says so, how the waiter trusts and dates
//! that message, and how a crashed recipient's claim is watched. The rest of the runtime holds
//! its opaque handles and no fair logic: an acquire holds a [`FairAttempts`], a waiter's ticket
//! a [`FairWaiter`], a wait a [`ClaimWatch`]; the notifier hands every hand-off to [`deliver`],
//! and asks the rules of `waiter.rs` which of a key's local fair waiters ([`Local`]) watches
//! the holder, keeps the others queued ([`watching`], [`siblings`]) and inherits its duties
//! ([`joined`], [`leaving`]).
//!
//! | file | what |
//! |---|---|
//! | `acquire.lua`, `entry.lua`, `head_live.lua`, `hand.lua`, `admit.lua` | the queue's Lua: the fair acquire, a waiter's queue entry, and the functions a release (and a forced release) serves the queue with, in arrival order and by mode |
//! | `queue.rs` | the fair acquire's script call and its answer |
//! | `message.rs` | the hand-off message and its signature |
//! | `request.rs` | the requester's side: a new secret per attempt, Redis's clock per attempt, and whether a hand-off can be trusted |
//! | `waiter.rs` | the waiter's side: which local waiter a hand-off reaches, who watches the holder and a hand-off's claim, who keeps the others queued |
//!
//! 1. **Queue.** A fair waiter that finds the key held joins the key's queue (see
//!    `acquire.lua`): a list of tokens in arrival order, and a hash of each token's entry
//!    (deadline, claim time, secret). A free key is taken only if no live waiter queued first.
//!    An entry's deadline is the end of the waiter's wait, but no more than its presence (twice
//!    its ttl, at least 10 s) after it was last kept. The first fair waiter of the key in each
//!    process keeps its own entry (by its attempts) and the others' (`refresh.lua`) at least
//!    every third of the shortest presence among them; it alone wakes at the holder's expiry,
//!    the others sleep until a hand-off or a notification (or its leaving) wakes them. A crashed
//!    waiter leaves the queue within its presence, one that waits for ever (an election's
//!    candidate) keeps its place, and waiting costs a call per process, not per waiter.
//! 2. **Hand-off.** A release with a live waiter queued sets the key to that waiter's token for
//!    a claim time ([`HANDOFF_CLAIM`]), draws its fencing token, and publishes
//!    `h <token> <fence> <redis_ms> <claim_ms> <mac>` on the key's channel, where `<mac>` is
//!    `sha1hex(secret + " " + fields + " " + secret)` over the fields before it.
//! 3. **Trust.** Anyone allowed to publish on the channel could name a waiter; anyone allowed
//!    to subscribe sees every message. So a message signs its fields with the secret the
//!    waiter's latest attempt stored in the queue (128 random bits, new at every attempt, never
//!    published): only a client that can read the queue's keys (the release script) can sign,
//!    and the waiter checks the signature before it trusts the claim, the date or the fencing
//!    token ([`FairWaiter`]). The safety boundary is key access: a client that can read the
//!    queue can take the lock itself. A client that may publish can still disturb liveness (fake
//!    release notices make waiters try again; fake hand-offs naming waiters of other processes
//!    make watchers wait, by at most a claim and a quarter per message), never exclusion or
//!    fencing.
//! 4. **Dating.** The new holder counts its lease from a moment known to precede Redis setting
//!    the key ([`FairAttempts::trust`]): the message's Redis time mapped onto this host's clock
//!    through the Redis time of the waiter's own last attempt. A message too old to trust is
//!    confirmed by one attempt instead (which finds the key already the waiter's).
//! 5. **Claim.** The recipient's renewal extends the key from its claim to its ttl a third of
//!    the claim later, like any renewal (a body that ends sooner spends no round trip on it); a
//!    recipient without renewal extends it at once ([`claim_renewal`]). A recipient that is gone
//!    (its process crashed) leaves the claim to lapse; the oldest fair waiter of every subscribed
//!    process watches it ([`deliver`], [`ClaimWatch`]), and retries once the claim (plus a quarter)
//!    has passed; a watcher that leaves passes its watch on ([`leaving`]). Each crashed
//!    waiter at the head of the queue costs the queue at most that long.
//! 6. **Leaving.** A fair waiter that leaves releases by token, which takes it out of the queue
//!    and passes on a hand-off it was given; one whose attempt may still be on its way releases
//!    again after it ([`FairAttempts::leaving`]).

use std::time::Duration;

mod message;
mod queue;
mod request;
mod waiter;

pub(crate) use message::Handoff;
pub(crate) use queue::{ACQUIRE_FAIR, REFRESH_FAIR};
pub(crate) use request::{claim_renewal, presence, ClaimRenewal, FairAttempts};
pub(crate) use waiter::{
    deliver, joined, leaving, siblings, wake, watching, ClaimWatch, FairWaiter, HolderWatch, Local,
    Sibling,
};

/// How long a lock handed to a fair waiter is held for it before the waiter extends it to its
/// ttl (its renewal does, a third of the claim later). A hand-off to a waiter that is gone
/// (crashed, or its process stalled) costs the queue at most this long (plus a quarter, the
/// watchers' slack) before the next waiter takes the lock.
///
/// ```no_run
/// use distlock_runtime::HANDOFF_CLAIM;
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// // The holder's usual time, plus one crashed waiter ahead in the queue (a claim and a
/// // quarter).
/// let wait = std::time::Duration::from_secs(5) + HANDOFF_CLAIM * 5 / 4;
/// let lease = locks.lock("stock:sku-1").fair(true).wait(wait).acquire().await?;
/// # Ok(()) }
/// ```
pub const HANDOFF_CLAIM: Duration = Duration::from_secs(2);
