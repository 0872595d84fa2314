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
//! and the single-key acquire uses `SET ... NX GET`); its tests run on Redis 7.0 and 8.2 and on
//! Valkey 8.1.
//!
//! # Cargo features
//! | feature | default | what it adds | what it costs |
//! |---|---|---|---|
//! | `metrics` | on | counters and histograms through the [`metrics`](https://docs.rs/metrics) facade (see [Metrics and traces](#metrics-and-traces)) | three small crates to build (`metrics`, `rapidhash`, `rustversion`); at run time next to nothing until the application installs a recorder |
//! | `testing` | off | the module `testing`: throwaway `redis-server` processes for tests (see [Testing your code](#testing-your-code)); for `[dev-dependencies]` | no dependency; needs `redis-server` 7.0+ (and `redis-cli` for a cluster) installed where tests run |
//!
//! With `default-features = false`, distlock reports no metrics and does not depend on
//! `metrics`; its `tracing` spans stay. Everything else but `testing` is always compiled in.
//! Its dependencies are built with their default features off and only these on:
//!
//! | dependency | features | what for |
//! |---|---|---|
//! | `redis` | `aio`, `tokio-comp`, `tokio-rustls-comp`, `script` | async connections on Tokio, TLS for `rediss://` URLs (rustls, trusting the system's root CAs through `rustls-native-certs`), and Lua scripts (distlock routes a cluster by itself) |
//! | `rustls` | `ring`, `std`, `tls12` | the crypto provider distlock installs for TLS when none is (ring builds with a C compiler alone), and TLS 1.2 beside 1.3; see [`LockManagerBuilder::tls_ca_pem`] |
//! | `deadpool-redis` | `rt_tokio_1` | the connection pool of a one-server manager, also [`LockManagerBuilder::pool`] |
//! | `tokio` | `rt`, `time`, `sync`, `macros` | renewal and release tasks, timeouts: locks are taken on a Tokio runtime |
//!
//! # Guarantees
//! - Mutual exclusion per key while leases are valid (an exclusive holder alone, readers only
//!   beside readers, at most N holders of a semaphore's N permits). A lease's validity is counted from before
//!   its request was sent, less a clock-drift margin, so this process gives up a lease before
//!   Redis expires it. Redis expires keys by its wall clock: exclusion assumes that a server's
//!   clock does not jump forward while it holds a lease, nor a replica's run ahead of its
//!   primary's (a quorum too: a second majority can form around one node whose clock jumped).
//!   Fencing tokens keep storage in order when it does.
//! - A lock is only released or extended by its owner: a 128-bit token from the operating
//!   system's random source (a uuid v4, never a seeded or forkable generator), compared in Lua.
//!   Renewal never re-creates a lock that is gone.
//! - Fencing tokens strictly increase per key, across all clients, also after expiry and after
//!   Redis lost its data (see [Fencing tokens](#fencing-tokens)).
//! - No lock outlives its ttl after its holder dies (nor a reader's or permit holder's share,
//!   whatever the other holders do), and every key distlock writes expires.
//! - Every Redis call is bounded by the manager's timeouts: a Redis that is down or hung is an
//!   error, never a hang, and every wait ends by its deadline plus at most the attempt then in
//!   flight: one response timeout on one server (the subscriber connection is opened, and keys
//!   subscribed, by background tasks, never by a waiter). With `min_replicas` too: an attempt
//!   waits for its replicas (`WAIT`) no later than half a response timeout past the deadline
//!   (a try-lock, which does not wait, takes up to a response timeout and the replica timeout).
//!   Other topologies' attempts can take longer, still bounded: a request for keys in
//!   several cluster slots takes up to a response timeout per slot; a Sentinel dial asks the
//!   sentinels in turn (a connect and a response timeout each); a quorum round takes at most a
//!   tenth of the ttl (no more than a response timeout), plus a response timeout when its nodes
//!   drew different fencing tokens. A lease lost while its `run` body runs returns [`LockError::LeaseLost`] when the
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
//!   also at the holder's expiry; a lost notification costs latency, never a hang. Only a lock
//!   somebody waits for announces its release: a waiter marks the holder it finds (a `~` before
//!   the token in the lock's value, set by the attempt's own script), and a request that had to
//!   wait takes its keys marked, for the waiters still behind it; a lock nobody waited for is
//!   released with a `GET` and a `DEL`. A manager
//!   built on a caller's pool has no client to subscribe with, and an ACL user may lack channel
//!   rights (see [Least-privilege ACL user](#least-privilege-acl-user)): their waiters poll with
//!   backoff.
//! - Re-entrancy is for strict nesting only: a `run` (or annotated call) nested inside a `run`
//!   body for keys its task already holds runs at once under the outer lease, but calls that
//!   run side by side on one task (`join!`, `select!`, `FuturesUnordered` in the body) are
//!   separate critical sections and never overlap: the first borrows the key until it ends,
//!   the others wait their turn (see [`LockRequest::run`]).
//! - Every manager serves again by itself after any fault, once the deployment is whole (see
//!   [When Redis fails, or refuses](#when-redis-fails-or-refuses)).
//!
//! # When Redis fails, or refuses
//! Every [`LockError`] is in one of four classes ([`LockError::class`], [`ErrorClass`]):
//! **contention** (somebody else holds the lock: HTTP 409), **unavailable** (Redis could not be
//! asked, or could not keep the lease: 503, try again later), **misconfigured** (settings or
//! the deployment are wrong: retrying never helps) and **a bug in the caller** (500 both).
//!
//! **Recovery.** No object is shared by all of a manager's requests that could hang: each
//! server's connection is replaced when it fails or times out, a cluster's slot map is fetched
//! anew (over the node connections, from several nodes at once) whenever an answer shows it
//! stale, subscriber connections are checked with a `PING` every 2 s and replaced, and the
//! background work (releases of dropped leases, renewals) is bounded: at most 10,000 background
//! releases wait per manager ([`LockStats::background_releases`]), at most 8 of them out at once.
//! A fault test suite (`tests/tests/faults.rs`: servers killed, restarted with and without their
//! data, paused; Sentinel and cluster failovers; slot migrations; a whole cluster restarted; a
//! quorum's minority and majority lost) holds every manager of two loaded processes to serving
//! again within 5 s of the deployment being whole; `docs/reliability.md` has the times measured.
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
//! [`LockManager::ping`] checks everything a lock needs before the first lock does, on every
//! server that holds locks: address, TLS, credentials, database, a writable primary of Redis
//! 7.0+ or Valkey, every command every script may run (contended and fair too) on the keys
//! under the prefix, asked of Redis with `redis.acl_check_cmd`, and the commands the topology
//! sends (`WAIT` itself, with `min_replicas`). It logs which server software and version
//! answered; [`LockManager::servers`] returns it.
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
//! A request for one key is fair by default: its waiters queue in Redis, and a release hands
//! the lock to the oldest live waiter, whose body starts when the notification arrives. Turn it
//! off per request with `fair = false` or [`LockRequest::fair`]`(false)`, or for a manager with
//! [`LockManagerBuilder::default_fair`]`(false)`. Requests for several keys, and every request on
//! a quorum or with `min_replicas`, are unfair. A hand-off holds the key for [`HANDOFF_CLAIM`]
//! until its recipient confirms it, so a waiter whose process crashed while queued delays the
//! queue by at most a claim and a quarter. `docs/fair.md` in the repository says when to choose
//! which, and how the queue, the hand-off, its claim and its signature work.
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
//! # Leader election
//! [`LockManager::election`] elects one leader per name across the fleet: [`Election::run`]
//! serves for the process's life, calling its function with a [`Term`] while this candidate
//! leads and stopping it when the term is lost; a leader that dies is replaced within the ttl, one
//! that resigns, stops or panics hands over at once, to the next candidate in arrival order.
//! [`Election::leader`] and [`Election::watch`] tell anyone who leads. A term is a renewed lease
//! on the key `election:NAME`, with its guarantees: at most one valid term at a time, and a
//! fencing token above every earlier term's. The repository's `docs/elections.md` has the
//! timings, and what waiting candidates cost.
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
//! `redis-server` (else `valkey-server`) processes for tests: `TestRedis::start().await` runs
//! one on a free loopback port (persistence off) and stops it when dropped, `manager()` is a
//! manager for it, and `TestCluster`, `TestSentinel` and `TestQuorum` start the other
//! topologies. Each test gets servers of its own, so tests run in parallel. Redis 7.0 or newer,
//! or Valkey, must be installed (the error says how when neither is). Enable the feature for
//! tests only:
//!
//! ```toml
//! [dev-dependencies]
//! distlock-runtime = { version = "0.1", features = ["testing"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! A handler, and its test as it would sit in the handler's module:
//!
#![cfg_attr(feature = "testing", doc = "```")]
#![cfg_attr(not(feature = "testing"), doc = "```ignore")]
//! use distlock_runtime::{distributed_lock, LockError, LockManager};
//!
//! /// Books a seat, once across every instance of the service; a seat being booked by another
//! /// instance is `LockError::NotAcquired` (the caller answers 409).
//! #[distributed_lock("seat:{seat}", manager = locks, wait = 0)]
//! async fn book(locks: &LockManager, seat: u32) -> Result<u32, LockError> {
//!     Ok(seat)
//! }
//!
//! # // A doc-test runs no #[test] function: this one becomes a plain fn that `main` calls.
//! # mod tokio { pub use ::tokio::*; pub use ::tokio::main as test; }
//! #[tokio::test]
//! async fn a_seat_is_booked_by_one_instance_at_a_time() -> Result<(), Box<dyn std::error::Error>> {
//!     use distlock_runtime::testing::TestRedis;
//!
//!     let redis = TestRedis::start().await?;
//!     // Two instances of the service, each with its own manager.
//!     let (ours, theirs) = (redis.manager(), redis.manager());
//!     assert_eq!(book(&ours, 7).await?, 7);
//!
//!     // While the other instance books seat 7, this one is turned away at once.
//!     let booking = theirs.lock("seat:7").acquire().await?;
//!     assert!(matches!(book(&ours, 7).await, Err(LockError::NotAcquired { .. })));
//!     booking.release().await?;
//!     assert_eq!(book(&ours, 7).await?, 7);
//!     Ok(())
//! }
//! # fn main() { a_seat_is_booked_by_one_instance_at_a_time().unwrap() }
//! ```
//!
//! The module's docs list the faults a test can cause (a server paused, killed or restarted
//! empty, a cluster's or a Sentinel group's primary killed) and how to choose the
//! `redis-server` that runs.
//!
//! # Topologies
//! A manager talks to exactly one deployment, chosen on its builder (two, or none, is
//! [`LockError::InvalidConfig`]); the attribute and every request work the same on each. For a
//! URL that comes from outside (an operator's `REDIS_URL`), [`LockManagerBuilder::probe`] asks
//! its server whether it is one server, a cluster node or a Sentinel ([`ServerKind`]); a
//! manager built with [`url`](LockManagerBuilder::url) for a cluster node fails its first call
//! for a key of another node's slot with [`Misconfiguration::ClusterNode`], never as an outage.
//!
//! | builder | what it guarantees | what it does not |
//! |---|---|---|
//! | [`url`](LockManagerBuilder::url) / [`pool`](LockManagerBuilder::pool): one server | everything above, while that server keeps its data | a restart without persistence frees every lock (fencing tokens still rise) |
//! | [`sentinel`](LockManagerBuilder::sentinel) | the primary is followed across failovers: on `READONLY`, a broken connection or `+switch-master`, the command and subscriber connections are replaced | replication is asynchronous: a failover can lose a lock just acquired, and two holders overlap, unless [`min_replicas`](LockManagerBuilder::min_replicas) is set |
//! | [`cluster`](LockManagerBuilder::cluster) | each lock lives in its key's slot; `MOVED`, `ASK` and failovers are followed; keys in several slots are taken slot by slot, all or nothing | the same asynchronous-replication caveat per slot; a multi-slot acquire is not one atomic step (it takes slots in one global order and undoes what it took if a later slot is held) |
//! | [`quorum`](LockManagerBuilder::quorum) | a lock is held when a majority of independent primaries granted it; a minority of nodes down or hung changes nothing | fair requests and semaphores of more than one permit are refused; needs the restart rule below |
//!
//! **Server side.** With Sentinel or a cluster, set `min-replicas-to-write` on the primaries
//! (or [`min_replicas`](LockManagerBuilder::min_replicas) on the manager, which makes each
//! acquire and extend wait for replica acknowledgement with `WAIT`, and undoes an acquire the
//! replicas did not confirm: [`LockError::Replication`]; fair requests are refused with it, as
//! nothing confirms a fair hand-off on the replicas). Persistence (`appendonly yes`) keeps
//! locks across a restart of a single server. A quorum's nodes should be independent machines.
//!
//! **Redlock's restart rule.** A quorum node that crashes and comes back empty forgets the
//! locks it granted, and with it a second majority can form while the first holder still runs.
//! So a crashed node must stay down for at least the longest ttl in use before it rejoins, or
//! run with `appendonly yes` and `appendfsync always`.
//!
//! **Kleppmann's critique** of Redlock is that no lock based on timing can be safe when a
//! holder pauses (GC, a VM or process stop) past its lease, or clocks jump: the holder wakes up
//! believing it holds the lock. distlock does not claim otherwise. Its answer is the fencing
//! token: a quorum lease's token is the greatest any node drew, and it is written back to a
//! majority before the lease is handed out, so every later majority draws a larger one, and
//! storage that checks tokens refuses the paused holder's late write (see
//! [Fencing tokens](#fencing-tokens)). On a cluster, a lease on keys in several slots gets the
//! greatest token its slots drew, written back to the others the same way.
//!
//! **Keys and slots.** All of one lock's keys (the lock, its fencing counter, its fair queue)
//! and its release channel share the lock key's cluster slot, through a hash tag around the
//! key: `distlock:lock:{order:42}`. A template may choose the slot on purpose:
//! `"{{user:{id}}}:wallet"` and `"{{user:{id}}}:cart"` render as `{user:7}:wallet` and
//! `{user:7}:cart`, whose tag is `{user:7`, so the two are locked by one atomic script. Values
//! are escaped and can never choose a slot.
//!
//! **Notifications.** Releases are announced with `PUBLISH` (with `SPUBLISH`, sharded pub/sub in
//! the key's slot, on a cluster), and waiters subscribe, over RESP3 on every topology. When a
//! subscription is lost (a node's connection lost, a slot moved, a Sentinel switch), every
//! waiter that counted on it is woken to try again and subscribes anew; a waiter whose attempt
//! meets the failover itself gets its error, as on one server.
//!
//! **Clocks.** A cluster lease on keys in several slots writes its token (drawn by one node's
//! clock) back to the others' counters; a failover that loses that write (without
//! `min_replicas`) leaves the next token to the new primary's clock, so fencing across slots
//! assumes the nodes' clocks agree within the time between two leases of a key. A quorum does
//! not: any two majorities share a node. And with `cluster-require-full-coverage yes` (Redis's
//! default), a primary lost without a replica to take over stops every slot, so every lease.
//!
//! # Architecture
//! Each file holds one idea:
//!
//! | file | what |
//! |---|---|
//! | `manager.rs`, `builder.rs`, `request.rs`, `lease.rs`, `mode.rs` | the public entry points, their settings, a held lease, and the modes a key is held in |
//! | `acquire/mod.rs` | the acquire loop: what a request asks ([`LockRequest`] becomes one `Ask`), where it stands (attempting, waiting, holding), and what it may have left in Redis if it ends without a lease |
//! | `acquire/places.rs` | taking a request's keys where they live, by one grant rule: every shard in turn (one server, Sentinel, a cluster's slots) or a majority of a quorum's nodes at once; the greatest fencing token written back, what was taken undone |
//! | `fair/` | the fair hand-off protocol, end to end: its Lua (the queue served in arrival order, readers, writers and permits alike: `admit.lua`), its message and signature, the requester's side and the waiter's |
//! | `wait.rs`, `notify/` | how a waiter learns when to try again: release notifications, one subscriber connection per manager, each key's subscription a pure state machine (`notify/channel.rs`) |
//! | `release.rs`, `background.rs` | releasing by token, and the one bounded background release |
//! | `renew.rs`, `validity.rs` | the watchdog that extends leases, and how long a lease is trusted |
//! | `reentrancy.rs`, `context.rs`, `keys.rs`, `fence.rs` | nesting on one task, what every part of a manager shares, the Redis keys of a lock, the fencing write-back |
//! | `scripts/` | the Lua Redis runs, one `.lua` file per script or shared function (`holders.lua`: a key's shared and permit holders), composed at compile time; the flags sent to them as types; the builders of their calls |
//! | `call.rs`, `failed.rs` | a script call (its script, keys, arguments and kind), and how far a failed one got |
//! | `topology/` | how a call reaches Redis: one `Route` per kind of deployment (`standalone.rs`, `sentinel.rs`, `cluster.rs`, `quorum.rs`), over `link.rs` (one server's connection), `connect.rs` (URLs, dialling, pools) and `replicas.rs` (`min_replicas`) |
//! | `error.rs`, `refusal.rs`, `diagnose.rs`, `inspect.rs`, `telemetry.rs`, `tls.rs` | errors and what a refusal means, `ping`, inspection, metrics, TLS |
//! | `sync.rs`, `time.rs`, `ids.rs` | a mutex lock that ignores poisoning, durations as Redis takes them, owner tokens and unique ids |
//!
//! One acquire of `order:42`: the request renders the Redis keys (`keys.rs`), registers the
//! lease with the watchdog, and takes the keys where the route says they live: one script call
//! to the server (standalone, Sentinel) or to the slot's primary (cluster), or the same call to
//! every node at once (quorum). A held key makes the request wait (`wait.rs`) for the release
//! announcement on the key's channel, then try again. Adding a topology is adding a file under
//! `topology/` and a builder method.
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
//! ACL SETUSER distlock on >CHANGE-ME resetkeys ~distlock:* resetchannels -@all +evalsha +eval +select +del +exists +get +hdel +hget +hlen +hset +lindex +llen +lpop +lrem +pexpire +pttl +rpush +set +time +zadd +zcard +zcount +zrange +zrem +zremrangebyscore +zscore
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
//! `+spublish +ssubscribe +sunsubscribe` instead of the plain ones. Where a managed service
//! refuses one of these whatever the ACL says (`CLUSTER` behind a cluster proxy, `WAIT` on
//! serverless offerings), the error says what to configure instead: `.url` for the proxy, no
//! `min_replicas` (`docs/operations.md`, "Servers", lists what each service is known to
//! refuse).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acquire;
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
mod ids;
mod inspect;
mod keys;
mod lease;
mod manager;
mod mode;
mod notify;
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
pub use inspect::{LockInfo, Owner};
pub use lease::Lease;
pub use manager::{default_manager, set_default_manager, LockManager, LockStats};
pub use mode::LockMode;
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
