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
//! distlock needs Redis 7.0 or newer, or Valkey (its scripts declare themselves with `#!lua`,
//! and the single-key acquire uses `SET ... NX GET`); `docs/operations.md` ("Servers") in the
//! repository lists the servers its tests run on.
//!
//! # Cargo features
//! | feature | default | what it adds | what it costs |
//! |---|---|---|---|
//! | `metrics` | on | counters and histograms through the [`metrics`](https://docs.rs/metrics) facade (see [Metrics and traces](#metrics-and-traces)) | three small crates to build (`metrics`, `rapidhash`, `rustversion`); at run time next to nothing until the application installs a recorder |
//! | `axum` | off | `impl axum::response::IntoResponse for LockError`: a handler returns `Result<T, LockError>` and a lock failure answers 409, 503 or 500 by its class (see [`LockError`]'s `IntoResponse` impl) | `axum-core` and `http`, which an axum 0.8 application builds already |
//! | `testing` | off | the module `testing`: throwaway `redis-server` processes for tests (see [Testing your code](#testing-your-code)); for `[dev-dependencies]` | no dependency; needs `redis-server` 7.0+ (and `redis-cli` for a cluster) installed where tests run |
//!
//! With `default-features = false`, distlock reports no metrics and does not depend on
//! `metrics`; its `tracing` spans stay. Everything else but `axum` and `testing` is always
//! compiled in.
//! Its dependencies are built with their default features off and only these on:
//!
//! | dependency | features | what for |
//! |---|---|---|
//! | `redis` | `aio`, `tokio-comp`, `tokio-rustls-comp`, `script` | async connections on Tokio, TLS for `rediss://` URLs (rustls, trusting the system's root CAs through `rustls-native-certs`), and Lua scripts (distlock routes a cluster by itself) |
//! | `rustls` | `ring`, `std`, `tls12` | the crypto provider distlock installs for TLS when none is (ring builds with a C compiler alone), and TLS 1.2 beside 1.3; see [`LockManagerBuilder::tls_ca_pem`] |
//! | `deadpool-redis` | `rt_tokio_1` | the connection pool of a one-server manager, also [`LockManagerBuilder::pool`] |
//! | `tokio` | `rt`, `time`, `sync`, `macros` | renewal and release tasks, timeouts: locks are taken on a Tokio runtime |
//! | `axum-core`, `http` (feature `axum`) | `std` (`http`'s) | `IntoResponse` and the response's status and headers |
//!
//! # Guarantees
//! Mutual exclusion per key while leases are valid (an exclusive holder alone, readers only
//! beside readers, at most N holders of a semaphore; a request's keys all taken or none), under
//! an assumption about Redis's clock; a lock released or extended only by its owner's random
//! token; [fencing tokens](#fencing-tokens) that rise per key, also after Redis lost its data; no
//! lock outliving its ttl after its holder dies; every Redis call and every wait bounded by the
//! manager's timeouts; no connection held while a body runs; re-entrancy for strict nesting
//! only (see [`LockRequest::run`]); and every manager serving again by itself after any fault.
//! `docs/guarantees.md` in the repository states each claim in full, with its assumptions and
//! its bounds on each topology, and the repository's `tests/README.md` names the tests that
//! prove it.
//!
//! An operator's [`LockManager::force_release`] breaks exclusion on purpose, and tells the
//! holders: each holder's manager ends its lease at once ([`Lease::lost`] resolves, `run` and
//! annotated calls return [`LockError::LeaseLost`] within milliseconds), not at its next
//! renewal, where it can hear it (a manager with a subscriber connection and channel rights).
//!
//! # When Redis fails, or refuses
//! Every [`LockError`] is in one of four classes ([`LockError::class`]): **contention**,
//! **unavailable**, **misconfigured** and **a bug in the caller**; [`ErrorClass`] says what to
//! do about each, and the HTTP status that answers it.
//!
//! **Recovery.** A manager serves again by itself once the deployment is whole: its
//! connections, a cluster's slot map and its subscriber connections replace themselves, and
//! background releases are bounded ([`LockStats::background_releases`]). `docs/reliability.md`
//! in the repository says what heals how, and the times the fault tests measure.
//!
//! **Redis errors.** One classification serves for a command and for a script alike: an error
//! raised inside a script becomes the same [`LockError`] as outside one.
//!
//! | Redis error | becomes | sent again? |
//! |---|---|---|
//! | `NOPERM` (inside a script, an `ERR` in each server's words: Redis 7.0 `The user executing the script can't ...`, Redis 7.2+ and Valkey `ACL failure in script: ...`) | [`LockError::Misconfigured`] with [`Misconfiguration::Permissions`]; names the command (from the error, or on Redis 7.0 the script's line), the key pattern or the channel pattern, and the `ACL SETUSER` words that grant it | no |
//! | `ERR unknown command` (a proxy or managed service that does not offer a command: `CLUSTER` behind a cluster proxy, `WAIT` on serverless offerings) | `Misconfigured`, [`Misconfiguration::Unsupported`], naming the command and what to configure instead (`.url` behind a proxy, no `min_replicas`); a lock whose `WAIT` was refused is undone | no |
//! | `NOAUTH`, `WRONGPASS` | `Misconfigured`, [`Misconfiguration::Credentials`] | no (a background release keeps trying: a password may be rotating) |
//! | `READONLY` | one server or a quorum node: sent once more on a fresh connection, then `Misconfigured`, [`Misconfiguration::Replica`]; Sentinel: the primary is asked for again and it is sent there once, then [`LockError::Redis`]; cluster: the slot map is fetched again and it is sent again within the response timeout, then `Redis` | as said |
//! | `OOM` | [`LockError::Redis`], whose message names maxmemory (a release still runs: it frees memory) | no |
//! | `LOADING`, `BUSY`, `MASTERDOWN` | sent again 20 ms apart within the response timeout, then `Redis`, saying which | yes |
//! | `NOSCRIPT` | never seen: the script is sent whole (`EVAL`) | once |
//! | `WRONGTYPE` | [`LockError::WrongType`], naming the key and what it holds (another program wrote under the prefix) | no |
//! | `CLUSTERDOWN`, `TRYAGAIN` | sent again 20 ms apart within the response timeout, the slot map fetched anew, then `Redis` | yes |
//! | `WAIT` (with `min_replicas`) answered by fewer replicas than required | [`LockError::Replication`]: an acquire that took its keys is undone and fails at once; a wait or try-lock whose last attempt found a key held ends with it too, never `Timeout` or `NotAcquired` (the holder may be an acquire waiting for its own replicas); an extension is not counted | no (renewal tries again) |
//! | `MOVED`, `ASK` | cluster: followed: `MOVED` to the slot's new owner (its slot corrected at once, the map fetched anew), `ASK` once to the importing node, after `ASKING`; one server, a quorum node, a Sentinel primary: `Misconfigured`, [`Misconfiguration::ClusterNode`] (the URL names a cluster node: use [`LockManagerBuilder::cluster`]), naming the node | cluster: yes; elsewhere no |
//! | `CROSSSLOT`, and `ERR SELECT is not allowed in cluster mode` (a URL's database) | one server, a quorum node, a Sentinel primary: `Misconfigured`, [`Misconfiguration::ClusterNode`], as above (a cluster never sends keys of two slots in one call) | no |
//! | no answer in time, a broken or refused connection | [`LockError::RedisTimeout`] / `Redis`; a request on a connection that died idle is sent once more on a fresh one | as said |
//!
//! A release that fails ([`Lease::release`], `run`'s after its body, a lease dropped) is
//! retried in the background while the failure is one that passes (the rows sent again above,
//! no answer in time, a broken connection, `READONLY` during a failover, a refused password),
//! until the keys are gone or their ttl has passed; [`Lease::release`] still returns its error.
//!
//! [`LockManager::ping`] checks everything a lock needs, on every server that holds locks,
//! before the first lock does; [`LockManager::servers`] says which server software and version
//! answered.
//!
//! # Fencing tokens
//! A holder paused past its lease (GC, `SIGSTOP`, a suspended host or VM) can still send a write
//! after another holder took the lock. No lock can prevent that; storage can. Pass the lease's
//! fencing token with every write, and have the storage refuse a token smaller than the
//! greatest it has seen for the resource: a paused holder's late write is then refused instead
//! of corrupting the newer holder's work. In an annotated fn, `lease = lease` puts the lease in
//! the body; by hand, [`Lease::fencing_token`]; anywhere inside a body, [`current_lease`] (or
//! [`current_fencing_token`] for one key of several leases).
//!
//! ```no_run
//! use distlock_runtime::{distributed_lock, LockError};
//! # struct Db; impl Db { async fn set_stock(&self, _: &str, _: u32, _: u64) -> Result<(), LockError> { Ok(()) } }
//!
//! #[distributed_lock("stock:{sku}", lease = lease)]
//! async fn restock(db: &Db, sku: &str, units: u32) -> Result<(), LockError> {
//!     // `db` keeps the greatest token it has seen per SKU and refuses a smaller one.
//!     db.set_stock(sku, units, lease.fencing_token()).await
//! }
//! ```
//!
//! `docs/guarantees.md` in the repository ("Fenced storage") has the storage's side as code to
//! copy, one Lua script on a Redis hash (the seckill example does the same).
//!
//! Tokens strictly increase per key across all clients, also after an expiry and after Redis
//! lost its data (a restart without persistence, a failover to a replica that missed writes); a
//! lease on several keys has one token, greater than every earlier token of each of its keys.
//! How they are drawn, the clock assumption that goes with it, and their range (exact in
//! JavaScript numbers): `docs/guarantees.md` in the repository.
//!
//! # Fair locks
//! A request for one key is fair by default: its waiters queue in Redis, and a release hands
//! the lock straight to the oldest live waiter. Under contention that gives every waiter its
//! turn and starts the next holder without an acquire round trip, which is why it is the
//! default; its price is that a waiter whose process crashed while queued holds the queue up for
//! a while ([`HANDOFF_CLAIM`]). Turn it off per request with `fair = false` or
//! [`LockRequest::fair`]`(false)`, or for a manager with
//! [`LockManagerBuilder::default_fair`]`(false)`. `docs/fair.md` in the repository says which
//! requests can be fair, when to choose which, and how the queue, the hand-off, its claim and
//! its signature work.
//!
//! # Read-write locks and semaphores
//! A key is held exclusively, shared, or as one of N permits ([`LockMode`]): `read = ..` on the
//! attribute and [`LockManager::read_lock`] / [`LockRequest::read_keys`] take keys shared,
//! `permits = N` and [`LockRequest::permits`] make a key a semaphore. Each holder has a lease of
//! its own (token, ttl, renewal, fencing token), so a crashed reader's share frees itself at its
//! own expiry. Inside a body holding a key shared, an exclusive call for it fails at once with
//! [`LockError::UpgradeNotSupported`].
//!
//! ```no_run
//! # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
//! // Readers of a product run side by side; its restock waits for them, and they for it.
//! let offer = locks.read_lock("product:7").run(async { (42, 3) }).await?;
//! locks.lock("product:7").run(async { /* write price, then stock */ }).await?;
//! // A report written from two inputs read shared: the three keys taken together.
//! locks.lock("report:7").read_keys(["sales:7", "stock:7"]).run(async {}).await?;
//! // No more than 8 exports at a time in the fleet.
//! locks.lock("exports").permits(8).run(async {}).await?;
//! # let _ = offer;
//! # Ok(()) }
//! ```
//!
//! `docs/modes.md` in the repository says how readers, writers and permits are served in
//! arrival order, what unfair requests do, and how each topology holds them.
//!
//! # Nesting and lock order
//! A `run` body or annotated fn that asks for a key its task already holds re-enters it (see
//! [`LockRequest::run`]). Nested locks on different keys are checked for their order
//! ([`LockOrder`]): a nesting that deadlocks with one taken the other way round before logs a
//! warning (the default), or, under [`LockOrder::Fail`] (the testing helpers' managers), fails
//! at once with [`LockError::LockOrderInversion`].
//!
//! # Leader election
//! [`LockManager::election`] elects one leader per name across the fleet: [`Election::run`]
//! serves for the process's life, calling its function with a [`Term`] while this candidate
//! leads and stopping it when the term is lost, and another candidate takes over when a term
//! ends. [`Election::leader`] and [`Election::watch`] tell anyone who leads. A term is a renewed
//! lease on the key `election:NAME`, with its guarantees: at most one valid term at a time, and
//! a fencing token above every earlier term's. The repository's `docs/elections.md` says who
//! takes over and how fast, after a resignation, a crash or a cut, and what waiting candidates
//! cost.
//!
//! ```no_run
//! # async fn tick(_fencing_token: u64) {}
//! # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
//! let never = locks
//!     .election("scheduler")
//!     .run(|term| async move { loop { tick(term.fencing_token()).await } })
//!     .await;
//! # let _ = never;
//! # Ok(()) }
//! ```
//!
//! # Testing your code
//! With the cargo feature `testing`, the module `distlock_runtime::testing` starts throwaway
//! `redis-server` processes for tests, each test its own, so tests run in parallel: `TestRedis`
//! one server, `TestCluster`, `TestSentinel` and `TestQuorum` the other topologies. The
//! module's docs say what each starts and how it stops, what must be installed, the faults a
//! test can cause (a server paused, killed or restarted empty, a primary killed), and how to
//! choose the server that runs. Enable the feature for tests only:
//!
//! ```toml
//! [dev-dependencies]
//! distlock-runtime = { version = "0.1", features = ["testing"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! An axum handler (with the feature `axum`, a `LockError` answers 409, 503 or 500 by itself),
//! and its test as it would sit in the handler's module: the test calls the handler with its
//! extractors, as axum would, on a throwaway server.
//!
#![cfg_attr(all(feature = "testing", feature = "axum"), doc = "```")]
#![cfg_attr(not(all(feature = "testing", feature = "axum")), doc = "```ignore")]
//! use axum::extract::{Path, State};
//! use distlock_runtime::{distributed_lock, LockError, LockManager};
//!
//! /// Books a seat, once across every instance of the service; a seat being booked by another
//! /// instance answers 409 at once.
//! #[distributed_lock("seat:{seat}", manager = &locks, wait = 0)]
//! async fn book(
//!     State(locks): State<LockManager>,
//!     Path(seat): Path<u32>,
//! ) -> Result<String, LockError> {
//!     Ok(format!("seat {seat} booked"))
//! }
//!
//! # // A doc-test runs no #[test] function: this one becomes a plain fn that `main` calls.
//! # mod tokio { pub use ::tokio::*; pub use ::tokio::main as test; }
//! #[tokio::test]
//! async fn a_seat_is_booked_by_one_instance_at_a_time() -> Result<(), Box<dyn std::error::Error>> {
//!     use axum::response::IntoResponse;
//!     use distlock_runtime::testing::TestRedis;
//!
//!     let redis = TestRedis::start().await?;
//!     // Two instances of the service, each with its own manager.
//!     let (ours, theirs) = (redis.manager(), redis.manager());
//!     assert_eq!(book(State(ours.clone()), Path(7)).await?, "seat 7 booked");
//!
//!     // While the other instance books seat 7, this one is turned away at once, with a 409.
//!     let booking = theirs.lock("seat:7").acquire().await?;
//!     let busy = book(State(ours.clone()), Path(7)).await.unwrap_err();
//!     assert!(matches!(busy, LockError::NotAcquired { .. }));
//!     assert_eq!(busy.into_response().status(), 409);
//!     booking.release().await?;
//!     assert_eq!(book(State(ours), Path(7)).await?, "seat 7 booked");
//!     Ok(())
//! }
//! # fn main() { a_seat_is_booked_by_one_instance_at_a_time().unwrap() }
//! ```
//!
//! Annotated fns without `manager = ...` use the default manager: give each test's future its
//! own with [`with_default_manager`] (tests run in parallel, each with its own server), as the
//! `testing` module's docs show. `docs/axum.md` in the repository tests two
//! instances of a router over HTTP requests.
//!
//! # Topologies
//! A manager talks to exactly one deployment, chosen on its builder: one server
//! ([`url`](LockManagerBuilder::url) or [`pool`](LockManagerBuilder::pool)), a Sentinel-named
//! primary ([`sentinel`](LockManagerBuilder::sentinel)), a Redis Cluster
//! ([`cluster`](LockManagerBuilder::cluster)) or a Redlock quorum of independent primaries
//! ([`quorum`](LockManagerBuilder::quorum)), with replica acknowledgement on request
//! ([`min_replicas`](LockManagerBuilder::min_replicas)); two, or none, is
//! [`LockError::InvalidConfig`]. The attribute and every request work the same on each. For a
//! URL that comes from outside (an operator's `REDIS_URL`), [`LockManagerBuilder::probe`] asks
//! its server whether it is one server, a cluster node or a Sentinel ([`ServerKind`]); a
//! manager built with [`url`](LockManagerBuilder::url) for a cluster node fails its first call
//! for a key of another node's slot with [`Misconfiguration::ClusterNode`], never as an outage.
//! `docs/topologies.md` in the repository says what each deployment guarantees and what it does
//! not, the server-side settings, Redlock's restart rule, how keys map to cluster slots (and how
//! a template chooses one), and what each costs.
//!
//! # Architecture
//! Each file holds one idea:
//!
//! | file | what |
//! |---|---|
//! | `manager.rs`, `builder.rs`, `request.rs`, `lease.rs`, `mode.rs` | the public entry points, their settings, a held lease, and the modes a key is held in |
//! | `acquire/mod.rs` | the acquire loop: what a request asks ([`LockRequest`] becomes one `Ask`), where it stands (attempting, waiting, holding), and what it may have left in Redis if it ends without a lease |
//! | `acquire/places.rs` | taking a request's keys where they live: every shard in turn (one server, Sentinel, a cluster's slots), the greatest fencing token written back, what was taken undone; on a quorum, its round (`topology/quorum.rs`) |
//! | `fair/` | the fair hand-off protocol, end to end: its Lua (the queue served in arrival order, readers, writers and permits alike: `admit.lua`), its message and signature, the requester's side and the waiter's, and which of a process's fair waiters watches the holder for the others |
//! | `wait.rs`, `notify/` | how a waiter learns when to try again: release notifications, one subscriber connection per manager, each key's subscription a pure state machine (`notify/channel.rs`); the notifier knows no fair rule |
//! | `release.rs`, `background.rs` | releasing by token, and the one bounded background release |
//! | `renew.rs`, `validity.rs` | the watchdog that extends leases, and how long a lease is trusted |
//! | `reentrancy.rs`, `context.rs`, `keys.rs`, `fence.rs` | nesting on one task, what every part of a manager shares, the Redis keys of a lock, the fencing write-back |
//! | `scripts/` | the Lua Redis runs, one `.lua` file per script or shared function (`holders.lua`: a key's shared and permit holders), composed at compile time; the flags sent to them as types; the builders of their calls |
//! | `call.rs`, `failed.rs` | a script call (its script, keys, arguments, and what `min_replicas` asks of it), and how far a failed one got |
//! | `topology/` | where locks live: one `Deployment`, whose operations (acquire, release, extend, inspect) each read their reply once into a type; one primary (`one.rs`, `sentinel.rs`) or a cluster (`cluster.rs`) hold each key on one server, a quorum (`quorum.rs`, the only file that knows one) on a majority; over `link.rs` (one server's connection), `connect.rs` (URLs, dialling, pools) and `replicas.rs` (`min_replicas`) |
//! | `error.rs`, `refusal.rs`, `diagnose.rs`, `inspect.rs`, `telemetry.rs`, `tls.rs` | errors and what a refusal means, `ping`, inspection, metrics, TLS |
//! | `sync.rs`, `time.rs`, `ids.rs` | a mutex lock that ignores poisoning, durations as Redis takes them, owner tokens and unique ids |
//!
//! One acquire of `order:42`: the request renders the Redis keys (`keys.rs`), registers the
//! lease with the watchdog, and takes the keys where the deployment says they live: one script
//! call to the server (one server, Sentinel) or to the slot's primary (cluster), or the same
//! call to every node at once (quorum). A held key makes the request wait (`wait.rs`) for the
//! release announcement on the key's channel, then try again. Adding a topology is adding a
//! file under `topology/`, a variant of `Grant` or `Serial` (the compiler then names every
//! operation it must say how to run) and a builder method.
//!
//! # Metrics and traces
//! With the cargo feature `metrics` (on by default), distlock reports through the
//! [`metrics`](https://docs.rs/metrics) facade to whatever recorder the application installs
//! (Prometheus, StatsD, ...); without a recorder they cost next to nothing, and without the
//! feature nothing at all.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `distlock_acquisitions_total` | counter | `template`, `mode`, `outcome` | acquire requests by outcome: `acquired` (at once), `contended` (after waiting), `timed_out`, `not_acquired` (a try-lock that found it held), `error` |
//! | `distlock_wait_seconds` | histogram | `template`, `mode` | time from asking to holding (acquired and contended) |
//! | `distlock_hold_seconds` | histogram | `template`, `mode` | time a `run` body held the lock |
//! | `distlock_leases_lost_total` | counter | `template`, `mode` | leases lost while their body ran |
//! | `distlock_handoffs_total` | counter | `template`, `mode` | fair leases handed over by a release |
//! | `distlock_renewals_total` | counter | `outcome` (`ok`, `failed`) | renewal round trips |
//! | `distlock_subscriber_reconnects_total` | counter | | subscriber connections opened after the first |
//! | `distlock_lock_order_inversions_total` | counter | | nested requests that took two lock classes in the order opposite to one seen before (see [`LockOrder`]) |
//! | `distlock_terms_started_total` | counter | `election` | terms of an [`Election`] this process began leading |
//! | `distlock_terms_lost_total` | counter | `election` | terms lost while held (renewal failed past the validity, or the key was taken or force-released); a resigned or dropped term is not lost |
//!
//! `template` is the attribute's key template (`order:{order_id}`), or the label given to
//! [`LockRequest::metrics_label`] (`election` for an election's requests), else `manual`: never a
//! rendered key, which would make one series per order. `mode` is how the request holds its keys:
//! `exclusive`, `shared`, `permits`, or `mixed`. `election` is the election's name (a role, few
//! per fleet).
//!
//! Every `run` (and annotated call) runs in a `debug` span named `distlock` with the fields
//! `template`, `keys`, `fencing_token` and `outcome` (`ok`, `lease_lost`, `timed_out`,
//! `not_acquired`, `error`).
//!
//! # Least-privilege ACL user
//! distlock works under a Redis ACL user that may touch only the keys under the manager's prefix
//! (`distlock:` by default) and run only the commands it uses: `EVALSHA` (and `EVAL`, which a server that lost a script is sent once) for
//! its scripts, the commands those scripts call, and `SELECT` for the URL's database (redis-rs
//! also sends `CLIENT SETINFO` when it connects, and ignores a refusal). Release notifications (`PUBLISH` from the
//! scripts, `SUBSCRIBE` on a connection of their own) are optional. With the default prefix:
//!
//! ```text
//! ACL SETUSER distlock on >CHANGE-ME resetkeys ~distlock:* resetchannels -@all +evalsha +eval +select +del +exists +get +hdel +hget +hlen +hset +lindex +llen +lpop +lrem +pexpire +pexpireat +pttl +rpush +set +time +zadd +zcard +zcount +zrange +zrem +zremrangebyscore +zscore
//! ACL SETUSER distlock &distlock:* +publish +subscribe +unsubscribe
//! ```
//!
//! The first line is all distlock needs, and exactly what [`LockManager::ping`] requires (a
//! unit test holds it to the commands every script runs); the second adds notifications. Without them, releases
//! and hand-offs still succeed (the scripts skip an announcement Redis refuses), and waiters
//! poll with backoff (1 to 50 ms), so a released key is still taken within milliseconds, at the
//! cost of more requests while waiting; distlock logs one warning when Redis refuses its first
//! `SUBSCRIBE`. A user without some right on that list gets [`LockError::Misconfigured`],
//! naming what it lacks; [`LockManager::ping`] checks every right at startup (and refuses a user
//! that may subscribe but not publish: its waiters would sleep through every release).
//!
//! Other topologies add a few rights: `+wait` with `min_replicas`; on a Sentinel primary
//! `+role` (the route checks it reached a primary); on a cluster `+cluster|slots` (the route
//! fetches the slot map), `+asking` (a call to a slot being migrated) and, for notifications,
//! `+spublish +ssubscribe +sunsubscribe` beside the plain ones (a forced release is told to
//! its holders on a plain channel, which a cluster carries to every node). A managed service may refuse
//! some of these whatever the ACL says, and the error then says what to configure instead;
//! `docs/operations.md` ("Servers") in the repository lists what each service is known to
//! refuse.
#![forbid(unsafe_code)]
// On docs.rs: each item behind a cargo feature says which one.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod acquire;
#[cfg(feature = "axum")]
mod axum;
mod background;
mod builder;
mod call;
mod catalog;
mod context;
mod diagnose;
mod election;
mod error;
mod failed;
mod fair;
mod fence;
mod forced;
mod ids;
mod inspect;
mod keys;
mod lease;
mod manager;
mod mode;
mod notify;
mod order;
mod reentrancy;
mod refusal;
mod release;
mod renew;
mod request;
mod retry;
mod scripts;
mod sync;
mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod time;
mod tls;
mod topology;
mod validity;
mod wait;

pub use builder::LockManagerBuilder;
pub use diagnose::{ServerInfo, ServerProduct};
pub use election::{Election, LeaderInfo, Term};
pub use error::{ErrorClass, LockError, Misconfiguration};
pub use fair::HANDOFF_CLAIM;
pub use forced::{ForcedRelease, ForcedReleases};
pub use inspect::{LockInfo, Owner};
pub use lease::Lease;
pub use manager::{
    default_manager, set_default_manager, with_default_manager, LockManager, LockStats,
};
pub use mode::LockMode;
pub use order::LockOrder;
pub use reentrancy::{current_fencing_token, current_lease, CurrentLease};
pub use request::LockRequest;
pub use topology::ServerKind;
pub use validity::{MAX_TTL, MIN_TTL};

/// Re-exported so callers can build a pool with the same deadpool-redis version.
///
/// ```no_run
/// use distlock_runtime::deadpool_redis::{Config, Runtime};
///
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = Config::from_url("redis://127.0.0.1:6379").create_pool(Some(Runtime::Tokio1))?;
/// let locks = distlock_runtime::LockManager::builder().pool(pool).build()?;
/// # Ok(()) }
/// ```
pub use deadpool_redis;

/// Makes an `async fn` run under a distributed lock: the attribute of `distlock-macros`,
/// re-exported. Its reference follows this example.
///
/// ```no_run
/// use distlock_runtime::{distributed_lock, LockError, LockManager};
///
/// #[derive(Debug, thiserror::Error)]
/// enum JobError {
///     #[error(transparent)]
///     Lock(#[from] LockError),
///     #[error("order {0} not found")]
///     NotFound(u64),
/// }
///
/// // Uses the manager installed with `set_default_manager`; tries once (`wait = 0`).
/// #[distributed_lock("invoice:{order_id}", ttl = "2m", wait = 0)]
/// async fn send_invoice(order_id: u64) -> Result<(), JobError> {
///     if order_id == 0 {
///         return Err(JobError::NotFound(order_id));
///     }
///     Ok(())
/// }
///
/// struct Shop {
///     locks: LockManager,
/// }
///
/// impl Shop {
///     // Two keys locked together (all or nothing), on this shop's manager.
///     #[distributed_lock(["stock:{sku}", "wallet:{user_id}"], manager = &self.locks, wait = 1)]
///     async fn buy(&self, sku: &str, user_id: u64) -> Result<u64, LockError> {
///         Ok(distlock_runtime::current_lease().map_or(0, |lease| lease.fencing_token()))
///     }
///
///     // A hot key: first come, first served; no renewal, as the body is short.
///     #[distributed_lock("hits:{name}", manager = &self.locks, fair = true, renew = false)]
///     async fn bump(&self, name: &str) -> Result<(), LockError> {
///         Ok(())
///     }
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let locks = LockManager::from_url("redis://127.0.0.1:6379")?;
///     distlock_runtime::set_default_manager(locks.clone());
///     send_invoice(42).await?;
///     let shop = Shop { locks };
///     shop.buy("sku-1", 7).await?;
///     shop.bump("visits").await?;
///     Ok(())
/// }
/// ```
pub use distlock_macros::distributed_lock;

#[doc(hidden)]
pub mod __private;

/// The bound on an annotated fn's return type, re-exported at the root only so that compile
/// errors name it without the private path. Not part of the API.
#[doc(hidden)]
pub use __private::LockResult;

/// The README's examples, compiled as doc-tests. `README.md` in this crate's directory is a
/// symbolic link to the repository's README, and the published package carries it as a file,
/// so the path holds in both.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
