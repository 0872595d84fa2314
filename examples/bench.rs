//! The benchmark program: `cargo run --release --example bench -- <scenario> [options]`.
//!
//! Scenarios (each prints a table; `--json` prints one JSON line instead):
//! - `raw`: the floor. `SET NX PX` + an owner-checked delete script, sequential, on the same
//!   client and connection type distlock uses (one redis-rs multiplexed connection).
//! - `uncontended`: one task, `acquire` + `release` on one key (fencing token included), with
//!   `fair(false)`.
//! - `uncontended-fair`: the same with `fair(true)` (the default).
//! - `shared`, `shared-fair`: the same two with the key held shared (`read_lock`).
//! - `permit`, `permit-fair`: the same two with the key held as one of 1 permit (`permits(1)`).
//! - `macro`: the fair cycle through a `#[distributed_lock]` fn (fair, the default), compared
//!   with `uncontended-fair`.
//! - `nested`, `nested-unchecked`: the `uncontended` cycle through `run`, nested in a `run` body
//!   that holds another key, so that each cycle passes the lock order check; the second on a
//!   manager with `LockOrder::Off`. `lock-order` runs the two interleaved (50 rounds) and prints
//!   the median of the per-round throughput ratios: what the check costs.
//! - `contended`: W workers (across P processes with `--procs`; fair with `--fair`) on one key,
//!   each critical section holding it `--body-ms` (0 by default) between round trips to Redis
//!   that would show a broken lock, counted as violations. `--mode`:
//!   - `exclusive` (the default): a `SET NX` marker. A one-worker phase with the same options
//!     runs first, and the contended rate is reported as a ratio of it.
//!   - `shared`: readers count themselves in and check the writers' count is 0; writers count
//!     themselves in and check theirs is 1 and the readers' 0. All readers: an exclusive phase
//!     (the same workers as writers, same body) runs first, and the readers' rate is reported
//!     as a ratio of it. `--writers W`: W of the workers are writers, the rest readers; every
//!     writer's wait is judged against the requests ahead of it (arrived before it, by an
//!     `INCR` just before the acquire, and not out yet when it arrived; wall clock timestamps
//!     compare across the processes, all on one machine): its wait over the last exit among
//!     them, writers entered before by a later arrival, and the bound 1.2 x their bodies.
//!   - `permits` (`--permits N`, 8 by default): holders count themselves in and check the count
//!     is at most N; reports the permits busy on average (the holds, acquire returned to release
//!     called, over the wall time from the first arrival to the last exit) and at most.
//!
//!   With `--rounds R` the phases alternate R times and the median of the per-round ratios is
//!   reported (the machine's speed drifts between phases). Every mode reports Redis commands
//!   per acquisition (all, scripts' own included; and the lock's, less the bench's checks) and
//!   client requests (EVALSHA + EVAL) per acquisition.
//!
//!   `--topology cluster|quorum` starts that topology locally (3 primaries with a replica each;
//!   5 servers) and puts the workers' locks on it, the bench's checks staying on its own Redis;
//!   commands are then summed over that Redis and every primary (every server of a quorum), the
//!   replicas' (the writes their primaries streamed) reported apart. `--keys K` (1): every
//!   request locks K keys together (`lock_all`, `--mode exclusive` only), on a cluster each in a
//!   slot of its own, dealt over the primaries in turn; the exclusion check is on the first key.
//!   A fair request takes one key, and a quorum refuses fair requests: `--fair` with either runs
//!   unfair, and says so.
//! - `held`: K leases held (and renewed) at once for a while.
//! - `growth`: how the cost grows with keys per request and leases held.
//! - `scale`: the uncontended exclusive cycle, fair then unfair, as other work grows, in four
//!   conditions interleaved round by round (`--rounds R`, 10 by default, of `--cycles`/R cycles
//!   each): on an otherwise idle server (the baseline); while another process holds 100,000
//!   keys (ttl 1 h, not renewed); while another holds 10 keys with 100 fair waiters queued
//!   behind each (waits of 1 h); and in 8 processes at once, each on a key of its own, for as
//!   long as the baseline's cycles took in the round. Each condition reports its p50 and the
//!   median of its per-round throughput ratios to the baseline (the 8 processes: each one's
//!   rate, median over processes and rounds). The two loads are set up once, each on a
//!   throwaway Redis of its own, so that the rounds can alternate; the baseline and the 8
//!   processes share the bench's own Redis (a throwaway one unless `--redis-url`).
//! - `election`: what waiting election candidates cost Redis. `--candidates N` (100) in
//!   `--procs P` processes, each process's share tasks of one manager calling `Election::run`
//!   (ttl `--ttl-ms`); once one leads and the rest are queued, and one ttl later, it counts for
//!   `--seconds` the client requests (every command but INFO and those scripts run inside, the
//!   test harness's `RedisServer::requests` rule), the script calls (EVALSHA + EVAL) and all
//!   commands (scripts' own included) per second, in all and per waiting candidate. With
//!   `--poll-ms MS` it then measures the same candidates each looping `try_lock` + a sleep of
//!   MS instead, and the ratio. It starts a redis-server of its own unless given `--redis-url`.
//!
//! `--compare` runs `raw`, `uncontended`, `macro`, `uncontended-fair`, `shared`, `shared-fair`,
//! `permit` and `permit-fair` interleaved (50 rounds, each scenario back to back in every
//! round) and prints the median of the per-round throughput ratios, the modes' against the
//! exclusive cycle of the same fairness. `--compare --topology cluster|sentinel|quorum` instead
//! starts that topology's servers locally and compares its uncontended cycle with one Redis's
//! (and, for a cluster or Sentinel, the cycle with `min_replicas(1)` with the cycle without).
//! Redis: `--redis-url`, else as the seckill demo finds one (REDIS_URL, or a
//! throwaway redis-server). Attempts per acquisition (`contended`) are the managers' own count
//! of acquire requests sent ([`LockManager::stats`]); commands (`contended`) and renewal round
//! trips (`held`) are read from the server's `INFO commandstats`: give the bench a Redis of its
//! own, or other clients' commands count too.
//!
//! The read-write lock and semaphore figures:
//! ```text
//! cargo run --release --example bench -- --compare --cycles 10000
//! cargo run --release --example bench -- contended --mode shared --workers 64 --procs 3 --seconds 5
//! cargo run --release --example bench -- contended --mode permits --permits 8 --workers 64 --procs 3 --body-ms 10 --seconds 5
//! cargo run --release --example bench -- contended --mode shared --writers 4 --workers 64 --procs 3 --body-ms 5 --fair --seconds 5
//! ```
//!
//! The topology figures:
//! ```text
//! cargo run --release --example bench -- contended --fair --procs 3 --topology cluster --seconds 2 --rounds 3
//! cargo run --release --example bench -- contended --fair --procs 3 --topology cluster --keys 8 --seconds 2 --rounds 3
//! cargo run --release --example bench -- contended --fair --procs 3 --topology quorum --seconds 2 --rounds 3
//! ```
//!
//! The cost as work grows:
//! ```text
//! cargo run --release --example bench -- scale --rounds 10
//! ```
//!
//! The election figures:
//! ```text
//! cargo run --release --example bench -- election --candidates 100 --procs 3 --ttl-ms 3000 --seconds 20 --poll-ms 100
//! cargo run --release --example bench -- election --candidates 100 --procs 3 --ttl-ms 30000 --seconds 120
//! ```

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use distlock_examples::local_redis::LocalRedis;
use distlock_runtime::{
    distributed_lock, LockError, LockManager, LockManagerBuilder, LockOrder, LockRequest,
};
use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use serde_json::json;
use topology::{Servers, Topology};

#[path = "topology.rs"]
mod topology;

#[derive(Parser, Clone)]
#[command(about = "Measures distlock against the raw Redis floor")]
struct Cli {
    /// What to measure (omit with --compare).
    #[arg(value_enum)]
    scenario: Option<Scenario>,
    /// Run the cycle scenarios interleaved and print their ratios.
    #[arg(long)]
    compare: bool,
    /// Print one JSON line instead of a table.
    #[arg(long)]
    json: bool,
    /// Lock cycles per measurement (the cycle scenarios).
    #[arg(long, default_value_t = 20_000)]
    cycles: u32,
    /// Workers in all (contended), shared out among the processes.
    #[arg(long, default_value_t = 64)]
    workers: u32,
    /// Candidates in all (election), shared out among the processes: one leads, the rest wait.
    #[arg(long, default_value_t = 100)]
    candidates: u32,
    /// Also measure candidates that each loop `try_lock` + a sleep of this many milliseconds
    /// instead of campaigning (election), and the ratio.
    #[arg(long)]
    poll_ms: Option<u64>,
    /// Processes (contended, election).
    #[arg(long, default_value_t = 1)]
    procs: u32,
    /// Fair locking (contended): waiters queue and each release hands the lock to the oldest.
    #[arg(long)]
    fair: bool,
    /// Seconds of contention (contended, per round), of holding (held) or of waiting (election).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds (contended: 1 by default; scale: 10): each runs the baseline phase (if the mode
    /// has one) and then the contended one, or each condition of scale, and the median of the
    /// per-round ratios is reported.
    #[arg(long)]
    rounds: Option<u32>,
    /// Keys each contended request locks together (`lock_all`; --mode exclusive).
    #[arg(long, default_value_t = 1)]
    keys: u32,
    /// How the contended workers hold the key.
    #[arg(long, value_enum, default_value_t = Mode::Exclusive)]
    mode: Mode,
    /// Permits of the key (contended --mode permits).
    #[arg(long, default_value_t = 8)]
    permits: u32,
    /// Writers among the workers (contended --mode shared); the others are readers.
    #[arg(long, default_value_t = 0)]
    writers: u32,
    /// How long each critical section holds the key, in milliseconds (contended).
    #[arg(long, default_value_t = 0)]
    body_ms: u64,
    /// Leases held at once (held).
    #[arg(long, default_value_t = 10_000)]
    leases: u32,
    /// Lease ttl in milliseconds (held, election; renewal every ttl/3).
    #[arg(long, default_value_t = 3_000)]
    ttl_ms: u64,
    /// Redis URL.
    #[arg(long)]
    redis_url: Option<String>,
    /// With --compare: start this topology locally and compare it with one Redis; with
    /// contended (cluster or quorum): start it and put the workers' locks on it.
    #[arg(long, value_enum, default_value_t = Topology::Standalone)]
    topology: Topology,
    /// Internal: the URLs a contended worker's manager is built on (--topology's seeds or nodes).
    #[arg(long, hide = true, value_delimiter = ',')]
    node_urls: Vec<String>,
    /// Internal: the keys each contended request takes (the main process chooses them).
    #[arg(long, hide = true, value_delimiter = ',')]
    lock_keys: Vec<String>,
    /// Internal: run contended workers in this process and print their records as JSON.
    #[arg(long, hide = true)]
    worker_base: Option<u32>,
    /// Internal: number each request's arrival (mixed readers and writers).
    #[arg(long, hide = true)]
    arrivals: bool,
    /// Internal: the holder label of this process's candidates (election-worker).
    #[arg(long, hide = true)]
    label: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Raw,
    Uncontended,
    /// `uncontended` with `fair(true)`.
    UncontendedFair,
    /// `uncontended` with the key held shared (`read_lock`).
    Shared,
    /// `shared` with `fair(true)`.
    SharedFair,
    /// `uncontended` with the key held as one of 1 permit (`permits(1)`).
    Permit,
    /// `permit` with `fair(true)`.
    PermitFair,
    Macro,
    /// `uncontended` nested in a `run` body that holds another key: each cycle passes the lock
    /// order check (`LockOrder::Warn`, the default).
    Nested,
    /// `nested` on a manager with `LockOrder::Off`.
    NestedUnchecked,
    /// `nested` against `nested-unchecked`, interleaved: what the lock order check costs.
    LockOrder,
    Contended,
    Held,
    /// How the cost grows with keys per request and leases held.
    Growth,
    /// What waiting election candidates cost Redis.
    Election,
    /// Internal: one process's candidates of `election` (polling with `--poll-ms`).
    #[value(hide = true)]
    ElectionWorker,
    /// The uncontended cycle's cost as work grows: keys held and waiters queued by other
    /// processes, and processes cycling at once.
    Scale,
    /// Internal: `scale`'s process that holds its many keys.
    #[value(hide = true)]
    ScaleHolder,
    /// Internal: `scale`'s process that holds a few keys and queues fair waiters behind them.
    #[value(hide = true)]
    ScaleWaiters,
    /// Internal: one of `scale`'s processes that run the cycle at once, on command.
    #[value(hide = true)]
    ScaleCycler,
}

/// How the contended workers hold the key (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Each worker alone (`lock`).
    Exclusive,
    /// Readers (`read_lock`); with `--writers W`, W of the workers are writers (`lock`).
    Shared,
    /// Each worker as one of `--permits` holders (`lock(..).permits(n)`).
    Permits,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let redis = match (&cli.redis_url, cli.scenario) {
        (Some(url), _) => Ok((url.clone(), None)),
        // It counts every command the server runs: a shared Redis's other clients would count.
        (None, Some(Scenario::Election | Scenario::Scale)) => {
            LocalRedis::start().map(|r| (r.url.clone(), Some(r)))
        }
        (None, _) => LocalRedis::from_env_or_start().map(|r| (r.url.clone(), Some(r))),
    };
    let (url, _server) = match redis {
        Ok(found) => found,
        Err(message) => {
            eprintln!("bench: {message}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match (cli.worker_base, cli.compare, cli.scenario) {
        (Some(base), _, _) => contended_worker(&cli, &url, base).await,
        (None, true, _) if cli.topology != Topology::Standalone => {
            compare_topology(&cli, &url).await
        }
        (None, true, _) => compare(&cli, &url).await,
        (None, false, Some(Scenario::Contended)) => contended(&cli, &url).await,
        (None, false, Some(Scenario::Held)) => held(&cli, &url).await,
        (None, false, Some(Scenario::LockOrder)) => lock_order_cost(&cli, &url).await,
        (None, false, Some(Scenario::Growth)) => growth(&cli, &url).await,
        (None, false, Some(Scenario::Election)) => election(&cli, &url).await,
        (None, false, Some(Scenario::ElectionWorker)) => election_worker(&cli, &url).await,
        (None, false, Some(Scenario::Scale)) => scale(&cli, &url).await,
        (None, false, Some(Scenario::ScaleHolder)) => scale_holder(&url).await,
        (None, false, Some(Scenario::ScaleWaiters)) => scale_waiters(&url).await,
        (None, false, Some(Scenario::ScaleCycler)) => scale_cycler(&url).await,
        (None, false, Some(scenario)) => single(&cli, &url, scenario).await,
        (None, false, None) => Err(
            "name a scenario (raw, uncontended, shared, permit, macro, contended, held, growth, election, scale) or pass --compare".into(),
        ),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("bench: {message}");
            ExitCode::FAILURE
        }
    }
}

type Fallible<T> = Result<T, String>;

fn manager(url: &str) -> Fallible<LockManager> {
    manager_builder(url).build().map_err(|e| e.to_string())
}

fn manager_builder(url: &str) -> LockManagerBuilder {
    LockManager::builder()
        .url(url)
        .prefix(format!("distlock-bench:{}:", std::process::id()))
}

/// Deletes the fencing counters the run's locks on `keys` left (`PREFIXfence:{KEY}`; they
/// would expire a ttl after their last lease anyway). The locks are released already.
async fn remove_counters<K: AsRef<str>>(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    keys: impl IntoIterator<Item = K>,
) -> Fallible<()> {
    let mut del = redis::cmd("DEL");
    for key in keys {
        del.arg(format!("{prefix}fence:{{{}}}", key.as_ref()));
    }
    del.exec_async(conn).await.map_err(|e| e.to_string())
}

async fn connection(url: &str) -> Fallible<MultiplexedConnection> {
    redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot reach Redis at {url}: {e}"))
}

/// Latencies of one measured run, and its rate in each round.
#[derive(Default)]
struct Cycles {
    latencies: Vec<Duration>,
    total: Duration,
    round_rates: Vec<f64>,
}

impl Cycles {
    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.total.as_secs_f64().max(1e-9)
    }

    fn quantile(&self, q: f64) -> Duration {
        quantile(&self.latencies, q)
    }

    /// Adds one round's cycles.
    fn add_round(&mut self, round: Cycles) {
        self.round_rates.push(round.per_second());
        self.latencies.extend(round.latencies);
        self.total += round.total;
    }
}

fn quantile(sorted_or_not: &[Duration], q: f64) -> Duration {
    let mut v = sorted_or_not.to_vec();
    v.sort_unstable();
    let i = ((v.len().saturating_sub(1)) as f64 * q).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1_000_000.0
}

/// The owner-checked delete a hand-written lock needs: the floor's release.
static RAW_RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

async fn raw_cycles(conn: &mut MultiplexedConnection, n: u32) -> Fallible<Cycles> {
    let key = format!("distlock-bench:{}:raw", std::process::id());
    let mut cycles = Cycles::default();
    let started = Instant::now();
    for _ in 0..n {
        let token = format!("{:032x}", fastrand::u128(..));
        let t = Instant::now();
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        if set.is_none() {
            return Err("raw: key unexpectedly held".into());
        }
        let _: i64 = RAW_RELEASE
            .key(&key)
            .arg(&token)
            .invoke_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        cycles.latencies.push(t.elapsed());
    }
    cycles.total = started.elapsed();
    Ok(cycles)
}

/// `n` cycles of acquire + release on `key` held as `role`, by one task.
async fn uncontended_cycles(
    locks: &LockManager,
    key: &str,
    role: Role,
    n: u32,
    fair: bool,
) -> Fallible<Cycles> {
    let mut cycles = Cycles::default();
    let started = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let lease = role
            .request(locks, key)
            .fair(fair)
            .acquire()
            .await
            .map_err(|e| e.to_string())?;
        lease.release().await.map_err(|e| e.to_string())?;
        cycles.latencies.push(t.elapsed());
    }
    cycles.total = started.elapsed();
    Ok(cycles)
}

#[distributed_lock("{key}", manager = locks)]
async fn locked_nothing(locks: &LockManager, key: &str) -> Result<(), LockError> {
    Ok(())
}

async fn macro_cycles(locks: &LockManager, n: u32) -> Fallible<Cycles> {
    let mut cycles = Cycles::default();
    let started = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        locked_nothing(locks, "macro")
            .await
            .map_err(|e| e.to_string())?;
        cycles.latencies.push(t.elapsed());
    }
    cycles.total = started.elapsed();
    Ok(cycles)
}

/// `n` cycles of a lock on `nested`, each nested in one `run` body that holds `nested-outer`
/// throughout: every cycle goes through the lock order check (unless the manager's is off).
async fn nested_cycles(locks: &LockManager, n: u32) -> Fallible<Cycles> {
    let outer = locks
        .lock("nested-outer")
        .fair(false)
        .ttl(Duration::from_secs(60));
    let body = async {
        let mut cycles = Cycles::default();
        let started = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            locks
                .lock("nested")
                .fair(false)
                .run(async {})
                .await
                .map_err(|e| e.to_string())?;
            cycles.latencies.push(t.elapsed());
        }
        cycles.total = started.elapsed();
        Ok(cycles)
    };
    outer.run(body).await.map_err(|e| e.to_string())?
}

/// Runs `n` cycles of `scenario` on `locks` (`nested-unchecked` on `unchecked`, the same
/// manager's settings with the lock order check off).
async fn run_scenario(
    scenario: Scenario,
    conn: &mut MultiplexedConnection,
    (locks, unchecked): (&LockManager, &LockManager),
    n: u32,
) -> Fallible<Cycles> {
    match scenario {
        Scenario::Raw => raw_cycles(conn, n).await,
        Scenario::Uncontended => {
            uncontended_cycles(locks, "uncontended", Role::Exclusive, n, false).await
        }
        Scenario::UncontendedFair => {
            uncontended_cycles(locks, "uncontended", Role::Exclusive, n, true).await
        }
        Scenario::Shared => uncontended_cycles(locks, "shared", Role::Reader, n, false).await,
        Scenario::SharedFair => uncontended_cycles(locks, "shared", Role::Reader, n, true).await,
        Scenario::Permit => uncontended_cycles(locks, "permit", Role::Permit(1), n, false).await,
        Scenario::PermitFair => uncontended_cycles(locks, "permit", Role::Permit(1), n, true).await,
        Scenario::Macro => macro_cycles(locks, n).await,
        Scenario::Nested => nested_cycles(locks, n).await,
        Scenario::NestedUnchecked => nested_cycles(unchecked, n).await,
        Scenario::LockOrder
        | Scenario::Contended
        | Scenario::Held
        | Scenario::Growth
        | Scenario::Election
        | Scenario::ElectionWorker
        | Scenario::Scale
        | Scenario::ScaleHolder
        | Scenario::ScaleWaiters
        | Scenario::ScaleCycler => Err("not a cycle scenario".into()),
    }
}

fn scenario_name(s: Scenario) -> &'static str {
    match s {
        Scenario::Raw => "raw",
        Scenario::Uncontended => "uncontended",
        Scenario::UncontendedFair => "uncontended-fair",
        Scenario::Shared => "shared",
        Scenario::SharedFair => "shared-fair",
        Scenario::Permit => "permit",
        Scenario::PermitFair => "permit-fair",
        Scenario::Macro => "macro",
        Scenario::Nested => "nested",
        Scenario::NestedUnchecked => "nested-unchecked",
        Scenario::LockOrder => "lock-order",
        Scenario::Contended => "contended",
        Scenario::Held => "held",
        Scenario::Growth => "growth",
        Scenario::Election => "election",
        Scenario::ElectionWorker => "election-worker",
        Scenario::Scale => "scale",
        Scenario::ScaleHolder => "scale-holder",
        Scenario::ScaleWaiters => "scale-waiters",
        Scenario::ScaleCycler => "scale-cycler",
    }
}

/// Runs the cycle scenarios interleaved in rounds (so drift in the machine's speed hits them
/// all alike), after a warm-up.
async fn measure(
    cli: &Cli,
    url: &str,
    scenarios: &[Scenario],
) -> Fallible<Vec<(Scenario, Cycles)>> {
    let mut conn = connection(url).await?;
    let locks = manager(url)?;
    let unchecked = manager_builder(url).lock_order(LockOrder::Off).build();
    let managers = (&locks, &unchecked.map_err(|e| e.to_string())?);
    for &s in scenarios {
        run_scenario(s, &mut conn, managers, 1_000.min(cli.cycles)).await?;
    }
    let rounds = 50;
    let per_round = (cli.cycles / rounds).max(1);
    let mut results: Vec<(Scenario, Cycles)> =
        scenarios.iter().map(|&s| (s, Cycles::default())).collect();
    for _ in 0..rounds {
        for (s, total) in &mut results {
            total.add_round(run_scenario(*s, &mut conn, managers, per_round).await?);
        }
    }
    remove_counters(
        &mut conn,
        locks.prefix(),
        [
            "uncontended",
            "macro",
            "shared",
            "permit",
            "nested",
            "nested-outer",
        ],
    )
    .await?;
    Ok(results)
}

fn cycle_row(name: &str, c: &Cycles) -> serde_json::Value {
    json!({
        "scenario": name,
        "cycles": c.latencies.len(),
        "cycles_per_s": c.per_second().round(),
        "p50_us": us(c.quantile(0.5)).round(),
        "p99_us": us(c.quantile(0.99)).round(),
    })
}

fn print_cycles(results: &[(Scenario, Cycles)]) {
    println!(
        "{:<16} {:>8} {:>12} {:>10} {:>10}",
        "scenario", "cycles", "cycles/s", "p50", "p99"
    );
    for (s, c) in results {
        println!(
            "{:<16} {:>8} {:>12.0} {:>8.1}us {:>8.1}us",
            scenario_name(*s),
            c.latencies.len(),
            c.per_second(),
            us(c.quantile(0.5)),
            us(c.quantile(0.99))
        );
    }
}

/// The nested cycle with the lock order check against the same cycle without it, interleaved:
/// the median of the per-round throughput ratios.
async fn lock_order_cost(cli: &Cli, url: &str) -> Fallible<()> {
    let scenarios = [Scenario::NestedUnchecked, Scenario::Nested];
    let results = measure(cli, url, &scenarios).await?;
    let mut ratios: Vec<f64> = (results[1].1.round_rates.iter())
        .zip(&results[0].1.round_rates)
        .map(|(checked, unchecked)| checked / unchecked)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
    if cli.json {
        println!(
            "{}",
            json!({ "scenario": "lock-order", "nested_over_nested_unchecked": ratio })
        );
    } else {
        print_cycles(&results);
        println!();
        println!("nested / nested-unchecked = {ratio:.3}  (median of per-round throughput ratios)");
    }
    Ok(())
}

async fn single(cli: &Cli, url: &str, scenario: Scenario) -> Fallible<()> {
    let results = measure(cli, url, &[scenario]).await?;
    if cli.json {
        println!("{}", cycle_row(scenario_name(scenario), &results[0].1));
    } else {
        print_cycles(&results);
    }
    Ok(())
}

async fn compare(cli: &Cli, url: &str) -> Fallible<()> {
    let scenarios = [
        Scenario::Raw,
        Scenario::Uncontended,
        Scenario::Macro,
        Scenario::UncontendedFair,
        Scenario::Shared,
        Scenario::SharedFair,
        Scenario::Permit,
        Scenario::PermitFair,
    ];
    let results = measure(cli, url, &scenarios).await?;
    // The machine's speed drifts (other tenants, frequency scaling); scenarios run back to back
    // in every round, so the median of the per-round ratios is the robust comparison.
    let ratio = |a: Scenario, b: Scenario| {
        let at = |s: Scenario| scenarios.iter().position(|&x| x == s).unwrap_or(0);
        let mut ratios: Vec<f64> = results[at(a)]
            .1
            .round_rates
            .iter()
            .zip(&results[at(b)].1.round_rates)
            .map(|(x, y)| x / y)
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
    };
    use Scenario::{
        Macro, Permit, PermitFair, Raw, Shared, SharedFair, Uncontended, UncontendedFair,
    };
    let (uncontended, via_macro, fair) = (
        ratio(Uncontended, Raw),
        ratio(Macro, UncontendedFair),
        ratio(UncontendedFair, Raw),
    );
    // The modes against the exclusive cycle with the same fairness (the goal: each >= 0.9).
    let modes = [
        (Shared, Uncontended),
        (Permit, Uncontended),
        (SharedFair, UncontendedFair),
        (PermitFair, UncontendedFair),
    ]
    .map(|(a, b)| (a, b, ratio(a, b)));
    if cli.json {
        let mut row = json!({
            "scenario": "compare",
            "uncontended_over_raw": uncontended,
            "macro_over_uncontended_fair": via_macro,
            "uncontended_fair_over_raw": fair,
        });
        let fields = row.as_object_mut().ok_or("a row is an object")?;
        for (s, c) in &results {
            fields.insert(
                scenario_name(*s).replace('-', "_"),
                cycle_row(scenario_name(*s), c),
            );
        }
        for (a, b, r) in &modes {
            fields.insert(
                format!("{}_over_{}", scenario_name(*a), scenario_name(*b)).replace('-', "_"),
                json!(r),
            );
        }
        println!("{row}");
    } else {
        print_cycles(&results);
        println!();
        println!(
            "uncontended / raw      = {uncontended:.3}  (median of per-round throughput ratios)"
        );
        println!("macro / uncontended-fair = {via_macro:.3}");
        println!("uncontended-fair / raw = {fair:.3}");
        for (a, b, r) in &modes {
            println!("{} / {} = {r:.3}", scenario_name(*a), scenario_name(*b));
        }
    }
    Ok(())
}

/// The uncontended cycle on a local cluster, Sentinel group or quorum, against the same cycle
/// on one Redis, interleaved in rounds; and the cost of `min_replicas(1)` where it applies.
async fn compare_topology(cli: &Cli, url: &str) -> Fallible<()> {
    let prefix = format!("distlock-bench:{}:", std::process::id());
    let servers = Servers::start(cli.topology)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("standalone has nothing to compare")?;
    eprintln!("bench: started {}", servers.describe());
    let standalone = manager(url)?;
    let on_topology = servers
        .builder()
        .prefix(&prefix)
        .build()
        .map_err(|e| e.to_string())?;
    let mut managers = vec![
        ("standalone".to_owned(), standalone),
        (format!("{:?}", cli.topology).to_lowercase(), on_topology),
    ];
    // A cluster's and a Sentinel group's primaries stream every write to a replica, which on a
    // small machine competes for the same cores: one Redis with one replica is the like-for-like
    // baseline of the route itself.
    let replicated_standalone = (cli.topology != Topology::Quorum).then(|| {
        let primary = distlock_tests::RedisServer::start();
        let replica = distlock_tests::RedisServer::start_replica_of(&primary);
        (primary, replica)
    });
    if let Some((primary, _)) = &replicated_standalone {
        managers.push((
            "standalone + 1 replica".to_owned(),
            manager(&primary.url())?,
        ));
    }
    if cli.topology != Topology::Quorum {
        let replicated = servers
            .builder()
            .prefix(&prefix)
            .min_replicas(1)
            .build()
            .map_err(|e| e.to_string())?;
        managers.push((
            format!("{:?} min_replicas(1)", cli.topology).to_lowercase(),
            replicated,
        ));
    }
    for (_, locks) in &managers {
        uncontended_cycles(
            locks,
            "uncontended",
            Role::Exclusive,
            1_000.min(cli.cycles),
            false,
        )
        .await?;
    }
    let rounds = 50;
    let per_round = (cli.cycles / rounds).max(1);
    let mut results: Vec<Cycles> = managers.iter().map(|_| Cycles::default()).collect();
    for _ in 0..rounds {
        for ((_, locks), total) in managers.iter().zip(&mut results) {
            total.add_round(
                uncontended_cycles(locks, "uncontended", Role::Exclusive, per_round, false).await?,
            );
        }
    }
    let mut conn = connection(url).await?;
    remove_counters(&mut conn, managers[0].1.prefix(), ["uncontended"]).await?;
    let ratio = |a: usize, b: usize| {
        let mut ratios: Vec<f64> = results[a]
            .round_rates
            .iter()
            .zip(&results[b].round_rates)
            .map(|(x, y)| x / y)
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let over_standalone = ratio(1, 0);
    let over_replicated = replicated_standalone.as_ref().map(|_| ratio(1, 2));
    let replicas_cost = replicated_standalone.as_ref().map(|_| ratio(3, 1));
    if cli.json {
        println!(
            "{}",
            json!({
                "scenario": "compare-topology",
                "topology": managers[1].0,
                "rows": managers.iter().zip(&results).map(|((name, _), c)| cycle_row(name, c)).collect::<Vec<_>>(),
                "topology_over_standalone": over_standalone,
                "topology_over_standalone_with_replica": over_replicated,
                "min_replicas_over_topology": replicas_cost,
            })
        );
    } else {
        println!(
            "{:<32} {:>8} {:>12} {:>10} {:>10}",
            "uncontended cycle on", "cycles", "cycles/s", "p50", "p99"
        );
        for ((name, _), c) in managers.iter().zip(&results) {
            println!(
                "{:<32} {:>8} {:>12.0} {:>8.1}us {:>8.1}us",
                name,
                c.latencies.len(),
                c.per_second(),
                us(c.quantile(0.5)),
                us(c.quantile(0.99))
            );
        }
        println!();
        println!(
            "{} / standalone = {over_standalone:.3}  (median of per-round throughput ratios)",
            managers[1].0
        );
        if let Some(ratio) = over_replicated {
            println!("{} / {} = {ratio:.3}", managers[1].0, managers[2].0);
        }
        if let Some(cost) = replicas_cost {
            println!("{} / {} = {cost:.3}", managers[3].0, managers[1].0);
        }
    }
    Ok(())
}

/// How a request holds its key, in the cycle scenarios and in `contended`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Alone (`lock`), checked with a marker (`--mode exclusive`).
    Exclusive,
    /// Shared with other readers (`read_lock`).
    Reader,
    /// Alone (`lock`), among readers (`--mode shared`): checked with the readers' counters.
    Writer,
    /// As one of `n` permits (`lock(..).permits(n)`).
    Permit(u32),
}

impl Role {
    fn request(self, locks: &LockManager, key: &str) -> LockRequest {
        match self {
            Role::Exclusive | Role::Writer => locks.lock(key),
            Role::Reader => locks.read_lock(key),
            Role::Permit(n) => locks.lock(key).permits(n),
        }
    }
}

/// The role of worker `w` of this process: in `--mode shared`, `cli.writers` of the workers,
/// evenly spaced, are writers.
fn role_of(cli: &Cli, w: u32) -> Role {
    let (w, writers, workers) = (
        u64::from(w),
        u64::from(cli.writers),
        u64::from(cli.workers.max(1)),
    );
    match cli.mode {
        Mode::Exclusive => Role::Exclusive,
        Mode::Permits => Role::Permit(cli.permits),
        // Exactly `writers` of 0..workers pass this test, spread evenly.
        Mode::Shared if w * writers % workers < writers => Role::Writer,
        Mode::Shared => Role::Reader,
    }
}

/// One acquisition in the contended scenario.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Acquisition {
    /// Order of entry into the critical section (from `INCR`).
    seq: u64,
    /// The lease's fencing token: must increase with `seq` (for a writer: against every other
    /// entry; readers enter together).
    fencing_token: u64,
    worker: u32,
    /// Held alone: `--mode exclusive`, or a writer.
    exclusive: bool,
    /// Order of arrival, from an `INCR` just before the acquire (with `--writers` only).
    arrival: Option<u64>,
    /// Wall clock just before the acquire, in µs since the epoch: the bench's processes run on
    /// one machine and share it, so arrivals and exits compare across them.
    arrived_us: u64,
    wait_us: u64,
    /// From the acquire returning to calling release.
    hold_us: u64,
}

impl Acquisition {
    fn exited_us(&self) -> u64 {
        self.arrived_us + self.wait_us + self.hold_us
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct WorkerReport {
    acquisitions: Vec<Acquisition>,
    violations: u64,
    timeouts: u64,
    /// Acquire requests sent (attempts), from the managers' stats.
    acquire_requests: u64,
    /// Acquisitions by hand-off (fair), from the managers' stats.
    handed_over: u64,
    /// The most holders inside at once (readers, permit holders), from the `INCR` replies.
    max_inside: i64,
    /// Commands the bench itself sent (checks, sequence numbers): the rest are the lock's.
    probe_commands: u64,
}

impl WorkerReport {
    fn merge(&mut self, part: WorkerReport) {
        self.acquisitions.extend(part.acquisitions);
        self.violations += part.violations;
        self.timeouts += part.timeouts;
        self.acquire_requests += part.acquire_requests;
        self.handed_over += part.handed_over;
        self.max_inside = self.max_inside.max(part.max_inside);
        self.probe_commands += part.probe_commands;
    }
}

const CONTENDED_KEY: &str = "contended";

/// The bench's own keys in one phase of `contended`, under the phase's prefix.
struct ProbeKeys {
    marker: String,
    seq: String,
    readers: String,
    writers: String,
    inside: String,
    arrivals: String,
}

impl ProbeKeys {
    fn new(prefix: &str) -> Self {
        Self {
            marker: format!("{prefix}marker"),
            seq: format!("{prefix}seq"),
            readers: format!("{prefix}readers"),
            writers: format!("{prefix}writers"),
            inside: format!("{prefix}inside"),
            arrivals: format!("{prefix}arrivals"),
        }
    }

    fn all(&self) -> [&str; 6] {
        [
            &self.marker,
            &self.seq,
            &self.readers,
            &self.writers,
            &self.inside,
            &self.arrivals,
        ]
    }
}

/// A worker's connection for its own commands, counted: the phase's command count less these
/// is the lock's.
struct Probe {
    conn: MultiplexedConnection,
    commands: u64,
}

impl Probe {
    async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Fallible<T> {
        self.commands += 1;
        cmd.query_async(&mut self.conn)
            .await
            .map_err(|e| e.to_string())
    }
}

/// What one critical section saw.
struct Entered {
    seq: u64,
    violated: bool,
    /// Holders inside with it (its own `INCR` reply; 1 for `Role::Exclusive`).
    inside: i64,
}

/// The critical section: separate round trips to Redis, so another holder that should not be
/// there could run in between and be seen, around `body` of holding.
async fn critical_section(
    role: Role,
    probe: &mut Probe,
    keys: &ProbeKeys,
    worker: u32,
    body: Duration,
) -> Fallible<Entered> {
    let hold = move || async move {
        if !body.is_zero() {
            tokio::time::sleep(body).await;
        }
    };
    let incr = |key: &str| redis::cmd("INCR").arg(key).clone();
    let decr = |key: &str| redis::cmd("DECR").arg(key).clone();
    let get = |key: &str| redis::cmd("GET").arg(key).clone();
    Ok(match role {
        Role::Exclusive => {
            // A second holder would find the marker set.
            let entered: Option<String> = probe
                .query(redis::cmd("SET").arg(&keys.marker).arg(worker).arg("NX"))
                .await?;
            let seq = probe.query(&incr(&keys.seq)).await?;
            hold().await;
            let _: i64 = probe.query(redis::cmd("DEL").arg(&keys.marker)).await?;
            Entered {
                seq,
                violated: entered.is_none(),
                inside: 1,
            }
        }
        Role::Reader => {
            // Each side counts itself in before it looks at the other: of a reader and a writer
            // inside together, at least one sees the other.
            let readers: i64 = probe.query(&incr(&keys.readers)).await?;
            let writers: Option<i64> = probe.query(&get(&keys.writers)).await?;
            let seq = probe.query(&incr(&keys.seq)).await?;
            hold().await;
            let _: i64 = probe.query(&decr(&keys.readers)).await?;
            Entered {
                seq,
                violated: writers.unwrap_or(0) != 0,
                inside: readers,
            }
        }
        Role::Writer => {
            let writers: i64 = probe.query(&incr(&keys.writers)).await?;
            let readers: Option<i64> = probe.query(&get(&keys.readers)).await?;
            let seq = probe.query(&incr(&keys.seq)).await?;
            hold().await;
            let _: i64 = probe.query(&decr(&keys.writers)).await?;
            Entered {
                seq,
                violated: writers != 1 || readers.unwrap_or(0) != 0,
                inside: writers,
            }
        }
        Role::Permit(n) => {
            let inside: i64 = probe.query(&incr(&keys.inside)).await?;
            let seq = probe.query(&incr(&keys.seq)).await?;
            hold().await;
            let _: i64 = probe.query(&decr(&keys.inside)).await?;
            Entered {
                seq,
                violated: inside > i64::from(n),
                inside,
            }
        }
    })
}

/// Microseconds since the epoch: one clock for all the bench's processes (on one machine).
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A manager builder on the servers `contended` puts its locks on: `url`, or the nodes
/// (`--node-urls`) of the `--topology` the main process started.
fn contended_builder(cli: &Cli, url: &str) -> Fallible<LockManagerBuilder> {
    let builder = LockManager::builder();
    Ok(match cli.topology {
        Topology::Standalone => builder.url(url),
        Topology::Cluster => builder.cluster(cli.node_urls.clone()),
        Topology::Quorum => builder.quorum(cli.node_urls.clone()),
        Topology::Sentinel => {
            return Err("contended runs on one Redis, a cluster or a quorum".into())
        }
    })
}

/// Runs `cli.workers` workers in this process until `cli.seconds` pass.
async fn run_workers(cli: &Cli, url: &str, base: u32, prefix: &str) -> Fallible<WorkerReport> {
    let locks = contended_builder(cli, url)?
        .prefix(prefix)
        .default_wait(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    // The bench's checks stay on `url` whatever the locks are on: one server sees them all.
    let conn = connection(url).await?;
    let lock_keys: std::sync::Arc<[String]> = if cli.lock_keys.is_empty() {
        [CONTENDED_KEY.to_owned()].into()
    } else {
        cli.lock_keys.clone().into()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(cli.seconds.min(86_400));
    let keys = std::sync::Arc::new(ProbeKeys::new(prefix));
    let (fair, arrivals) = (cli.fair, cli.arrivals);
    let body = Duration::from_millis(cli.body_ms);
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..cli.workers {
        let role = role_of(cli, w);
        let (locks, keys) = (locks.clone(), std::sync::Arc::clone(&keys));
        let lock_keys = std::sync::Arc::clone(&lock_keys);
        let mut probe = Probe {
            conn: conn.clone(),
            commands: 0,
        };
        tasks.spawn(async move {
            let mut report = WorkerReport::default();
            while tokio::time::Instant::now() < deadline {
                let arrival = if arrivals {
                    Some(probe.query(redis::cmd("INCR").arg(&keys.arrivals)).await?)
                } else {
                    None
                };
                let arrived_us = wall_us();
                let t = Instant::now();
                let request = match &lock_keys[..] {
                    [key] => role.request(&locks, key),
                    // Several keys are exclusive only (checked in `contended`).
                    all => locks.lock_all(all.iter().cloned()),
                };
                let lease = match request.fair(fair).acquire().await {
                    Ok(lease) => lease,
                    Err(e) if e.is_contention() => {
                        report.timeouts += 1;
                        continue;
                    }
                    Err(e) => return Err(e.to_string()),
                };
                let entered_at = Instant::now();
                // A request holds all its keys or none, and every request asks for the same
                // ones: the check is on the first key, whose holder the marker stands for.
                let entered = critical_section(role, &mut probe, &keys, w, body).await?;
                let hold = entered_at.elapsed();
                let fencing_token = lease.fencing_token();
                lease.release().await.map_err(|e| e.to_string())?;
                report.violations += u64::from(entered.violated);
                report.max_inside = report.max_inside.max(entered.inside);
                let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
                report.acquisitions.push(Acquisition {
                    seq: entered.seq,
                    fencing_token,
                    worker: base + w,
                    exclusive: matches!(role, Role::Exclusive | Role::Writer),
                    arrival,
                    arrived_us,
                    wait_us: micros(entered_at - t),
                    hold_us: micros(hold),
                });
            }
            report.probe_commands = probe.commands;
            Fallible::Ok(report)
        });
    }
    let mut all = WorkerReport::default();
    while let Some(joined) = tasks.join_next().await {
        all.merge(joined.map_err(|e| e.to_string())??);
    }
    let stats = locks.stats();
    all.acquire_requests = stats.acquire_requests;
    all.handed_over = stats.handed_over;
    Ok(all)
}

async fn contended_worker(cli: &Cli, url: &str, base: u32) -> Fallible<()> {
    let prefix =
        std::env::var("DISTLOCK_BENCH_PREFIX").map_err(|_| "missing DISTLOCK_BENCH_PREFIX")?;
    let report = run_workers(cli, url, base, &prefix).await?;
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// `calls` of each command in `INFO commandstats`, by its lower-case name (`evalsha`, `get`):
/// everything Redis ran, the commands scripts call included. Give the bench a Redis of its own.
async fn commandstats(conn: &mut MultiplexedConnection) -> Fallible<HashMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(command_calls_in(&info))
}

/// `calls` of each command in the `commandstats` section of an INFO reply, by name.
fn command_calls_in(info: &str) -> HashMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

/// `calls` of one command in `INFO commandstats`.
async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> Fallible<u64> {
    Ok(commandstats(conn).await?.get(command).copied().unwrap_or(0))
}

/// One phase of `contended`: the workers on the key(s) for `cli.seconds`.
struct Phase {
    report: WorkerReport,
    elapsed: Duration,
    /// Redis commands run in the phase: the lock's, its scripts' own and the bench's probes
    /// (on every primary counted).
    commands: u64,
    /// Client requests for the lock: EVALSHA and EVAL calls.
    script_calls: u64,
    /// Commands the counted replicas ran: the writes their primaries streamed to them.
    replicated: u64,
}

impl Phase {
    fn per_second(&self) -> f64 {
        self.report.acquisitions.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// What the servers a phase counts have run so far, from each one's `INFO replication
/// commandstats` (its own INFO call not yet counted in its reply).
#[derive(Default)]
struct Tally {
    /// Every call on the primaries (and a standalone or quorum server), scripts' own included.
    commands: u64,
    /// EVALSHA and EVAL calls on the primaries.
    script_calls: u64,
    /// Every call on the replicas.
    replicated: u64,
    /// The servers read: each read adds one INFO to the next.
    primaries: u64,
    replicas: u64,
}

impl Tally {
    async fn read(conns: &mut [MultiplexedConnection]) -> Fallible<Self> {
        let mut tally = Tally::default();
        for conn in conns {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .arg("commandstats")
                .query_async(conn)
                .await
                .map_err(|e| e.to_string())?;
            let calls = command_calls_in(&info);
            let all: u64 = calls.values().sum();
            if info.lines().any(|l| l.trim() == "role:slave") {
                tally.replicated += all;
                tally.replicas += 1;
            } else {
                tally.commands += all;
                tally.script_calls += ["evalsha", "eval"]
                    .iter()
                    .filter_map(|name| calls.get(*name))
                    .sum::<u64>();
                tally.primaries += 1;
            }
        }
        Ok(tally)
    }

    /// What ran from `before` to `self`, less the INFO calls that read `before`.
    fn since(&self, before: &Tally) -> Tally {
        Tally {
            commands: (self.commands.saturating_sub(before.commands))
                .saturating_sub(before.primaries),
            script_calls: self.script_calls.saturating_sub(before.script_calls),
            replicated: (self.replicated.saturating_sub(before.replicated))
                .saturating_sub(before.replicas),
            ..Tally::default()
        }
    }
}

/// One phase of `contended`. `counted`: the servers whose commands it sums (the bench's own
/// Redis, with the probes, and every node of a topology started for the run).
async fn contended_phase(
    cli: &Cli,
    url: &str,
    counted: &[String],
    prefix: &str,
) -> Fallible<Phase> {
    let mut conn = connection(url).await?;
    let mut counted_conns = Vec::new();
    for server in counted {
        counted_conns.push(connection(server).await?);
    }
    let before = Tally::read(&mut counted_conns).await?;
    let started = Instant::now();
    let mut report = WorkerReport::default();
    if cli.procs <= 1 {
        report = run_workers(cli, url, 0, prefix).await?;
    } else {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut children = Vec::new();
        let mut base = 0;
        // The W workers, and the writers among them, are shared out among the processes.
        let share = |n: u32, p: u32| n / cli.procs + u32::from(p < n % cli.procs);
        for p in 0..cli.procs {
            let here = share(cli.workers, p);
            children.push(
                tokio::process::Command::new(&exe)
                    .arg("contended")
                    .args(["--workers", &here.to_string()])
                    .args(["--seconds", &cli.seconds.to_string()])
                    .args(["--mode", mode_name(cli.mode)])
                    .args(["--permits", &cli.permits.to_string()])
                    .args(["--writers", &share(cli.writers, p).to_string()])
                    .args(["--body-ms", &cli.body_ms.to_string()])
                    .args(["--redis-url", url])
                    .args(["--topology", &format!("{:?}", cli.topology).to_lowercase()])
                    .args(
                        (!cli.node_urls.is_empty())
                            .then(|| format!("--node-urls={}", cli.node_urls.join(","))),
                    )
                    .args(
                        (!cli.lock_keys.is_empty())
                            .then(|| format!("--lock-keys={}", cli.lock_keys.join(","))),
                    )
                    .args(["--worker-base", &base.to_string()])
                    .args(cli.fair.then_some("--fair"))
                    .args(cli.arrivals.then_some("--arrivals"))
                    .env("DISTLOCK_BENCH_PREFIX", prefix)
                    .stdout(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| e.to_string())?,
            );
            base += here;
        }
        for child in children {
            let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!("a worker process failed: {}", out.status));
            }
            let part: WorkerReport =
                serde_json::from_slice(&out.stdout).map_err(|e| format!("worker output: {e}"))?;
            report.merge(part);
        }
    }
    let elapsed = started.elapsed();
    let ran = Tally::read(&mut counted_conns).await?.since(&before);
    let keys = ProbeKeys::new(prefix);
    let mut del = redis::cmd("DEL");
    del.arg(&keys.all()[..]);
    // The fencing counters on one Redis; a topology's servers are thrown away after the run.
    if cli.topology == Topology::Standalone {
        for key in &cli.lock_keys {
            del.arg(format!("{prefix}fence:{{{key}}}"));
        }
    }
    del.exec_async(&mut conn).await.map_err(|e| e.to_string())?;
    Ok(Phase {
        report,
        elapsed,
        commands: ran.commands,
        script_calls: ran.script_calls,
        replicated: ran.replicated,
    })
}

/// The phase each round runs before the contended one, as its yardstick, and its name: one
/// worker with the same options (exclusive), or the same workers holding the key exclusively
/// with the same body (all readers). Permits and mixed readers and writers have none.
fn baseline_of(cli: &Cli) -> Option<(Cli, &'static str)> {
    match cli.mode {
        Mode::Exclusive => Some((
            Cli {
                workers: 1,
                procs: 1,
                ..cli.clone()
            },
            "w1",
        )),
        Mode::Shared if cli.writers == 0 => Some((
            Cli {
                writers: cli.workers,
                ..cli.clone()
            },
            "exclusive",
        )),
        Mode::Shared | Mode::Permits => None,
    }
}

/// One round of `contended`: the baseline phase, if the mode has one, then the contended one.
struct Round {
    phase: Phase,
    baseline: Option<Phase>,
    /// Entries whose fencing token disagrees with their order of entry (none for permits,
    /// whose holders enter together in any order).
    fence_inversions: Option<usize>,
    /// Consecutive entries by different workers.
    handoffs: usize,
    /// The sum of the holds, and the wall time from the first arrival to the last exit.
    held: Duration,
    window: Duration,
    writer_waits: Vec<WriterWait>,
}

async fn contended_round(cli: &Cli, url: &str, counted: &[String], round: u32) -> Fallible<Round> {
    let prefix = format!("distlock-bench:{}:{round}:", std::process::id());
    let baseline = match baseline_of(cli) {
        Some((base, name)) => {
            Some(contended_phase(&base, url, counted, &format!("{prefix}{name}:")).await?)
        }
        None => None,
    };
    let mut phase = contended_phase(cli, url, counted, &prefix).await?;
    let by_entry = &mut phase.report.acquisitions;
    by_entry.sort_by_key(|a| a.seq);
    let fence_inversions = match cli.mode {
        // Entries into the critical section in order must carry increasing fencing tokens.
        Mode::Exclusive => Some(
            by_entry
                .windows(2)
                .filter(|w| w[1].fencing_token <= w[0].fencing_token)
                .count(),
        ),
        Mode::Shared => Some(exclusive_fence_inversions(by_entry)),
        Mode::Permits => None,
    };
    let handoffs = by_entry
        .windows(2)
        .filter(|w| w[0].worker != w[1].worker)
        .count();
    let first = by_entry.iter().map(|a| a.arrived_us).min().unwrap_or(0);
    let last = by_entry
        .iter()
        .map(Acquisition::exited_us)
        .max()
        .unwrap_or(0);
    let held = by_entry.iter().map(|a| a.hold_us).sum();
    let writer_waits = if cli.arrivals {
        writer_waits(by_entry)
    } else {
        Vec::new()
    };
    Ok(Round {
        phase,
        baseline,
        fence_inversions,
        handoffs,
        held: Duration::from_micros(held),
        window: Duration::from_micros(last.saturating_sub(first)),
        writer_waits,
    })
}

/// Writers (entries held exclusively) whose fencing token is not above every earlier entry's
/// and below every later one's, in `by_entry` (entry order). Readers enter together, in any
/// order among themselves, but never across a writer.
fn exclusive_fence_inversions(by_entry: &[Acquisition]) -> usize {
    let mut later_min = vec![u64::MAX; by_entry.len() + 1];
    for (i, a) in by_entry.iter().enumerate().rev() {
        later_min[i] = later_min[i + 1].min(a.fencing_token);
    }
    let mut earlier_max: Option<u64> = None;
    let mut inversions = 0;
    for (i, a) in by_entry.iter().enumerate() {
        let token = a.fencing_token;
        if a.exclusive && (earlier_max.is_some_and(|m| m >= token) || later_min[i + 1] <= token) {
            inversions += 1;
        }
        earlier_max = earlier_max.max(Some(token));
    }
    inversions
}

/// One writer's wait (`--writers`), against the requests ahead of it: those that arrived before
/// it (by the arrival sequence number) and had not exited when it arrived.
struct WriterWait {
    wait_us: u64,
    ahead: usize,
    /// The latest exit among those ahead, less the writer's arrival: what it had to wait.
    ahead_span_us: u64,
    /// The sum of the bodies (holds) of those ahead.
    ahead_bodies_us: u64,
    /// Entered before it by a request that arrived after it: how much later the last of those
    /// arrived (by the shared wall clock; may be negative for two arrivals a round trip apart).
    overtaken_by_us: Option<i64>,
}

fn writer_waits(by_entry: &[Acquisition]) -> Vec<WriterWait> {
    let mut waits = Vec::new();
    // The latest arrival among the entries so far: (arrival number, wall clock).
    let mut latest: Option<(u64, u64)> = None;
    for a in by_entry {
        let Some(arrival) = a.arrival else { continue };
        if a.exclusive {
            let ahead: Vec<&Acquisition> = by_entry
                .iter()
                .filter(|r| r.arrival.is_some_and(|s| s < arrival) && r.exited_us() > a.arrived_us)
                .collect();
            let last_exit = ahead.iter().map(|r| r.exited_us()).max();
            waits.push(WriterWait {
                wait_us: a.wait_us,
                ahead: ahead.len(),
                ahead_span_us: last_exit.map_or(0, |e| e - a.arrived_us),
                ahead_bodies_us: ahead.iter().map(|r| r.hold_us).sum(),
                overtaken_by_us: latest
                    .filter(|&(s, _)| s > arrival)
                    .map(|(_, us)| us as i64 - a.arrived_us as i64),
            });
        }
        if latest.is_none_or(|(s, _)| s < arrival) {
            latest = Some((arrival, a.arrived_us));
        }
    }
    waits
}

/// What the writers' waits say, over all rounds.
fn writers_summary(waits: &[WriterWait]) -> serde_json::Value {
    let with_ahead: Vec<&WriterWait> = waits.iter().filter(|w| w.ahead > 0).collect();
    let alone_wait_max = waits
        .iter()
        .filter(|w| w.ahead == 0)
        .map(|w| w.wait_us)
        .max();
    let ms_of = |us: f64| us / 1000.0;
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let at = |v: &[f64], q: f64| {
        let i = ((v.len().saturating_sub(1)) as f64 * q).round() as usize;
        v.get(i).copied()
    };
    let ratios = sorted(
        with_ahead
            .iter()
            .map(|w| w.wait_us as f64 / w.ahead_span_us as f64)
            .collect(),
    );
    let worst = with_ahead
        .iter()
        .max_by(|a, b| {
            let r = |w: &&&WriterWait| w.wait_us as f64 / w.ahead_span_us as f64;
            r(a).total_cmp(&r(b))
        })
        .map(|w| json!({"wait_ms": ms_of(w.wait_us as f64), "ahead_span_ms": ms_of(w.ahead_span_us as f64), "ahead": w.ahead}));
    let excess = sorted(
        with_ahead
            .iter()
            .map(|w| ms_of(w.wait_us as f64 - w.ahead_span_us as f64))
            .collect(),
    );
    let within_bound = with_ahead
        .iter()
        .filter(|w| w.wait_us as f64 <= 1.2 * w.ahead_bodies_us as f64)
        .count();
    let over_bodies = with_ahead
        .iter()
        .map(|w| w.wait_us as f64 / (w.ahead_bodies_us as f64).max(1.0))
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    let overtaken: Vec<i64> = waits.iter().filter_map(|w| w.overtaken_by_us).collect();
    let writer_waits = sorted(waits.iter().map(|w| ms_of(w.wait_us as f64)).collect());
    json!({
        "writer_acquisitions": waits.len(),
        "wait_mean_ms": writer_waits.iter().sum::<f64>() / (writer_waits.len().max(1) as f64),
        "wait_p99_ms": at(&writer_waits, 0.99),
        "wait_max_ms": at(&writer_waits, 1.0),
        "nobody_ahead": waits.len() - with_ahead.len(),
        "nobody_ahead_wait_max_ms": alone_wait_max.map(|us| ms_of(us as f64)),
        "wait_over_ahead_span_max": at(&ratios, 1.0),
        "wait_over_ahead_span_p99": at(&ratios, 0.99),
        "wait_over_ahead_span_p50": at(&ratios, 0.5),
        "worst": worst,
        "excess_over_ahead_span_max_ms": at(&excess, 1.0),
        "excess_over_ahead_span_p99_ms": at(&excess, 0.99),
        "excess_over_ahead_span_p50_ms": at(&excess, 0.5),
        "within_1_2x_bodies_ahead": within_bound,
        "with_someone_ahead": with_ahead.len(),
        "wait_over_bodies_ahead_max": over_bodies,
        "overtaken": overtaken.len(),
        "overtaken_by_max_ms": overtaken.iter().max().map(|&us| ms_of(us as f64)),
    })
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "exclusive",
        Mode::Shared => "shared",
        Mode::Permits => "permits",
    }
}

/// The keys each `contended` request takes: `contended` alone; with `--keys K`, K keys, and on a
/// cluster each in a slot of its own, dealt over the primaries in turn (the runtime wraps a key
/// in braces, so its name is its hash tag). The second value, on a cluster: how many keys each
/// primary serves.
fn contended_keys(
    keys: u32,
    servers: Option<&Servers>,
) -> Fallible<(Vec<String>, Option<Vec<usize>>)> {
    if keys == 1 {
        return Ok((vec![CONTENDED_KEY.to_owned()], None));
    }
    let name = |n: u32| format!("{CONTENDED_KEY}-{n}");
    let Some(Servers::Cluster(cluster)) = servers else {
        return Ok(((0..keys).map(name).collect(), None));
    };
    let primary_of = |slot: u16| cluster.primary_of_slot(slot).map_err(|e| e.to_string());
    // The first, middle and last slots: one on each of the 3 primaries.
    let mut primaries = vec![primary_of(0)?, primary_of(8_192)?, primary_of(16_383)?];
    primaries.dedup();
    let (mut chosen, mut slots, mut per_primary) =
        (Vec::new(), Vec::new(), vec![0; primaries.len()]);
    let mut n = 0;
    while chosen.len() < keys as usize {
        let want = chosen.len() % primaries.len();
        let slot = cluster.slot_of(&format!("lock:{{{}}}", name(n)));
        if !slots.contains(&slot) && primary_of(slot)? == primaries[want] {
            chosen.push(name(n));
            slots.push(slot);
            per_primary[want] += 1;
        }
        n += 1;
    }
    Ok((chosen, Some(per_primary)))
}

/// `contended`: `cli.rounds` rounds, each the baseline phase (if the mode has one) and then the
/// contended one; the ratio of their rates is taken per round (the machine's speed drifts) and
/// its median reported.
async fn contended(cli: &Cli, url: &str) -> Fallible<()> {
    if cli.writers > 0 && cli.mode != Mode::Shared {
        return Err("--writers needs --mode shared".into());
    }
    if cli.writers > cli.workers {
        return Err(format!(
            "--writers {} is more than the {} workers",
            cli.writers, cli.workers
        ));
    }
    if cli.mode == Mode::Permits && cli.permits == 0 {
        return Err("--permits must be at least 1".into());
    }
    if cli.keys == 0 || (cli.keys > 1 && cli.mode != Mode::Exclusive) {
        return Err("--keys takes 1, or more with --mode exclusive".into());
    }
    let servers = match cli.topology {
        Topology::Standalone => None,
        Topology::Sentinel => {
            return Err("contended runs on one Redis, a cluster or a quorum".into())
        }
        Topology::Cluster | Topology::Quorum => Servers::start(cli.topology)
            .await
            .map_err(|e| e.to_string())?,
    };
    // The probes' server (the locks' too on one Redis), then every node started.
    let mut counted = vec![url.to_owned()];
    let node_urls = match &servers {
        Some(Servers::Cluster(cluster)) => {
            counted.extend((0..cluster.node_count()).map(|i| cluster.node(i).url()));
            cluster.seed_urls()
        }
        Some(Servers::Quorum(quorum)) => {
            counted.extend(quorum.urls());
            quorum.urls()
        }
        Some(Servers::Sentinel(_)) | None => Vec::new(),
    };
    if let Some(servers) = &servers {
        eprintln!("bench: started {}", servers.describe());
    }
    let (lock_keys, spread) = contended_keys(cli.keys, servers.as_ref())?;
    let unfair_because = match (cli.fair, cli.topology) {
        (false, _) => None,
        (true, Topology::Quorum) => Some("a quorum refuses fair requests"),
        (true, _) if cli.keys > 1 => Some("a fair request takes one key"),
        (true, _) => None,
    };
    let mixed = cli.mode == Mode::Shared && cli.writers > 0;
    let cli = &Cli {
        arrivals: mixed,
        fair: cli.fair && unfair_because.is_none(),
        node_urls,
        lock_keys,
        ..cli.clone()
    };
    let rounds = cli.rounds.unwrap_or(1).max(1);
    let mut report = WorkerReport::default();
    let (mut elapsed, mut commands, mut script_calls, mut handoffs) =
        (Duration::ZERO, 0u64, 0u64, 0usize);
    let (mut held, mut window) = (Duration::ZERO, Duration::ZERO);
    let mut fence_inversions: Option<usize> = None;
    let mut base = WorkerReport::default();
    let (mut base_commands, mut base_script_calls) = (0u64, 0u64);
    let (mut baseline_rates, mut ratios, mut tails) = (Vec::new(), Vec::new(), Vec::new());
    let mut writer_waits = Vec::new();
    let mut replicated = 0u64;
    for round in 0..rounds {
        let r = contended_round(cli, url, &counted, round).await?;
        if let Some(b) = r.baseline {
            ratios.push(r.phase.per_second() / b.per_second().max(1e-9));
            baseline_rates.push(b.per_second());
            base_commands += b.commands;
            base_script_calls += b.script_calls;
            base.merge(b.report);
        }
        tails.push(p99_over_mean(&r.phase.report.acquisitions));
        elapsed += r.phase.elapsed;
        commands += r.phase.commands;
        script_calls += r.phase.script_calls;
        replicated += r.phase.replicated;
        handoffs += r.handoffs;
        held += r.held;
        window += r.window;
        if let Some(n) = r.fence_inversions {
            fence_inversions = Some(fence_inversions.unwrap_or(0) + n);
        }
        writer_waits.extend(r.writer_waits);
        report.merge(r.phase.report);
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let n = report.acquisitions.len();
    let mut per_worker: HashMap<u32, f64> = HashMap::new();
    for a in &report.acquisitions {
        *per_worker.entry(a.worker).or_default() += 1.0;
    }
    let workers = f64::from(cli.workers);
    let sum: f64 = per_worker.values().sum();
    let sum_sq: f64 = per_worker.values().map(|x| x * x).sum();
    let jain = if sum_sq > 0.0 {
        sum * sum / (workers * sum_sq)
    } else {
        0.0
    };
    let (waits, mean_wait) = wait_times(&report.acquisitions);
    let acquisitions_per_s = n as f64 / elapsed.as_secs_f64();
    let per_acquisition = |count: u64, n: usize| count as f64 / (n.max(1) as f64);
    let attempts = per_acquisition(report.acquire_requests, n);
    let commands_per_acquisition = per_acquisition(commands, n);
    let lock_commands = per_acquisition(commands.saturating_sub(report.probe_commands), n);
    let client_requests = per_acquisition(script_calls, n);
    let handoff_share = handoffs as f64 / (n.saturating_sub(1).max(1) as f64);
    let inside_mean = held.as_secs_f64() / window.as_secs_f64().max(1e-9);
    // Per round, like the rate: a slow round's waits are all longer, which would widen a
    // distribution pooled over rounds.
    let pooled_p99_over_mean = p99_over_mean(&report.acquisitions);
    let p99_over_mean = median(&mut tails);
    let vs_baseline = median(&mut ratios);
    let baseline_per_s = median(&mut baseline_rates);
    let base_n = base.acquisitions.len();
    let mut row = json!({
        "scenario": "contended",
        "mode": mode_name(cli.mode),
        "fair": cli.fair,
        "workers": cli.workers,
        "procs": cli.procs.max(1),
        "seconds": cli.seconds,
        "rounds": rounds,
        "topology": format!("{:?}", cli.topology).to_lowercase(),
        "keys": cli.keys,
        "slots_per_primary": spread,
        "fair_requested_but_unfair_because": unfair_because,
        "body_ms": cli.body_ms,
        "acquisitions": n,
        "acquisitions_per_s": acquisitions_per_s.round(),
        "handed_over": report.handed_over,
        "wait_p99_over_mean": p99_over_mean,
        "wait_p99_over_mean_pooled": pooled_p99_over_mean,
        "wait_mean_ms": ms(mean_wait),
        "wait_p50_ms": ms(quantile(&waits, 0.5)),
        "wait_p99_ms": ms(quantile(&waits, 0.99)),
        "wait_max_ms": ms(quantile(&waits, 1.0)),
        "holders_inside_mean": inside_mean,
        "attempts_per_acquisition": attempts,
        "redis_commands_per_acquisition": commands_per_acquisition,
        "lock_commands_per_acquisition": lock_commands,
        "client_requests_per_acquisition": client_requests,
        "handoff_share": handoff_share,
        "jain_fairness": jain,
        "violations": report.violations,
        "fencing_inversions": fence_inversions,
        "timeouts": report.timeouts,
    });
    let fields = row.as_object_mut().ok_or("a row is an object")?;
    if cli.topology == Topology::Cluster {
        fields.insert(
            "replicated_commands_per_acquisition".into(),
            json!(per_acquisition(replicated, n)),
        );
    }
    match cli.mode {
        Mode::Exclusive => {
            fields.insert("sequential_per_s".into(), json!(baseline_per_s.round()));
            fields.insert("vs_sequential".into(), json!(vs_baseline));
        }
        Mode::Shared if !mixed => {
            fields.insert("exclusive_per_s".into(), json!(baseline_per_s.round()));
            fields.insert("vs_exclusive".into(), json!(vs_baseline));
            fields.insert(
                "exclusive_lock_commands_per_acquisition".into(),
                json!(per_acquisition(
                    base_commands.saturating_sub(base.probe_commands),
                    base_n
                )),
            );
            fields.insert(
                "exclusive_client_requests_per_acquisition".into(),
                json!(per_acquisition(base_script_calls, base_n)),
            );
            fields.insert("exclusive_violations".into(), json!(base.violations));
            fields.insert("readers_inside_max".into(), json!(report.max_inside));
        }
        Mode::Shared => {
            fields.insert("writers".into(), json!(cli.writers));
            fields.insert("writer_waits".into(), writers_summary(&writer_waits));
        }
        Mode::Permits => {
            fields.insert("permits".into(), json!(cli.permits));
            fields.insert("permits_inside_max".into(), json!(report.max_inside));
        }
    }
    if cli.json {
        println!("{row}");
        return Ok(());
    }
    println!(
        "contended{}, {}{}: {} workers in {} process(es), {} round(s) of {} s on {}{}, body {} ms",
        if cli.fair { " (fair)" } else { "" },
        mode_name(cli.mode),
        match cli.mode {
            Mode::Permits => format!(" ({} permits)", cli.permits),
            Mode::Shared if mixed => format!(" ({} writers)", cli.writers),
            Mode::Shared | Mode::Exclusive => String::new(),
        },
        cli.workers,
        cli.procs.max(1),
        rounds,
        cli.seconds,
        match cli.keys {
            1 => "one key".to_owned(),
            k => format!("{k} keys per request"),
        },
        match &servers {
            Some(servers) => format!(" of {}", servers.describe()),
            None => String::new(),
        },
        cli.body_ms
    );
    if let Some(reason) = unfair_because {
        println!("  fairness                asked fair, ran unfair: {reason}");
    }
    if let Some(spread) = &spread {
        println!(
            "  keys' slots             {} slots; per primary {spread:?}",
            cli.keys
        );
    }
    println!("  acquisitions            {n} ({acquisitions_per_s:.0}/s)");
    match cli.mode {
        Mode::Exclusive => println!(
            "  1 worker, same rounds   {baseline_per_s:.0}/s  (ratio {vs_baseline:.2}, median of rounds)"
        ),
        Mode::Shared if !mixed => {
            println!(
                "  exclusive, same workers {baseline_per_s:.0}/s  (readers / exclusive {vs_baseline:.2}, median of rounds)"
            );
            println!(
                "  exclusive phase         {:.1} lock commands, {:.2} client requests per acquisition; {} violations",
                per_acquisition(base_commands.saturating_sub(base.probe_commands), base_n),
                per_acquisition(base_script_calls, base_n),
                base.violations
            );
        }
        Mode::Shared | Mode::Permits => {}
    }
    println!(
        "  wait mean/p50/p99/max   {:.1} / {:.1} / {:.1} / {:.1} ms",
        ms(mean_wait),
        ms(quantile(&waits, 0.5)),
        ms(quantile(&waits, 0.99)),
        ms(quantile(&waits, 1.0))
    );
    println!(
        "  p99 / mean wait         {p99_over_mean:.2}  (median of rounds; {pooled_p99_over_mean:.2} pooled)"
    );
    match cli.mode {
        Mode::Permits => println!(
            "  permits busy            {inside_mean:.2} of {} on average, {} at most",
            cli.permits, report.max_inside
        ),
        Mode::Shared if !mixed => println!(
            "  readers inside          {inside_mean:.1} on average, {} at most",
            report.max_inside
        ),
        Mode::Shared | Mode::Exclusive => {
            println!("  holders inside          {inside_mean:.2} on average")
        }
    }
    println!("  attempts/acquisition    {attempts:.2}");
    println!(
        "  Redis commands/acq.     {commands_per_acquisition:.1}  (scripts' own and the bench's checks included)"
    );
    println!("  lock's commands/acq.    {lock_commands:.1}  (scripts' own included)");
    if cli.topology == Topology::Cluster {
        println!(
            "  replicated/acq.         {:.1}  (the replicas' commands, not in the counts above)",
            per_acquisition(replicated, n)
        );
    }
    println!("  client requests/acq.    {client_requests:.2}  (EVALSHA + EVAL)");
    println!("  by hand-off             {}", report.handed_over);
    println!("  hand-off share          {handoff_share:.3}");
    println!("  Jain fairness           {jain:.3}");
    println!("  violations              {}", report.violations);
    println!(
        "  fencing inversions      {}",
        fence_inversions.map_or_else(|| "-".to_owned(), |n| n.to_string())
    );
    println!("  timeouts                {}", report.timeouts);
    if mixed {
        print_writers(&writers_summary(&writer_waits));
    }
    Ok(())
}

/// The writers' lines of a mixed `contended` run, from [`writers_summary`].
fn print_writers(s: &serde_json::Value) {
    let f = |key: &str| s[key].as_f64().unwrap_or(f64::NAN);
    let u = |key: &str| s[key].as_u64().unwrap_or(0);
    println!(
        "  writers                 {} acquisitions, wait mean/p99/max {:.1} / {:.1} / {:.1} ms",
        u("writer_acquisitions"),
        f("wait_mean_ms"),
        f("wait_p99_ms"),
        f("wait_max_ms")
    );
    println!(
        "  ahead of a writer       those arrived before it and not yet out; {} writers had nobody ahead (wait max {:.1} ms)",
        u("nobody_ahead"),
        f("nobody_ahead_wait_max_ms")
    );
    println!(
        "  wait / ahead's last exit max {:.2} (wait {:.1} ms for {:.1} ms), p99 {:.2}, p50 {:.2}",
        f("wait_over_ahead_span_max"),
        s["worst"]["wait_ms"].as_f64().unwrap_or(f64::NAN),
        s["worst"]["ahead_span_ms"].as_f64().unwrap_or(f64::NAN),
        f("wait_over_ahead_span_p99"),
        f("wait_over_ahead_span_p50")
    );
    println!(
        "  wait - ahead's last exit max {:.2} ms, p99 {:.2} ms, p50 {:.2} ms",
        f("excess_over_ahead_span_max_ms"),
        f("excess_over_ahead_span_p99_ms"),
        f("excess_over_ahead_span_p50_ms")
    );
    println!(
        "  wait <= 1.2 x bodies ahead  {} of {} writers with someone ahead (max wait / bodies {:.2})",
        u("within_1_2x_bodies_ahead"),
        u("with_someone_ahead"),
        f("wait_over_bodies_ahead_max")
    );
    println!(
        "  overtaken               {} writers entered after a later arrival (latest by {:.2} ms)",
        u("overtaken"),
        f("overtaken_by_max_ms")
    );
}

/// The waits of `acquisitions`, and their mean.
fn wait_times(acquisitions: &[Acquisition]) -> (Vec<Duration>, Duration) {
    let waits: Vec<Duration> = acquisitions
        .iter()
        .map(|a| Duration::from_micros(a.wait_us))
        .collect();
    let mean = waits
        .iter()
        .sum::<Duration>()
        .checked_div(u32::try_from(waits.len()).unwrap_or(u32::MAX))
        .unwrap_or_default();
    (waits, mean)
}

/// The 99th percentile wait over the mean wait of `acquisitions`.
fn p99_over_mean(acquisitions: &[Acquisition]) -> f64 {
    let (waits, mean) = wait_times(acquisitions);
    quantile(&waits, 0.99).as_secs_f64() / mean.as_secs_f64().max(1e-9)
}

/// CPU time (user + system) this process has used, from /proc (Linux).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // Clock ticks are 100 per second on Linux for every common configuration.
    Some(Duration::from_millis((utime + stime) * 10))
}

/// Resident set size in MiB, from /proc (Linux).
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// What holding `leases` leases for a while cost.
struct Held {
    acquired_in: Duration,
    renewals_per_s: f64,
    lost: usize,
    cpu_share: Option<f64>,
    rss: Option<f64>,
    rss_growth: Option<f64>,
}

/// Leases on `held:0` .. `held:{n-1}` with `ttl`, renewed or not, 256 requests out at a time.
async fn hold_many(
    locks: &LockManager,
    n: u32,
    ttl: Duration,
    renew: bool,
) -> Fallible<Vec<distlock_runtime::Lease>> {
    let mut held = Vec::with_capacity(n as usize);
    let mut pending = tokio::task::JoinSet::new();
    let mut collect = |joined: Result<Result<_, LockError>, tokio::task::JoinError>| {
        held.push(
            joined
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?,
        );
        Fallible::Ok(())
    };
    for i in 0..n {
        let locks = locks.clone();
        pending.spawn(async move {
            let request = locks.lock(format!("held:{i}")).ttl(ttl).renew(renew);
            request.acquire().await
        });
        if pending.len() >= 256 {
            if let Some(joined) = pending.join_next().await {
                collect(joined)?;
            }
        }
    }
    while let Some(joined) = pending.join_next().await {
        collect(joined)?;
    }
    Ok(held)
}

async fn measure_held(url: &str, leases: u32, ttl: Duration, hold: Duration) -> Fallible<Held> {
    let locks = manager(url)?;
    let mut conn = connection(url).await?;
    let rss_before = rss_mib();
    let acquire_started = Instant::now();
    let held = hold_many(&locks, leases, ttl, true).await?;
    let acquired_in = acquire_started.elapsed();

    let evalsha_before = command_calls(&mut conn, "evalsha").await?;
    let cpu_before = cpu_time();
    tokio::time::sleep(hold).await;
    let cpu = cpu_time().zip(cpu_before).map(|(a, b)| a.saturating_sub(b));
    let renewals = command_calls(&mut conn, "evalsha")
        .await?
        .saturating_sub(evalsha_before);
    let rss = rss_mib();
    let lost = held.iter().filter(|l| l.is_lost()).count();
    for lease in held {
        let _ = lease.release().await;
    }
    remove_counters(
        &mut conn,
        locks.prefix(),
        (0..leases).map(|i| format!("held:{i}")),
    )
    .await?;
    Ok(Held {
        acquired_in,
        renewals_per_s: renewals as f64 / hold.as_secs_f64(),
        lost,
        cpu_share: cpu.map(|c| c.as_secs_f64() / hold.as_secs_f64()),
        rss,
        rss_growth: rss.zip(rss_before).map(|(a, b)| a - b),
    })
}

async fn held(cli: &Cli, url: &str) -> Fallible<()> {
    let hold = Duration::from_secs(cli.seconds.min(86_400));
    let ttl = Duration::from_millis(cli.ttl_ms);
    let m = measure_held(url, cli.leases, ttl, hold).await?;
    let row = json!({
        "scenario": "held",
        "leases": cli.leases,
        "ttl_ms": cli.ttl_ms,
        "seconds": cli.seconds,
        "acquired_in_ms": ms(m.acquired_in),
        "renewal_round_trips_per_s": m.renewals_per_s,
        "leases_lost": m.lost,
        "client_cpu_share_of_one_core": m.cpu_share,
        "rss_mib": m.rss,
        "rss_growth_mib": m.rss_growth,
    });
    if cli.json {
        println!("{row}");
    } else {
        println!(
            "held: {} leases, ttl {} ms, held {} s",
            cli.leases, cli.ttl_ms, cli.seconds
        );
        println!("  acquired in             {:.0} ms", ms(m.acquired_in));
        println!("  renewal round trips/s   {:.1}", m.renewals_per_s);
        println!("  leases lost             {}", m.lost);
        if let Some(share) = m.cpu_share {
            println!(
                "  client CPU              {:.1}% of one core",
                share * 100.0
            );
        }
        if let Some(rss) = m.rss {
            println!("  client RSS              {rss:.1} MiB");
        }
    }
    Ok(())
}

/// The election the `election` scenario's candidates campaign for, and the key its polling
/// candidates (`--poll-ms`) try instead.
const ELECTION: &str = "bench";
const POLLED_KEY: &str = "leader";

/// How the candidates of `election` wait for the lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// `Election::run`: queued fair waiters.
    Campaign,
    /// A loop of `try_lock` and a sleep of this long, what a service does without elections.
    Poll(Duration),
}

impl Waiting {
    fn of(cli: &Cli) -> Self {
        cli.poll_ms.map_or(Waiting::Campaign, |ms| {
            Waiting::Poll(Duration::from_millis(ms))
        })
    }

    fn name(self) -> &'static str {
        match self {
            Waiting::Campaign => "campaign",
            Waiting::Poll(_) => "poll",
        }
    }
}

/// `election-worker`: this process's `--candidates` candidates, tasks of one manager labelled
/// `--label`, which serve until the process is killed. Prints `ready` once they are started.
async fn election_worker(cli: &Cli, url: &str) -> Fallible<()> {
    let prefix =
        std::env::var("DISTLOCK_BENCH_PREFIX").map_err(|_| "missing DISTLOCK_BENCH_PREFIX")?;
    let locks = LockManager::builder()
        .url(url)
        .prefix(prefix)
        .holder_label(
            cli.label
                .clone()
                .unwrap_or_else(|| std::process::id().to_string()),
        )
        .build()
        .map_err(|e| e.to_string())?;
    let ttl = Duration::from_millis(cli.ttl_ms);
    let election = locks.election(ELECTION).ttl(ttl);
    let mut candidates = tokio::task::JoinSet::new();
    for _ in 0..cli.candidates {
        match Waiting::of(cli) {
            Waiting::Campaign => {
                let election = election.clone();
                candidates.spawn(async move {
                    // The leader keeps its term, and so the lead, for ever.
                    let lead = |term| async move {
                        let _term = term;
                        std::future::pending::<()>().await
                    };
                    match election.run(lead).await {
                        Ok(never) => match never {},
                        Err(e) => Fallible::Err(e.to_string()),
                    }
                });
            }
            Waiting::Poll(every) => {
                candidates.spawn(poll_for_lead(locks.clone(), ttl, every));
            }
        }
    }
    println!("ready");
    match candidates.join_next().await {
        Some(Ok(Err(e))) => Err(e),
        Some(Err(e)) => Err(e.to_string()),
        _ => Err("a candidate stopped".into()),
    }
}

/// A candidate without elections: tries the lock every `every`, and keeps it (renewed) once it
/// has it, until it is lost.
async fn poll_for_lead(locks: LockManager, ttl: Duration, every: Duration) -> Fallible<()> {
    loop {
        match locks.try_lock(POLLED_KEY).ttl(ttl).acquire().await {
            Ok(lease) => lease.lost().await,
            Err(e) if e.is_contention() => {}
            Err(e) => return Err(e.to_string()),
        }
        tokio::time::sleep(every).await;
    }
}

/// The server's counters at one moment, from one `INFO stats commandstats`.
struct ServerCounts {
    /// `total_commands_processed`: every command, those scripts run included.
    commands: u64,
    calls: HashMap<String, u64>,
}

impl ServerCounts {
    async fn read(conn: &mut MultiplexedConnection) -> Fallible<Self> {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .arg("commandstats")
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        let commands = info
            .lines()
            .find_map(|l| {
                l.strip_prefix("total_commands_processed:")?
                    .trim()
                    .parse()
                    .ok()
            })
            .ok_or("INFO stats has no total_commands_processed")?;
        Ok(Self {
            commands,
            calls: command_calls_in(&info),
        })
    }

    fn calls(&self, counted: impl Fn(&str) -> bool) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| counted(name))
            .map(|(_, calls)| calls)
            .sum()
    }

    fn requests(&self) -> u64 {
        self.calls(|name| !distlock_tests::NOT_REQUESTS.contains(&name))
    }

    fn script_calls(&self) -> u64 {
        self.calls(|name| matches!(name, "evalsha" | "eval"))
    }

    /// Every command but INFO (the counts of a reply leave out its own INFO).
    fn commands_but_info(&self) -> u64 {
        self.commands
            .saturating_sub(self.calls(|name| name == "info"))
    }
}

/// What one phase's waiting candidates cost Redis, per second.
struct WaitingCost {
    requests: f64,
    script_calls: f64,
    commands: f64,
    /// The same leader (owner token) before and after the window.
    leader_kept: bool,
    /// Fair waiters queued after the window.
    queued_at_end: usize,
}

impl WaitingCost {
    fn figures(&self) -> [(&'static str, f64); 3] {
        [
            ("client_requests_per_s", self.requests),
            ("script_calls_per_s", self.script_calls),
            ("redis_commands_per_s", self.commands),
        ]
    }

    fn row(&self, waiting_candidates: f64) -> serde_json::Value {
        let mut row = json!({
            "leader_kept": self.leader_kept,
            "queued_at_end": self.queued_at_end,
        });
        if let Some(fields) = row.as_object_mut() {
            for (name, per_s) in self.figures() {
                fields.insert(name.into(), json!(per_s));
                fields.insert(
                    format!("{name}_per_waiting_candidate"),
                    json!(per_s / waiting_candidates),
                );
            }
        }
        row
    }
}

/// Fails if one of the candidate processes has stopped.
fn all_running(children: &mut [tokio::process::Child]) -> Fallible<()> {
    for (p, child) in children.iter_mut().enumerate() {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("candidate process p{p} stopped: {status}"));
        }
    }
    Ok(())
}

/// Deletes every key under `prefix`.
async fn remove_prefixed(conn: &mut MultiplexedConnection, prefix: &str) -> Fallible<()> {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(&keys)
                .exec_async(conn)
                .await
                .map_err(|e| e.to_string())?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// One phase of `election`: starts the candidates in `--procs` processes of this program,
/// waits until one leads (and, campaigning, the others are queued) and one ttl more, counts the
/// server's commands for `--seconds`, and stops them.
async fn measure_waiting(cli: &Cli, url: &str, waiting: Waiting) -> Fallible<WaitingCost> {
    use tokio::io::AsyncBufReadExt;
    let prefix = format!("distlock-bench:{}:{}:", std::process::id(), waiting.name());
    // For the key names only: it sends nothing.
    let names = LockManager::builder()
        .url(url)
        .prefix(&prefix)
        .build()
        .map_err(|e| e.to_string())?;
    let key = match waiting {
        Waiting::Campaign => names.election(ELECTION).key(),
        Waiting::Poll(_) => POLLED_KEY.to_owned(),
    };
    let (lock_key, queue_key) = (names.redis_key(&key), format!("{prefix}queue:{{{key}}}"));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let procs = cli.procs.max(1);
    let mut children = Vec::new();
    for p in 0..procs {
        let here = cli.candidates / procs + u32::from(p < cli.candidates % procs);
        let poll = match waiting {
            Waiting::Poll(every) => vec!["--poll-ms".to_owned(), every.as_millis().to_string()],
            Waiting::Campaign => Vec::new(),
        };
        let mut child = tokio::process::Command::new(&exe)
            .arg("election-worker")
            .args(["--candidates", &here.to_string()])
            .args(["--ttl-ms", &cli.ttl_ms.to_string()])
            .args(["--redis-url", url])
            .args(["--label", &format!("p{p}")])
            .args(poll)
            .env("DISTLOCK_BENCH_PREFIX", &prefix)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let said = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
        if !matches!(said, Ok(Ok(Some(ref line))) if line == "ready") {
            return Err(format!("candidate process p{p} did not start"));
        }
        children.push(child);
    }
    let mut conn = connection(url).await?;
    let queued = match waiting {
        Waiting::Campaign => Some(cli.candidates as usize - 1),
        Waiting::Poll(_) => None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (held, in_queue): (bool, usize) = redis::pipe()
            .exists(&lock_key)
            .llen(&queue_key)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if held && queued.is_none_or(|n| n == in_queue) {
            break;
        }
        all_running(&mut children)?;
        if Instant::now() > deadline {
            return Err(format!(
                "after 30 s: key held {held}, {in_queue} candidates queued (expected {queued:?})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ttl = Duration::from_millis(cli.ttl_ms);
    tokio::time::sleep(ttl).await;
    // The owner token, without the mark a waiter puts before it.
    let leader = |conn: &mut MultiplexedConnection| {
        let mut conn = conn.clone();
        let lock_key = lock_key.clone();
        async move {
            let value: Option<String> = redis::cmd("GET")
                .arg(&lock_key)
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            Fallible::Ok(value.map(|v| v.trim_start_matches('~').to_owned()))
        }
    };
    let leader_before = leader(&mut conn).await?;
    let (before, started) = (ServerCounts::read(&mut conn).await?, Instant::now());
    tokio::time::sleep(Duration::from_secs(cli.seconds.min(86_400))).await;
    let (after, took) = (ServerCounts::read(&mut conn).await?, started.elapsed());
    let leader_after = leader(&mut conn).await?;
    let queued_at_end: usize = redis::cmd("LLEN")
        .arg(&queue_key)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    all_running(&mut children)?;
    for child in &mut children {
        child.kill().await.map_err(|e| e.to_string())?;
    }
    remove_prefixed(&mut conn, &prefix).await?;
    let per_s = |a: u64, b: u64| a.saturating_sub(b) as f64 / took.as_secs_f64();
    Ok(WaitingCost {
        requests: per_s(after.requests(), before.requests()),
        script_calls: per_s(after.script_calls(), before.script_calls()),
        commands: per_s(after.commands_but_info(), before.commands_but_info()),
        leader_kept: leader_before.is_some() && leader_before == leader_after,
        queued_at_end,
    })
}

/// `election`: what `--candidates` candidates cost Redis while one leads, campaigning and, with
/// `--poll-ms`, polling.
async fn election(cli: &Cli, url: &str) -> Fallible<()> {
    if cli.candidates < 2 {
        return Err("--candidates must be at least 2: one leads, the others wait".into());
    }
    let waiting_candidates = f64::from(cli.candidates - 1);
    let campaign = measure_waiting(cli, url, Waiting::Campaign).await?;
    let poll = match Waiting::of(cli) {
        Waiting::Poll(every) => Some((
            every,
            measure_waiting(cli, url, Waiting::Poll(every)).await?,
        )),
        Waiting::Campaign => None,
    };
    if cli.json {
        let mut row = json!({
            "scenario": "election",
            "candidates": cli.candidates,
            "procs": cli.procs.max(1),
            "ttl_ms": cli.ttl_ms,
            "seconds": cli.seconds,
            "campaign": campaign.row(waiting_candidates),
        });
        if let (Some(fields), Some((every, poll))) = (row.as_object_mut(), &poll) {
            fields.insert("poll_ms".into(), json!(every.as_millis()));
            fields.insert("poll".into(), poll.row(waiting_candidates));
            for ((name, polled), (_, campaigned)) in
                poll.figures().into_iter().zip(campaign.figures())
            {
                fields.insert(
                    format!("poll_over_campaign_{name}"),
                    json!(polled / campaigned),
                );
            }
        }
        println!("{row}");
        return Ok(());
    }
    println!(
        "election: {} candidates ({} waiting) in {} process(es), ttl {} ms, {} s measured one ttl after they settled",
        cli.candidates,
        cli.candidates - 1,
        cli.procs.max(1),
        cli.ttl_ms,
        cli.seconds
    );
    let labels = [
        "client requests",
        "script calls (EVALSHA + EVAL)",
        "Redis commands (scripts' own incl.)",
    ];
    let print = |title: &str, cost: &WaitingCost| {
        println!(
            "{title:<38} {:>12} {:>24}",
            "per second", "per waiting candidate"
        );
        for (label, (_, per_s)) in labels.iter().zip(cost.figures()) {
            println!(
                "  {label:<36} {per_s:>12.2} {:>24.4}",
                per_s / waiting_candidates
            );
        }
        println!(
            "  leader {}, {} queued at the end",
            if cost.leader_kept {
                "unchanged"
            } else {
                "changed in the window"
            },
            cost.queued_at_end
        );
    };
    print("campaigning (Election::run)", &campaign);
    if let Some((every, poll)) = &poll {
        print(
            &format!("polling (try_lock every {} ms)", every.as_millis()),
            poll,
        );
        println!("polling / campaigning");
        for (label, ((_, polled), (_, campaigned))) in labels
            .iter()
            .zip(poll.figures().into_iter().zip(campaign.figures()))
        {
            println!("  {label:<36} {:>12.1} x", polled / campaigned);
        }
    }
    Ok(())
}

/// How the cost grows: keys per request (1, 4, 16, 64 in one slot; uncontended cycles,
/// interleaved in rounds, as a ratio of one key's rate), and leases held at once (1, 1k, 10k:
/// renewal round trips per second, client CPU, memory per lease).
async fn growth(cli: &Cli, url: &str) -> Fallible<()> {
    let locks = manager(url)?;
    let sizes = [1usize, 4, 16, 64];
    // One slot on a cluster too: the braces are the template's own hash tag.
    let key_sets: Vec<Vec<String>> = sizes
        .iter()
        .map(|&n| (0..n).map(|i| format!("{{grow}}:{n}:{i}")).collect())
        .collect();
    let cycle = |keys: Vec<String>, n: u32| {
        let locks = locks.clone();
        async move {
            let mut cycles = Cycles::default();
            let started = Instant::now();
            for _ in 0..n {
                let t = Instant::now();
                let lease = locks
                    .lock_all(keys.clone())
                    .acquire()
                    .await
                    .map_err(|e| e.to_string())?;
                lease.release().await.map_err(|e| e.to_string())?;
                cycles.latencies.push(t.elapsed());
            }
            cycles.total = started.elapsed();
            Fallible::Ok(cycles)
        }
    };
    for keys in &key_sets {
        cycle(keys.clone(), 200).await?;
    }
    let rounds = 20;
    let per_round = (cli.cycles / rounds / 4).max(1);
    let mut results: Vec<Cycles> = sizes.iter().map(|_| Cycles::default()).collect();
    for _ in 0..rounds {
        for (keys, total) in key_sets.iter().zip(&mut results) {
            total.add_round(cycle(keys.clone(), per_round).await?);
        }
    }
    let mut conn = connection(url).await?;
    remove_counters(&mut conn, locks.prefix(), key_sets.iter().flatten()).await?;
    let ratio = |i: usize| {
        let mut ratios: Vec<f64> = results[i]
            .round_rates
            .iter()
            .zip(&results[0].round_rates)
            .map(|(x, y)| x / y)
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
    };
    println!(
        "{:<22} {:>10} {:>10} {:>12} {:>14}",
        "keys per request", "cycles/s", "p50", "vs 1 key", "per key (us)"
    );
    for (i, (&n, c)) in sizes.iter().zip(&results).enumerate() {
        println!(
            "{:<22} {:>10.0} {:>8.1}us {:>12.3} {:>14.1}",
            n,
            c.per_second(),
            us(c.quantile(0.5)),
            ratio(i),
            us(c.quantile(0.5)) / n as f64
        );
    }
    println!();
    let hold = Duration::from_secs(cli.seconds.min(86_400));
    let ttl = Duration::from_millis(cli.ttl_ms);
    println!(
        "{:<22} {:>14} {:>12} {:>14} {:>10}",
        "leases held", "renewal rt/s", "client CPU", "RSS per lease", "lost"
    );
    for leases in [1u32, 1_000, 10_000] {
        let m = measure_held(url, leases, ttl, hold).await?;
        let per_lease = m.rss_growth.map_or_else(
            || "-".to_owned(),
            |g| format!("{:.2} KiB", g * 1024.0 / f64::from(leases)),
        );
        println!(
            "{:<22} {:>14.1} {:>11.1}% {:>14} {:>10}",
            leases,
            m.renewals_per_s,
            m.cpu_share.unwrap_or(f64::NAN) * 100.0,
            per_lease,
            m.lost
        );
    }
    Ok(())
}

/// `scale`'s loads, each on a server of its own: keys held by another process; fair waiters
/// another process queues behind a few keys it holds; processes running the cycle at once.
const SCALE_HELD_KEYS: u32 = 100_000;
const SCALE_WAITED_KEYS: u32 = 10;
const SCALE_WAITERS_PER_KEY: u32 = 100;
const SCALE_PROCS: usize = 8;
/// How long `scale`'s loads hold and wait: longer than any run, so that none expires, is
/// renewed or gives up while it runs (the loads cost nothing but what they leave in Redis).
const SCALE_HOLD: Duration = Duration::from_secs(3_600);

/// A manager on `url` under the prefix of the process that started this one.
fn child_manager(url: &str) -> Fallible<LockManager> {
    let prefix =
        std::env::var("DISTLOCK_BENCH_PREFIX").map_err(|_| "missing DISTLOCK_BENCH_PREFIX")?;
    LockManager::builder()
        .url(url)
        .prefix(prefix)
        .build()
        .map_err(|e| e.to_string())
}

/// A process of this program running `scenario` (a hidden one) on `url` under `prefix`, once
/// it printed `ready` (within `within`), and the lines it prints after.
async fn spawn_ready(
    scenario: Scenario,
    url: &str,
    prefix: &str,
    within: Duration,
) -> Fallible<(
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
)> {
    use tokio::io::AsyncBufReadExt;
    let mut child =
        tokio::process::Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .arg(scenario_name(scenario))
            .args(["--redis-url", url])
            .env("DISTLOCK_BENCH_PREFIX", prefix)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    match tokio::time::timeout(within, lines.next_line()).await {
        Ok(Ok(Some(line))) if line == "ready" => Ok((child, lines)),
        _ => Err(format!(
            "the {} process was not ready within {} s",
            scenario_name(scenario),
            within.as_secs()
        )),
    }
}

/// `scale-holder`: holds `SCALE_HELD_KEYS` keys (not renewed: their ttl outlasts the run) until
/// it is killed.
async fn scale_holder(url: &str) -> Fallible<()> {
    let locks = child_manager(url)?;
    let held = hold_many(&locks, SCALE_HELD_KEYS, SCALE_HOLD, false).await?;
    println!("ready");
    std::future::pending::<()>().await;
    drop(held);
    Ok(())
}

/// The key of waited-for key `k` in `scale`, and its queue's Redis key under `prefix`.
fn waited_key(k: u32) -> String {
    format!("busy:{k}")
}

/// `scale-waiters`: holds `SCALE_WAITED_KEYS` keys and queues `SCALE_WAITERS_PER_KEY` fair
/// waiters behind each until it is killed; `ready` once all are queued.
async fn scale_waiters(url: &str) -> Fallible<()> {
    let locks = child_manager(url)?;
    let mut holders = Vec::new();
    for k in 0..SCALE_WAITED_KEYS {
        let request = locks.lock(waited_key(k)).ttl(SCALE_HOLD).renew(false);
        holders.push(request.acquire().await.map_err(|e| e.to_string())?);
    }
    let mut waiters = tokio::task::JoinSet::new();
    for k in 0..SCALE_WAITED_KEYS {
        for _ in 0..SCALE_WAITERS_PER_KEY {
            let request = locks.lock(waited_key(k)).fair(true).wait(SCALE_HOLD);
            waiters.spawn(request.acquire());
        }
    }
    let mut conn = connection(url).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while queued(&mut conn, locks.prefix()).await? < SCALE_WAITED_KEYS * SCALE_WAITERS_PER_KEY {
        if let Some(stopped) = waiters.try_join_next() {
            return Err(format!("a waiter stopped: {stopped:?}"));
        }
        if Instant::now() > deadline {
            return Err("the waiters did not all queue within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("ready");
    let stopped = waiters.join_next().await;
    drop(holders);
    Err(format!("a waiter stopped: {stopped:?}"))
}

/// The fair waiters queued on `scale`'s waited-for keys under `prefix`.
async fn queued(conn: &mut MultiplexedConnection, prefix: &str) -> Fallible<u32> {
    let mut pipe = redis::pipe();
    for k in 0..SCALE_WAITED_KEYS {
        pipe.llen(format!("{prefix}queue:{{{}}}", waited_key(k)));
    }
    let lengths: Vec<u32> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
    Ok(lengths.iter().sum())
}

/// Cycles on `key` until `run` has passed (a few cycles over it).
async fn cycles_for(locks: &LockManager, key: &str, fair: bool, run: Duration) -> Fallible<Cycles> {
    let mut cycles = Cycles::default();
    while cycles.total < run {
        let batch = uncontended_cycles(locks, key, Role::Exclusive, 20, fair).await?;
        cycles.latencies.extend(batch.latencies);
        cycles.total += batch.total;
    }
    Ok(cycles)
}

/// What one `scale-cycler` run reports.
#[derive(Serialize, Deserialize)]
struct CyclerRun {
    per_s: f64,
    p50_us: f64,
}

/// `scale-cycler`: the cycle on a key of its own, for each line `fair MS` or `unfair MS` read,
/// for MS milliseconds, printing a [`CyclerRun`]; until its input ends.
async fn scale_cycler(url: &str) -> Fallible<()> {
    let locks = child_manager(url)?;
    let key = format!("scale:{}", std::process::id());
    for fair in [true, false] {
        uncontended_cycles(&locks, &key, Role::Exclusive, 200, fair).await?;
    }
    println!("ready");
    // A blocking read on its own thread: the process has nothing else to do meanwhile.
    let next_line = || {
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let read = std::io::stdin().read_line(&mut line);
            read.map(|n| (n > 0).then(|| line.trim_end().to_owned()))
        })
    };
    while let Some(line) = next_line()
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?
    {
        let (fair, ms) = match line.split_once(' ') {
            Some(("fair", ms)) => (true, ms),
            Some(("unfair", ms)) => (false, ms),
            _ => return Err(format!("scale-cycler: unknown command {line:?}")),
        };
        let run = Duration::from_millis(ms.parse().map_err(|_| format!("bad duration {ms:?}"))?);
        let cycles = cycles_for(&locks, &key, fair, run).await?;
        let report = CyclerRun {
            per_s: cycles.per_second(),
            p50_us: us(cycles.quantile(0.5)),
        };
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
    }
    Ok(())
}

/// One condition of `scale`, for one fairness: its cycles (one process), or its processes'
/// rates and p50s, and the ratios to the baseline of the same round.
#[derive(Default)]
struct ScaleRow {
    cycles: Cycles,
    p50s_us: Vec<f64>,
    ratios: Vec<f64>,
}

impl ScaleRow {
    fn add_round(&mut self, round: Cycles, baseline_per_s: f64) {
        self.ratios.push(round.per_second() / baseline_per_s);
        self.cycles.add_round(round);
    }

    /// cycles/s (the median process's for several), p50 in µs, and the median ratio.
    fn figures(&self) -> (f64, f64, f64) {
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        if self.p50s_us.is_empty() {
            let p50 = us(self.cycles.quantile(0.5));
            (self.cycles.per_second(), p50, median(&self.ratios))
        } else {
            let rates = &self.cycles.round_rates;
            (median(rates), median(&self.p50s_us), median(&self.ratios))
        }
    }
}

/// `scale`: the uncontended exclusive cycle (fair, then unfair) in four conditions, interleaved
/// round by round: on an idle server (the baseline); on a server where another process holds
/// `SCALE_HELD_KEYS` keys; on one where another queues fair waiters behind a few keys; and in
/// `SCALE_PROCS` processes at once on the baseline's server, each on a key of its own for as
/// long as the baseline's cycles took. Each condition's rate is a ratio of the baseline's in
/// the same round (per process, for the processes), and the median reported.
async fn scale(cli: &Cli, url: &str) -> Fallible<()> {
    let rounds = cli.rounds.unwrap_or(10).max(1);
    let per_round = (cli.cycles / rounds).max(1);
    let prefix = format!("distlock-bench:{}:scale:", std::process::id());
    let (held_redis, waited_redis) = (LocalRedis::start()?, LocalRedis::start()?);
    eprintln!("bench: {SCALE_HELD_KEYS} keys being taken, and fair waiters queued");
    let (_holder, _) = spawn_ready(
        Scenario::ScaleHolder,
        &held_redis.url,
        &prefix,
        Duration::from_secs(600),
    )
    .await?;
    let (_waiters, _) = spawn_ready(
        Scenario::ScaleWaiters,
        &waited_redis.url,
        &prefix,
        Duration::from_secs(120),
    )
    .await?;
    let mut cyclers = Vec::new();
    for _ in 0..SCALE_PROCS {
        let (mut child, lines) =
            spawn_ready(Scenario::ScaleCycler, url, &prefix, Duration::from_secs(60)).await?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        cyclers.push((child, stdin, lines));
    }
    let managers = [
        manager(url)?,
        manager(&held_redis.url)?,
        manager(&waited_redis.url)?,
    ];
    for locks in &managers {
        for fair in [true, false] {
            uncontended_cycles(locks, "scale", Role::Exclusive, 500.min(per_round), fair).await?;
        }
    }
    // By fairness (fair, unfair), the conditions: baseline, held keys, waiters, processes.
    let mut rows: [[ScaleRow; 4]; 2] = Default::default();
    for _ in 0..rounds {
        for (fair, rows) in [true, false].into_iter().zip(&mut rows) {
            let baseline =
                uncontended_cycles(&managers[0], "scale", Role::Exclusive, per_round, fair).await?;
            let (base_per_s, took) = (baseline.per_second(), baseline.total);
            rows[0].add_round(baseline, base_per_s);
            for (locks, row) in managers[1..].iter().zip(&mut rows[1..3]) {
                let round =
                    uncontended_cycles(locks, "scale", Role::Exclusive, per_round, fair).await?;
                row.add_round(round, base_per_s);
            }
            let command = format!(
                "{} {}\n",
                if fair { "fair" } else { "unfair" },
                took.as_millis().max(1)
            );
            for (_, stdin, _) in &mut cyclers {
                use tokio::io::AsyncWriteExt;
                stdin
                    .write_all(command.as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            for (_, _, lines) in &mut cyclers {
                let line = lines.next_line().await.map_err(|e| e.to_string())?;
                let run: CyclerRun = serde_json::from_str(&line.ok_or("a cycler stopped")?)
                    .map_err(|e| format!("cycler output: {e}"))?;
                rows[3].ratios.push(run.per_s / base_per_s);
                rows[3].cycles.round_rates.push(run.per_s);
                rows[3].p50s_us.push(run.p50_us);
            }
        }
    }
    // The loads must still be there at the end, or the figures measured less.
    let mut waited = connection(&waited_redis.url).await?;
    let still_queued = queued(&mut waited, &prefix).await?;
    let held_keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut connection(&held_redis.url).await?)
        .await
        .map_err(|e| e.to_string())?;
    let mut conn = connection(url).await?;
    remove_counters(&mut conn, managers[0].prefix(), ["scale"]).await?;
    let conditions = [
        "baseline: idle server".to_owned(),
        format!("{SCALE_HELD_KEYS} keys held by another process"),
        format!(
            "{} fair waiters on {SCALE_WAITED_KEYS} other keys",
            SCALE_WAITED_KEYS * SCALE_WAITERS_PER_KEY
        ),
        format!("{SCALE_PROCS} processes at once (each)"),
    ];
    if cli.json {
        let mut table = Vec::new();
        for (fair, rows) in [true, false].into_iter().zip(&rows) {
            for (name, row) in conditions.iter().zip(rows) {
                let (per_s, p50, ratio) = row.figures();
                table.push(json!({
                    "condition": name,
                    "fair": fair,
                    "cycles_per_s": per_s.round(),
                    "p50_us": p50.round(),
                    "vs_baseline": ratio,
                }));
            }
        }
        println!(
            "{}",
            json!({
                "scenario": "scale",
                "rounds": rounds,
                "cycles_per_round": per_round,
                "rows": table,
                "held_server_keys_at_end": held_keys,
                "waiters_queued_at_end": still_queued,
            })
        );
        return Ok(());
    }
    println!(
        "scale: the uncontended exclusive cycle, {rounds} round(s) of {per_round} cycles per condition, interleaved"
    );
    println!(
        "{:<44} {:>6} {:>10} {:>10} {:>12}",
        "condition", "fair", "cycles/s", "p50", "vs baseline"
    );
    for (fair, rows) in [true, false].into_iter().zip(&rows) {
        for (name, row) in conditions.iter().zip(rows) {
            let (per_s, p50, ratio) = row.figures();
            println!(
                "{name:<44} {:>6} {per_s:>10.0} {p50:>8.1}us {ratio:>12.3}",
                if fair { "yes" } else { "no" }
            );
        }
    }
    println!();
    println!("vs baseline: median of per-round throughput ratios (for the processes: over processes and rounds); cycles/s and p50 of the processes: the median process's");
    println!(
        "at the end: {held_keys} keys on the held keys' server (the held locks' and their fencing counters), {still_queued} waiters queued"
    );
    Ok(())
}
