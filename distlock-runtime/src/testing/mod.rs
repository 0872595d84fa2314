//! Throwaway Redis servers for the tests of code that takes locks (cargo feature `testing`).
//!
//! *This module is only compiled with the cargo feature `testing`*: enable it in your
//! `[dev-dependencies]`, so it never reaches a release build:
//!
//! ```toml
//! [dev-dependencies]
//! distlock-runtime = { version = "0.1", features = ["testing"] }
//! ```
//!
//! [`TestRedis::start`] starts a `redis-server` of this machine (else a `valkey-server`) on a
//! free loopback port, with persistence off, waits until it answers, and stops it (by its pid)
//! when the value is dropped; [`TestRedis::manager`] is a [`LockManager`](crate::LockManager)
//! for it. Every test gets a server of its own, so tests run in parallel and never touch a
//! shared Redis. Redis 7.0 or newer, or Valkey, must be installed (`apt-get install
//! redis-server` or `valkey-server`, `brew install redis` or `valkey`); without either, the
//! error says so. [`PROGRAM_ENV`] (`DISTLOCK_REDIS_SERVER`) names another server (distlock's
//! own CI runs its suite so on Redis 8.2 and Valkey 8.1 too), and
//! [`TestRedisBuilder::program`] one for a single server.
//!
//! ```
//! use distlock_runtime::{LockError, LockManager};
//!
//! /// The code under test: books a seat once, whichever instance of the service is asked.
//! async fn book(locks: &LockManager, seat: u32) -> Result<bool, LockError> {
//!     locks.lock(format!("seat:{seat}")).run(async { true }).await
//! }
//!
//! # // A doc-test runs no #[test] function: this one becomes a plain fn that `main` calls.
//! # mod tokio { pub use ::tokio::*; pub use ::tokio::main as test; }
//! #[tokio::test]
//! async fn a_seat_is_booked_under_its_lock() -> Result<(), Box<dyn std::error::Error>> {
//!     use distlock_runtime::testing::TestRedis;
//!
//!     let redis = TestRedis::start().await?;
//!     let locks = redis.manager();
//!     assert!(book(&locks, 7).await?);
//!
//!     // While another holder has the seat, a try-lock gets nowhere.
//!     let held = locks.lock("seat:7").acquire().await?;
//!     let busy = locks.lock("seat:7").wait(std::time::Duration::ZERO).run(async {}).await;
//!     assert!(matches!(busy, Err(LockError::NotAcquired { .. })));
//!     held.release().await?;
//!     Ok(())
//! }
//! # fn main() { a_seat_is_booked_under_its_lock().unwrap() }
//! ```
//!
//! Annotated fns without `manager = ...` use the default manager. Tests run in parallel in one
//! process, so give each test's future its own with
//! [`with_default_manager`](crate::with_default_manager) rather than installing one for the
//! whole process with [`set_default_manager`](crate::set_default_manager):
//!
//! ```
//! use distlock_runtime::{distributed_lock, with_default_manager, LockError};
//!
//! #[distributed_lock("seat:{seat}", wait = 0)]
//! async fn book(seat: u32) -> Result<u32, LockError> {
//!     Ok(seat)
//! }
//!
//! # mod tokio { pub use ::tokio::*; pub use ::tokio::main as test; }
//! #[tokio::test]
//! async fn booking_uses_this_tests_server() -> Result<(), Box<dyn std::error::Error>> {
//!     let redis = distlock_runtime::testing::TestRedis::start().await?;
//!     with_default_manager(redis.manager(), async {
//!         assert_eq!(book(7).await?, 7); // locked on this test's server
//!         let held = redis.manager().lock("seat:7").acquire().await?;
//!         assert!(matches!(book(7).await, Err(LockError::NotAcquired { .. })));
//!         held.release().await
//!     })
//!     .await?;
//!     Ok(())
//! }
//! # fn main() { booking_uses_this_tests_server().unwrap() }
//! ```
//!
//! Beside one server: [`TestCluster`] (a Redis Cluster, created with `redis-cli`),
//! [`TestSentinel`] (a primary, its replicas and sentinels) and [`TestQuorum`] (independent
//! servers for a quorum), each with a manager for it and the faults a test may want to cause:
//! a server paused ([`TestRedis::pause`]), killed, restarted empty; a cluster's or a Sentinel
//! group's primary killed, and a wait for the failover. Each stops all its processes when
//! dropped, and removes the files they used.
//!
//! The `start` functions wait off the async runtime's threads; each has a `start_blocking`
//! twin for tests without a runtime. Everything else blocks the calling thread, mostly for
//! milliseconds: a wait for a failover blocks until it happened, so call it from
//! [`tokio::task::spawn_blocking`] when the code under test must run meanwhile on a
//! current-thread runtime.
//!
//! distlock's own test suite runs on these servers.

mod cluster;
mod error;
mod program;
mod quorum;
mod resp;
mod sentinel;
mod server;

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use cluster::TestCluster;
pub use error::TestRedisError;
pub use program::PROGRAM_ENV;
pub use quorum::TestQuorum;
pub use sentinel::TestSentinel;
pub use server::{TestRedis, TestRedisBuilder};

/// A loopback port nothing listens on now (the kernel's choice of a free port). Another
/// process may take it before the caller binds it: the test servers try again on another.
///
/// # Errors
/// When no loopback port can be bound.
pub fn free_port() -> std::io::Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
}

/// Runs the blocking `work` on Tokio's blocking threads, so an async caller's runtime thread
/// (the only one of a current-thread runtime) goes on serving its other tasks.
async fn off_the_runtime<T, F>(work: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}

/// Polls `check` every `poll` until it gives `Ok`, and returns that; after `within`,
/// [`TestRedisError::NotReady`] with `what` and the last `Err` (what was still missing).
fn wait_for<T>(
    within: Duration,
    what: &str,
    poll: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> Result<T, TestRedisError> {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(done) => return Ok(done),
            Err(missing) if Instant::now() >= deadline => {
                return Err(TestRedisError::NotReady {
                    what: what.to_owned(),
                    within,
                    missing,
                })
            }
            Err(_) => std::thread::sleep(poll),
        }
    }
}

/// A path in the temp dir no other process or call uses: `distlock-<kind>-<pid>-<port>-<n>.conf`.
fn unique_temp_file(kind: &str, port: u16) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    std::env::temp_dir().join(format!("distlock-{kind}-{pid}-{port}-{n}.conf"))
}

/// A free port, or the error saying none could be bound.
fn free_port_or_error() -> Result<u16, TestRedisError> {
    free_port().map_err(|source| TestRedisError::Io {
        what: "bind a free loopback port".to_owned(),
        source,
    })
}
