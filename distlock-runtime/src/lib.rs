//! Distributed locks on Redis for async Rust.
//!
//! One attribute makes an async fn run under a lease held in Redis: taken atomically (one Lua
//! script, one round trip when free), released only by its owner, extended in the background
//! while the body runs, with a fencing token that increases on every acquisition, also after
//! Redis lost its data.
//!
//! ```no_run
//! use distlock_runtime::{distributed_lock, LockError, LockManager};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum AppError {
//!     #[error(transparent)]
//!     Lock(#[from] LockError),
//!     // ... the app's own variants
//! }
//!
//! # #[derive(Debug)] struct Receipt { order_id: u64, amount_cents: u64 }
//! #[distributed_lock("order:{order_id}", ttl = 30)]
//! async fn pay(order_id: u64, amount_cents: u64) -> Result<Receipt, AppError> {
//!     // runs on at most one task in the whole fleet per order_id, while the lease is held
//!     Ok(Receipt { order_id, amount_cents })
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let locks = LockManager::from_url("redis://127.0.0.1:6379")?;
//!     distlock_runtime::set_default_manager(locks.clone());
//!     pay(42, 1999).await?;
//!     Ok(())
//! }
//! ```
//!
//! [`distributed_lock`] lists the attribute's options. Everything it does is also available by
//! hand, through a [`LockManager`]:
//!
//! ```no_run
//! use std::time::Duration;
//! use distlock_runtime::{LockError, LockManager};
//!
//! # async fn demo() -> Result<(), LockError> {
//! let locks = LockManager::from_url("redis://127.0.0.1:6379")?;
//!
//! // Run a future under a lock: released whatever happens, body stopped if the lease is lost.
//! let charged = locks
//!     .lock("order:42")
//!     .ttl(Duration::from_secs(30))
//!     .wait(Duration::from_secs(5))
//!     .run(async { /* charge the order once, fleet-wide */ 1999 })
//!     .await?;
//!
//! // Or hold a lease by hand, and lock several keys as one unit.
//! let lease = locks.lock_all(["stock:sku-1", "wallet:7"]).acquire().await?;
//! println!("fencing token {}", lease.fencing_token());
//! lease.release().await?;
//! # let _ = charged;
//! # Ok(()) }
//! ```
//!
//! distlock needs Redis 7.0 or newer (its scripts declare themselves with `#!lua`, and the
//! single-key acquire uses `SET ... NX GET`).
//!
//! # Guarantees
//! - Mutual exclusion per key while leases are valid. A lease's validity is counted from before
//!   its request was sent, less a clock-drift margin, so this process gives up a lease before
//!   Redis expires it.
//! - A lock is only released or extended by its owner: a 128-bit token from the operating
//!   system's random source (a uuid v4, never a seeded or forkable generator), compared in Lua.
//!   Renewal never re-creates a lock that is gone.
//! - Fencing tokens strictly increase per key, across all clients, also after expiry and after
//!   Redis lost its data (see [Fencing tokens](#fencing-tokens)).
//! - No lock outlives its ttl after its holder dies, and every key distlock writes expires.
//! - Every Redis call is bounded by the manager's timeouts: a Redis that is down or hung is an
//!   error, never a hang, and every wait ends by its deadline plus at most one response timeout
//!   (the subscriber connection is opened, and keys subscribed, by background tasks, never by a
//!   waiter). A lease lost while its `run` body runs returns [`LockError::LeaseLost`] when the
//!   lease ends, without waiting on a release that cannot get through. Renewal against a failing
//!   Redis retries with jittered backoff and logs once, then at most once a second. Settings
//!   Redis refuses are [`LockError::Misconfigured`], not outages; [`LockManager::ping`] finds
//!   them at startup. An acquire that may have taken a lock without returning a lease (its
//!   call timed out or was cancelled while the request was out, or Redis ran it and answered
//!   with an error) is released by token in the background; one that never reached Redis
//!   leaves nothing to release.
//! - No connection is held while a body runs.
//! - Waiters are woken by release notifications (`PUBLISH` from the release script, one
//!   subscriber connection per manager, one local waiter woken per release, oldest first), and
//!   also at the holder's expiry; a lost notification costs latency, never a hang. A manager
//!   built on a caller's pool has no client to subscribe with, and an ACL user may lack channel
//!   rights (see [Least-privilege ACL user](#least-privilege-acl-user)): their waiters poll with
//!   backoff.
//! - Re-entrancy is for strict nesting only: a `run` (or annotated call) nested inside a `run`
//!   body for keys its task already holds runs at once under the outer lease, but calls that
//!   run side by side on one task (`join!`, `select!`, `FuturesUnordered` in the body) are
//!   separate critical sections and never overlap: the first borrows the key until it ends,
//!   the others wait their turn (see [`LockRequest::run`]).
//!
//! # Fencing tokens
//! A lease can end without its holder noticing in time: a process paused (GC, `SIGSTOP`), a
//! host suspended, or a VM paused stops the monotonic clock this process counts validity on,
//! or stops the process itself, and its next write may land after another holder took the
//! lock. No lock can prevent that; storage can. Pass [`Lease::fencing_token`] (or
//! [`current_fencing_token`] inside a body) with every write, and have the storage refuse a
//! token smaller than the greatest it has seen for the resource: a paused holder's late write
//! is then refused instead of corrupting the newer holder's work (the seckill example does this
//! in one Lua script).
//!
//! Each lock key has a counter beside it (`distlock:fence:{KEY}` by default), and a token is the greater of
//! Redis's clock in microseconds (`TIME`) and one more than the counter, drawn in the same
//! script that takes the lock. So tokens keep rising when Redis restarts without persistence,
//! fails over to a replica that missed the last writes, or evicts the counter: they go on from
//! the clock. The clock assumption: Redis's wall clock (and a new primary's after a failover)
//! does not step back by more than the time between the last token drawn before a loss and the
//! first one after; while the counter lives (a ttl after its last draw), a clock stepped back
//! cannot make tokens fall at all. Tokens stay below 2^53 (about 1.8 x 10^15 today), so
//! JavaScript numbers and Lua scripts compare them exactly. A lease on several keys has one
//! token, greater than every earlier token of each of its keys.
//!
//! # Fair locks
//! By default a released lock goes to whichever waiter asks first after the release, which may
//! be the task that just released it. A fair request (`fair = true` on the attribute,
//! [`LockRequest::fair`], or [`LockManagerBuilder::default_fair`]) serves waiters in arrival
//! order instead:
//! - A fair waiter that finds the key held joins the key's queue in Redis (`distlock:queue:{KEY}`
//!   and `distlock:waiters:{KEY}` by default, gone when the queue empties or its last waiter's wait has
//!   passed). A free key is taken only if no live waiter queued first.
//! - A release hands the lock straight to the oldest live waiter: the release script sets the
//!   key to that waiter's token and publishes the hand-off, and the waiter's body starts when the
//!   notification arrives, without another acquire request.
//! - Every queue entry carries its waiter's deadline and is skipped once it has passed; a waiter
//!   that gives up or is cancelled leaves the queue (and passes on a hand-off it was given) from
//!   a background task.
//! - A hand-off holds the key for [`HANDOFF_CLAIM`] (2 s, or the ttl if shorter); the new
//!   holder extends it to its ttl in the background. If the waiter is gone (its process
//!   crashed), the claim lapses and a watcher takes the lock: the hand-off message tells the
//!   next waiter in line, and the oldest fair waiter of every process that waits, to try again
//!   once the claim (plus a quarter) has passed. Each crashed waiter at the head of the queue
//!   delays it by at most 2.5 s, as long as some process with a live waiter of the key is
//!   subscribed to its notifications. (A fair waiter whose manager has no notifications, built
//!   on a caller's pool, polls, and notices a lapsed claim at its next poll.)
//! - A hand-off is dated by Redis's clock (each fair attempt returns it), so the new holder's
//!   lease validity is still counted from a moment known to precede Redis setting its expiry.
//! - Trust: anyone allowed to publish on the key's channel could name a waiter in a message,
//!   and anyone allowed to subscribe sees every message. A hand-off therefore carries a
//!   signature of its fields keyed by a secret the waiter's latest attempt stored in the queue
//!   (128 random bits, new at every attempt, never published), and a waiter acts only on a
//!   hand-off its secret signed; forged or altered ones are dropped with a warning. The safety
//!   boundary is key access: a client that can read the queue can take the lock anyway. A client
//!   that may only publish can disturb liveness (fake release notices make waiters try again;
//!   fake hand-offs naming waiters of other processes make watchers wait, by at most a claim and
//!   a quarter each), never exclusion or fencing.
//!
//! Fair is not the default because its acquire script does more work even when the lock is
//! free, a crashed waiter delays a fair queue by up to 2.5 s where it costs unfair waiters
//! nothing, and unfair waiters are already woken by notification rather than polling. Under
//! contention fair wins on every count (the README's performance section has the figures): use
//! it for hot keys. Only single-key requests can be fair. Fair and unfair requests on one key can be mixed: every release then hands the key
//! to a queued fair waiter if there is one, so unfair waiters go after the queue (an unfair
//! request can still take a key whose holder's lease expired before the queue's head does).
//!
//! # Least-privilege ACL user
//! distlock works under a Redis ACL user that may touch only the keys under the manager's prefix
//! (`distlock:` by default) and run only the commands it uses: `EVALSHA` and `SCRIPT LOAD` for
//! its scripts, the commands those scripts call, and `SELECT` for the URL's database (redis-rs
//! also sends `CLIENT SETINFO` when it connects, and ignores a refusal). Release notifications (`PUBLISH` from the
//! scripts, `SUBSCRIBE` on a connection of their own) are optional. With the default prefix:
//!
//! ```text
//! ACL SETUSER distlock on >CHANGE-ME resetkeys ~distlock:* resetchannels -@all +evalsha +script|load +select +del +exists +get +hdel +hexists +hget +hset +lindex +lpop +lrem +pexpire +pttl +rpush +set +time
//! ACL SETUSER distlock &distlock:* +publish +subscribe +unsubscribe
//! ```
//!
//! The first line is all distlock needs; the second adds notifications. Without them, releases
//! and hand-offs still succeed (the scripts skip an announcement Redis refuses), and waiters
//! poll with backoff (1 to 50 ms), so a released key is still taken within milliseconds, at the
//! cost of more requests while waiting; distlock logs one warning when Redis refuses its first
//! `SUBSCRIBE`. A user without some right on that list gets [`LockError::Misconfigured`];
//! [`LockManager::ping`] checks the first line's rights at startup.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acquire;
mod builder;
mod conn;
mod context;
mod error;
mod fair;
mod fence;
mod keys;
mod lease;
mod manager;
mod notify;
mod reentrancy;
mod release;
mod renew;
mod request;
mod scripts;
mod validity;
mod wait;

pub use builder::LockManagerBuilder;
pub use error::{LockError, Misconfiguration};
pub use fair::HANDOFF_CLAIM;
pub use lease::Lease;
pub use manager::{default_manager, set_default_manager, LockManager, LockStats};
pub use reentrancy::{current_fencing_token, current_lease, CurrentLease};
pub use request::LockRequest;
pub use validity::{MAX_TTL, MIN_TTL};

/// Re-exported so callers can build a pool with the same deadpool-redis version.
pub use deadpool_redis;

pub use distlock_macros::distributed_lock;

#[doc(hidden)]
pub mod __private;

/// The bound on an annotated fn's return type, re-exported at the root only so that compile
/// errors name it without the private path. Not part of the API.
#[doc(hidden)]
pub use __private::LockResult;

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
