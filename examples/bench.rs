//! The benchmark program: `cargo run --release --example bench -- <scenario> [options]`.
//!
//! Scenarios (each prints a table; `--json` prints one JSON line instead):
//! - `raw`: the floor. `SET NX PX` + an owner-checked delete script, sequential, on the same
//!   client and connection type distlock uses (one redis-rs multiplexed connection).
//! - `uncontended`: one task, `acquire` + `release` on one key (fencing token included), with
//!   `fair(false)`.
//! - `uncontended-fair`: the same with `fair(true)` (the default).
//! - `macro`: the fair cycle through a `#[distributed_lock]` fn (fair, the default), compared
//!   with `uncontended-fair`.
//! - `contended`: W workers (across P processes with `--procs`; fair with `--fair`) on one key,
//!   each critical section checking exclusion with a `SET NX` marker. A one-worker phase with
//!   the same options runs first, and the contended rate is reported as a ratio of it; with
//!   `--rounds R` the two phases alternate R times and the median of the per-round ratios is
//!   reported (the machine's speed drifts between phases).
//! - `held`: K leases held (and renewed) at once for a while.
//!
//! `--compare` runs `raw`, `uncontended`, `macro` and `uncontended-fair` interleaved (50
//! rounds, each scenario back to back in every round) and prints the median of the per-round
//! throughput ratios. `--compare --topology cluster|sentinel|quorum` instead starts that
//! topology's servers locally and compares its uncontended cycle with one Redis's (and, for a
//! cluster or Sentinel, the cycle with `min_replicas(1)` with the cycle without).
//! Redis: `--redis-url`, else as the seckill demo finds one (REDIS_URL, 127.0.0.1:6379, or a
//! throwaway redis-server). Attempts per acquisition (`contended`) are the managers' own count
//! of acquire requests sent ([`LockManager::stats`]); renewal round trips (`held`) are read
//! from the server's `INFO commandstats`: give the bench a Redis of its own, or other clients'
//! commands count too.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use distlock_examples::local_redis::LocalRedis;
use distlock_runtime::{distributed_lock, LockError, LockManager};
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
    /// Run raw, uncontended and macro interleaved and print their ratios.
    #[arg(long)]
    compare: bool,
    /// Print one JSON line instead of a table.
    #[arg(long)]
    json: bool,
    /// Lock cycles per measurement (raw, uncontended, macro).
    #[arg(long, default_value_t = 20_000)]
    cycles: u32,
    /// Workers in all (contended), shared out among the processes.
    #[arg(long, default_value_t = 64)]
    workers: u32,
    /// Processes (contended).
    #[arg(long, default_value_t = 1)]
    procs: u32,
    /// Fair locking (contended): waiters queue and each release hands the lock to the oldest.
    #[arg(long)]
    fair: bool,
    /// Seconds of contention (contended, per round) or of holding (held).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds (contended): each runs the one-worker phase and then the contended one, and the
    /// median of the per-round ratios is reported.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Leases held at once (held).
    #[arg(long, default_value_t = 10_000)]
    leases: u32,
    /// Lease ttl in milliseconds (held; renewal every ttl/3).
    #[arg(long, default_value_t = 3_000)]
    ttl_ms: u64,
    /// Redis URL.
    #[arg(long)]
    redis_url: Option<String>,
    /// With --compare: start this topology locally and compare it with one Redis.
    #[arg(long, value_enum, default_value_t = Topology::Standalone)]
    topology: Topology,
    /// Internal: run contended workers in this process and print their records as JSON.
    #[arg(long, hide = true)]
    worker_base: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Raw,
    Uncontended,
    /// `uncontended` with `fair(true)`.
    UncontendedFair,
    Macro,
    Contended,
    Held,
    /// How the cost grows with keys per request and leases held.
    Growth,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let redis = match &cli.redis_url {
        Some(url) => Ok((url.clone(), None)),
        None => LocalRedis::find_or_start().map(|r| (r.url.clone(), Some(r))),
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
        (None, false, Some(Scenario::Growth)) => growth(&cli, &url).await,
        (None, false, Some(scenario)) => single(&cli, &url, scenario).await,
        (None, false, None) => Err(
            "name a scenario (raw, uncontended, macro, contended, held) or pass --compare".into(),
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
    LockManager::builder()
        .url(url)
        .prefix(format!("distlock-bench:{}:", std::process::id()))
        .build()
        .map_err(|e| e.to_string())
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

async fn uncontended_cycles(locks: &LockManager, n: u32, fair: bool) -> Fallible<Cycles> {
    let mut cycles = Cycles::default();
    let started = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let lease = locks
            .lock("uncontended")
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

async fn run_scenario(
    scenario: Scenario,
    conn: &mut MultiplexedConnection,
    locks: &LockManager,
    n: u32,
) -> Fallible<Cycles> {
    match scenario {
        Scenario::Raw => raw_cycles(conn, n).await,
        Scenario::Uncontended => uncontended_cycles(locks, n, false).await,
        Scenario::UncontendedFair => uncontended_cycles(locks, n, true).await,
        Scenario::Macro => macro_cycles(locks, n).await,
        Scenario::Contended | Scenario::Held | Scenario::Growth => {
            Err("not a cycle scenario".into())
        }
    }
}

fn scenario_name(s: Scenario) -> &'static str {
    match s {
        Scenario::Raw => "raw",
        Scenario::Uncontended => "uncontended",
        Scenario::UncontendedFair => "uncontended-fair",
        Scenario::Macro => "macro",
        Scenario::Contended => "contended",
        Scenario::Held => "held",
        Scenario::Growth => "growth",
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
    for &s in scenarios {
        run_scenario(s, &mut conn, &locks, 1_000.min(cli.cycles)).await?;
    }
    let rounds = 50;
    let per_round = (cli.cycles / rounds).max(1);
    let mut results: Vec<(Scenario, Cycles)> =
        scenarios.iter().map(|&s| (s, Cycles::default())).collect();
    for _ in 0..rounds {
        for (s, total) in &mut results {
            total.add_round(run_scenario(*s, &mut conn, &locks, per_round).await?);
        }
    }
    remove_counters(&mut conn, locks.prefix(), ["uncontended", "macro"]).await?;
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
    let results = measure(
        cli,
        url,
        &[
            Scenario::Raw,
            Scenario::Uncontended,
            Scenario::Macro,
            Scenario::UncontendedFair,
        ],
    )
    .await?;
    // The machine's speed drifts (other tenants, frequency scaling); scenarios run back to back
    // in every round, so the median of the per-round ratios is the robust comparison.
    let ratio = |a: usize, b: usize| {
        let mut ratios: Vec<f64> = results[a]
            .1
            .round_rates
            .iter()
            .zip(&results[b].1.round_rates)
            .map(|(x, y)| x / y)
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (uncontended, via_macro, fair) = (ratio(1, 0), ratio(2, 3), ratio(3, 0));
    if cli.json {
        println!(
            "{}",
            json!({
                "scenario": "compare",
                "raw": cycle_row("raw", &results[0].1),
                "uncontended": cycle_row("uncontended", &results[1].1),
                "macro": cycle_row("macro", &results[2].1),
                "uncontended_fair": cycle_row("uncontended-fair", &results[3].1),
                "uncontended_over_raw": uncontended,
                "macro_over_uncontended_fair": via_macro,
                "uncontended_fair_over_raw": fair,
            })
        );
    } else {
        print_cycles(&results);
        println!();
        println!(
            "uncontended / raw      = {uncontended:.3}  (median of per-round throughput ratios)"
        );
        println!("macro / uncontended-fair = {via_macro:.3}");
        println!("uncontended-fair / raw = {fair:.3}");
    }
    Ok(())
}

/// The uncontended cycle on a local cluster, Sentinel group or quorum, against the same cycle
/// on one Redis, interleaved in rounds; and the cost of `min_replicas(1)` where it applies.
async fn compare_topology(cli: &Cli, url: &str) -> Fallible<()> {
    let prefix = format!("distlock-bench:{}:", std::process::id());
    let servers = Servers::start(cli.topology).ok_or("standalone has nothing to compare")?;
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
        uncontended_cycles(locks, 1_000.min(cli.cycles), false).await?;
    }
    let rounds = 50;
    let per_round = (cli.cycles / rounds).max(1);
    let mut results: Vec<Cycles> = managers.iter().map(|_| Cycles::default()).collect();
    for _ in 0..rounds {
        for ((_, locks), total) in managers.iter().zip(&mut results) {
            total.add_round(uncontended_cycles(locks, per_round, false).await?);
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

/// One acquisition in the contended scenario.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Acquisition {
    /// Order of entry into the critical section (from `INCR`).
    seq: u64,
    /// The lease's fencing token: must increase with `seq`.
    fencing_token: u64,
    worker: u32,
    wait_us: u64,
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
}

impl WorkerReport {
    fn merge(&mut self, part: WorkerReport) {
        self.acquisitions.extend(part.acquisitions);
        self.violations += part.violations;
        self.timeouts += part.timeouts;
        self.acquire_requests += part.acquire_requests;
        self.handed_over += part.handed_over;
    }
}

const CONTENDED_KEY: &str = "contended";

/// Runs `cli.workers` workers in this process until `cli.seconds` pass.
async fn run_workers(cli: &Cli, url: &str, base: u32, prefix: &str) -> Fallible<WorkerReport> {
    let locks = LockManager::builder()
        .url(url)
        .prefix(prefix)
        .default_wait(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let conn = connection(url).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(cli.seconds.min(86_400));
    let marker = format!("{prefix}marker");
    let seq_key = format!("{prefix}seq");
    let fair = cli.fair;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..cli.workers {
        let (locks, mut conn, marker, seq_key) =
            (locks.clone(), conn.clone(), marker.clone(), seq_key.clone());
        tasks.spawn(async move {
            let mut report = WorkerReport::default();
            while tokio::time::Instant::now() < deadline {
                let t = Instant::now();
                let lease = match locks.lock(CONTENDED_KEY).fair(fair).acquire().await {
                    Ok(lease) => lease,
                    Err(e) if e.is_contention() => {
                        report.timeouts += 1;
                        continue;
                    }
                    Err(e) => return Err(e.to_string()),
                };
                let wait = t.elapsed();
                // Three separate round trips, so another holder could run in between them if
                // exclusion failed: the marker would then be found set.
                let entered: Option<String> = redis::cmd("SET")
                    .arg(&marker)
                    .arg(w)
                    .arg("NX")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let seq: u64 = redis::cmd("INCR")
                    .arg(&seq_key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let _: i64 = redis::cmd("DEL")
                    .arg(&marker)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if entered.is_none() {
                    report.violations += 1;
                }
                let fencing_token = lease.fencing_token();
                lease.release().await.map_err(|e| e.to_string())?;
                report.acquisitions.push(Acquisition {
                    seq,
                    fencing_token,
                    worker: base + w,
                    wait_us: u64::try_from(wait.as_micros()).unwrap_or(u64::MAX),
                });
            }
            Ok(report)
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

/// The `calls` of every command in `INFO commandstats`, summed: everything Redis ran, the
/// commands scripts call included. Give the bench a Redis of its own.
async fn all_command_calls(conn: &mut MultiplexedConnection) -> Fallible<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(":calls="))
        .filter_map(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
        .sum())
}

/// `calls` of one command in `INFO commandstats`.
async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> Fallible<u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let prefix = format!("cmdstat_{command}:calls=");
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

/// One round of `contended`: a one-worker phase, then the contended phase, each `cli.seconds`.
struct Round {
    report: WorkerReport,
    elapsed: Duration,
    sequential_per_s: f64,
    /// Redis commands run in the contended phase (scripts' own included).
    commands: u64,
    /// Entries into the critical section in `seq` order whose fencing token did not rise.
    fence_inversions: usize,
    /// Consecutive entries by different workers.
    handoffs: usize,
}

async fn contended_round(cli: &Cli, url: &str, round: u32) -> Fallible<Round> {
    let prefix = format!("distlock-bench:{}:{round}:", std::process::id());
    let mut conn = connection(url).await?;
    // The same round's sequential rate: one worker, one process, same lock options.
    let sequential = Cli {
        workers: 1,
        ..cli.clone()
    };
    let started = Instant::now();
    let single = run_workers(&sequential, url, 0, &format!("{prefix}w1:")).await?;
    let sequential_per_s = single.acquisitions.len() as f64 / started.elapsed().as_secs_f64();
    let _: () = redis::cmd("DEL")
        .arg(format!("{prefix}w1:seq"))
        .arg(format!("{prefix}w1:fence:{{{CONTENDED_KEY}}}"))
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;

    let commands_before = all_command_calls(&mut conn).await?;
    let started = Instant::now();
    let mut report = WorkerReport::default();
    if cli.procs <= 1 {
        report = run_workers(cli, url, 0, &prefix).await?;
    } else {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut children = Vec::new();
        let mut base = 0;
        for p in 0..cli.procs {
            // The W workers are shared out among the processes.
            let here = cli.workers / cli.procs + u32::from(p < cli.workers % cli.procs);
            children.push(
                tokio::process::Command::new(&exe)
                    .arg("contended")
                    .args(["--workers", &here.to_string()])
                    .args(["--seconds", &cli.seconds.to_string()])
                    .args(["--redis-url", url])
                    .args(["--worker-base", &base.to_string()])
                    .args(cli.fair.then_some("--fair"))
                    .env("DISTLOCK_BENCH_PREFIX", &prefix)
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
    // Every command Redis ran, those inside scripts included (the body's three too), less the
    // INFO calls that read the counts.
    let commands = all_command_calls(&mut conn)
        .await?
        .saturating_sub(commands_before)
        .saturating_sub(1);
    let _: () = redis::cmd("DEL")
        .arg(format!("{prefix}seq"))
        .arg(format!("{prefix}fence:{{{CONTENDED_KEY}}}"))
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    report.acquisitions.sort_by_key(|a| a.seq);
    // Entries into the critical section in order must carry increasing fencing tokens.
    let fence_inversions = report
        .acquisitions
        .windows(2)
        .filter(|w| w[1].fencing_token <= w[0].fencing_token)
        .count();
    let handoffs = report
        .acquisitions
        .windows(2)
        .filter(|w| w[0].worker != w[1].worker)
        .count();
    Ok(Round {
        report,
        elapsed,
        sequential_per_s,
        commands,
        fence_inversions,
        handoffs,
    })
}

/// `contended`: `cli.rounds` rounds, each a one-worker phase and then the contended one; the
/// ratio of their rates is taken per round (the machine's speed drifts) and its median reported.
async fn contended(cli: &Cli, url: &str) -> Fallible<()> {
    let mut report = WorkerReport::default();
    let (mut elapsed, mut commands, mut fence_inversions, mut handoffs) =
        (Duration::ZERO, 0u64, 0usize, 0usize);
    let mut sequential = Vec::new();
    let mut ratios = Vec::new();
    let mut tails = Vec::new();
    for round in 0..cli.rounds.max(1) {
        let r = contended_round(cli, url, round).await?;
        let n = r.report.acquisitions.len();
        ratios.push(n as f64 / r.elapsed.as_secs_f64() / r.sequential_per_s.max(1e-9));
        tails.push(p99_over_mean(&r.report.acquisitions));
        sequential.push(r.sequential_per_s);
        elapsed += r.elapsed;
        commands += r.commands;
        fence_inversions += r.fence_inversions;
        handoffs += r.handoffs;
        report.merge(r.report);
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let sequential_per_s = median(&mut sequential);
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
    let attempts = report.acquire_requests as f64 / (n.max(1) as f64);
    let commands_per_acquisition = commands as f64 / (n.max(1) as f64);
    let handoff_share = handoffs as f64 / (n.saturating_sub(1).max(1) as f64);
    // Per round, like the rate: a slow round's waits are all longer, which would widen a
    // distribution pooled over rounds.
    let pooled_p99_over_mean = p99_over_mean(&report.acquisitions);
    let p99_over_mean = median(&mut tails);
    let vs_sequential = median(&mut ratios);
    let row = json!({
        "scenario": "contended",
        "fair": cli.fair,
        "workers": cli.workers,
        "procs": cli.procs.max(1),
        "seconds": cli.seconds,
        "rounds": cli.rounds.max(1),
        "acquisitions": n,
        "acquisitions_per_s": acquisitions_per_s.round(),
        "sequential_per_s": sequential_per_s.round(),
        "vs_sequential": vs_sequential,
        "handed_over": report.handed_over,
        "wait_p99_over_mean": p99_over_mean,
        "wait_p99_over_mean_pooled": pooled_p99_over_mean,
        "wait_mean_ms": ms(mean_wait),
        "wait_p50_ms": ms(quantile(&waits, 0.5)),
        "wait_p99_ms": ms(quantile(&waits, 0.99)),
        "wait_max_ms": ms(quantile(&waits, 1.0)),
        "attempts_per_acquisition": attempts,
        "redis_commands_per_acquisition": commands_per_acquisition,
        "handoff_share": handoff_share,
        "jain_fairness": jain,
        "violations": report.violations,
        "fencing_inversions": fence_inversions,
        "timeouts": report.timeouts,
    });
    if cli.json {
        println!("{row}");
    } else {
        println!(
            "contended{}: {} workers in {} process(es), {} round(s) of {} s on one key",
            if cli.fair { " (fair)" } else { "" },
            cli.workers,
            cli.procs.max(1),
            cli.rounds.max(1),
            cli.seconds
        );
        println!("  acquisitions            {n} ({acquisitions_per_s:.0}/s)");
        println!(
            "  1 worker, same rounds   {sequential_per_s:.0}/s  (ratio {vs_sequential:.2}, median of rounds)"
        );
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
        println!("  attempts/acquisition    {attempts:.2}");
        println!(
            "  Redis commands/acq.     {commands_per_acquisition:.1}  (scripts' own included)"
        );
        println!("  by hand-off             {}", report.handed_over);
        println!("  hand-off share          {handoff_share:.3}");
        println!("  Jain fairness           {jain:.3}");
        println!("  violations              {}", report.violations);
        println!("  fencing inversions      {fence_inversions}");
        println!("  timeouts                {}", report.timeouts);
    }
    Ok(())
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

async fn measure_held(url: &str, leases: u32, ttl: Duration, hold: Duration) -> Fallible<Held> {
    let locks = manager(url)?;
    let mut conn = connection(url).await?;
    let rss_before = rss_mib();
    let acquire_started = Instant::now();
    let mut held = Vec::with_capacity(leases as usize);
    let mut pending = tokio::task::JoinSet::new();
    for i in 0..leases {
        let locks = locks.clone();
        pending.spawn(async move { locks.lock(format!("held:{i}")).ttl(ttl).acquire().await });
        if pending.len() >= 256 {
            if let Some(joined) = pending.join_next().await {
                held.push(
                    joined
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?,
                );
            }
        }
    }
    while let Some(joined) = pending.join_next().await {
        held.push(
            joined
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?,
        );
    }
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
