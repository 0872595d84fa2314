//! Distributed locks on Redis for async Rust.
//!
//! One attribute makes an async fn run under a lease held in Redis: taken atomically (one Lua
//! script, one round trip when free), released only by its owner, extended in the background
//! while the body runs, with a fencing token that increases on every acquisition.
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
//! distlock needs Redis 7.0 or newer (the single-key acquire uses `SET ... NX GET`).
//!
//! # Guarantees
//! - Mutual exclusion per key while leases are valid. A lease's validity is counted from before
//!   its request was sent, less a clock-drift margin, so this process gives up a lease before
//!   Redis expires it.
//! - A lock is only released or extended by its owner (a random 128-bit token compared in Lua).
//!   Renewal never re-creates a lock that is gone.
//! - Fencing tokens strictly increase per key across all clients of one Redis, also after expiry:
//!   one counter per key prefix (`{prefix}fence`) draws them, so no key is left behind per lock
//!   name. The counter must survive: a Redis that restarts without persistence, or evicts it
//!   under an `allkeys-*` maxmemory policy, starts the tokens again from 1.
//! - No lock outlives its ttl after its holder dies.
//! - Every Redis call is bounded by the manager's timeouts: a Redis that is down or hung is an
//!   error, never a hang. A call that timed out while acquiring is treated as "maybe acquired"
//!   and released by token.
//! - No connection is held while a body runs.
//! - Waiters are woken by release notifications (`PUBLISH` from the release script, one
//!   subscriber connection per manager, one local waiter woken per release, oldest first), and
//!   also at the holder's expiry; a lost notification costs latency, never a hang. A manager
//!   built on a caller's pool has no client to subscribe with: its waiters poll with backoff.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod conn;
mod error;
mod lease;
mod manager;
mod notify;
mod reentrancy;
mod renew;
mod scripts;
mod wait;

pub use error::LockError;
pub use lease::Lease;
pub use manager::{
    default_manager, set_default_manager, LockManager, LockManagerBuilder, LockRequest, LockStats,
    HANDOFF_CLAIM, MAX_TTL, MIN_TTL,
};
pub use reentrancy::{current_fencing_token, current_lease, CurrentLease};

/// Re-exported so callers can build a pool with the same deadpool-redis version.
pub use deadpool_redis;

pub use distlock_macros::distributed_lock;

#[doc(hidden)]
pub mod __private;

/// The README's examples, compiled as doc-tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
