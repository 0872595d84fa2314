//! The seckill (flash-sale) demo: `cargo run --release --example seckill`.
//!
//! With no arguments (`demo`), it finds a Redis (see `local_redis`), starts two service
//! instances on loopback ports, each with its own `LockManager`, and sells 100 units to 500
//! concurrent buyers split across both, once per strategy: `lock` (distlock), `none` (no lock:
//! oversells), `optimistic` (WATCH/MULTI) and `lua` (one script). It prints a summary table and
//! one machine-readable line per strategy.
//!
//! `--topology cluster|sentinel|quorum` puts the locks on a local Redis Cluster, Sentinel group
//! or Redlock quorum that the demo starts (and stops) for the run; the products stay on the one
//! Redis it found.
//!
//! `serve` runs one instance; `load` sends buyers to running instances.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use distlock_examples::local_redis::LocalRedis;
use distlock_examples::seckill::{
    BuyRequest, BuyResponse, CreateProduct, ProductReport, Shop, Strategy,
};
use indicatif::{ProgressBar, ProgressStyle};
use topology::{Servers, Topology};

#[path = "topology.rs"]
mod topology;

#[derive(Parser)]
#[command(about = "A flash-sale service whose purchase handler runs under #[distributed_lock]")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Where the demo's locks live (the demo without a subcommand): a local cluster, Sentinel
    /// group or quorum started for the run, or the one Redis.
    #[arg(long, value_enum, default_value_t = Topology::Standalone)]
    topology: Topology,
}

#[derive(Subcommand)]
enum Command {
    /// Run one service instance.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
        /// Redis URL (default: REDIS_URL; instances must share one, so there is no throwaway
        /// server here: the demo starts one).
        #[arg(long)]
        redis_url: Option<String>,
        /// How purchases are protected.
        #[arg(long, value_enum, default_value_t = Strategy::Lock)]
        strategy: Strategy,
    },
    /// Create a product through the first target, then send buyers to all targets.
    Load(LoadArgs),
    /// Run the whole story on this machine, every strategy side by side (the default).
    Demo {
        /// Concurrent buyers.
        #[arg(long, default_value_t = 500)]
        buyers: u64,
        /// Units for sale.
        #[arg(long, default_value_t = 100)]
        stock: u32,
    },
}

#[derive(clap::Args, Clone)]
struct LoadArgs {
    /// Base URLs of the service instances (repeat the flag, or separate with commas).
    #[arg(long = "target", value_delimiter = ',', required = true)]
    targets: Vec<String>,
    /// Buyers, each a distinct user buying one unit.
    #[arg(long, default_value_t = 500)]
    buyers: u64,
    /// Units for sale.
    #[arg(long, default_value_t = 100)]
    stock: u32,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 500)]
    concurrency: usize,
    /// The product to create and sell.
    #[arg(long, default_value_t = 1)]
    product: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // 500 buyers in flight through two in-process servers take about 1,000 sockets: lift the
    // soft limit on open files to the hard limit (1,024 is a common default).
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let cli = Cli::parse();
    let outcome = match cli.command.unwrap_or(Command::Demo {
        buyers: 500,
        stock: 100,
    }) {
        Command::Serve {
            addr,
            redis_url,
            strategy,
        } => serve(addr, redis_url, strategy).await,
        Command::Load(args) => load(&args, None).await.map(|report| {
            print_table(std::slice::from_ref(&report));
            println!("{}", report.line());
        }),
        Command::Demo { buyers, stock } => demo(buyers, stock, cli.topology).await,
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("seckill: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    addr: SocketAddr,
    redis_url: Option<String>,
    strategy: Strategy,
) -> Result<(), String> {
    let (url, _redis) = match redis_url {
        Some(url) => (url, None),
        None => {
            let redis = LocalRedis::shared()?;
            eprintln!("using {}", redis.origin);
            (redis.url.clone(), Some(redis))
        }
    };
    let shop = Shop::connect(&url, strategy, "seckill:")
        .await
        .map_err(|e| format!("cannot use Redis at {}: {e}", shown(&url)))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    eprintln!("seckill ({strategy}) listening on http://{addr}");
    axum::serve(listener, shop.router())
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| format!("server failed: {e}"))
}

/// A Redis URL fit to print: its password masked.
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "(the given Redis URL)".to_owned(),
    }
}

/// Two instances of one strategy on loopback ports; stopped when dropped.
struct Instances {
    urls: Vec<String>,
    stop: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl Instances {
    async fn start(
        redis_url: &str,
        servers: Option<&Servers>,
        strategy: Strategy,
        prefix: &str,
    ) -> Result<Self, String> {
        let mut urls = Vec::new();
        let mut stop = Vec::new();
        for _ in 0..2 {
            // Each instance has its own Shop, hence its own LockManager and connections, as two
            // processes would.
            // Buyers are served in arrival order (fair, the default), except on a quorum,
            // which serves fair requests nowhere (see the crate docs, "Topologies").
            let locks = match servers {
                Some(servers) => servers.builder(),
                None => distlock_runtime::LockManager::builder().url(redis_url),
            };
            let shop = Shop::connect_with_locks(redis_url, locks, strategy, prefix)
                .await
                .map_err(|e| format!("cannot use Redis at {}: {e}", shown(redis_url)))?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("cannot listen on loopback: {e}"))?;
            let addr = listener.local_addr().map_err(|e| e.to_string())?;
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            tokio::spawn(async move {
                let _ = axum::serve(listener, shop.router())
                    .with_graceful_shutdown(async {
                        let _ = rx.await;
                    })
                    .await;
            });
            urls.push(format!("http://{addr}"));
            stop.push(tx);
        }
        Ok(Self { urls, stop })
    }
}

impl Drop for Instances {
    fn drop(&mut self) {
        for tx in self.stop.drain(..) {
            let _ = tx.send(());
        }
    }
}

async fn demo(buyers: u64, stock: u32, topology: Topology) -> Result<(), String> {
    let redis = LocalRedis::from_env_or_start()?;
    eprintln!("Redis: {} ({})", shown(&redis.url), redis.origin);
    let servers = Servers::start(topology).await.map_err(|e| e.to_string())?;
    if let Some(servers) = &servers {
        eprintln!("Locks: on {}, started for this run", servers.describe());
    }
    eprintln!(
        "Selling {stock} units to {buyers} concurrent buyers through 2 service instances, once \
         per strategy.\n"
    );
    let run = std::process::id();
    let mut reports = Vec::new();
    for (i, strategy) in Strategy::ALL.into_iter().enumerate() {
        let prefix = format!("seckill-demo:{run}:");
        let instances = Instances::start(&redis.url, servers.as_ref(), strategy, &prefix).await?;
        let args = LoadArgs {
            targets: instances.urls.clone(),
            buyers,
            stock,
            concurrency: usize::try_from(buyers).unwrap_or(usize::MAX),
            product: u64::try_from(i).unwrap_or(0) + 1,
        };
        let report = load(&args, Some(strategy)).await?;
        drop(instances);
        reports.push(report);
    }
    println!();
    print_table(&reports);
    println!();
    for report in &reports {
        println!("{}", report.line());
    }
    cleanup(&redis.url, &format!("seckill-demo:{run}:")).await;
    Ok(())
}

/// Removes the demo's keys from a Redis it did not start.
async fn cleanup(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<(), _> = redis::cmd("DEL").arg(keys).exec_async(&mut conn).await;
    }
}

#[derive(Clone)]
struct LoadReport {
    strategy: String,
    stock: u32,
    sold: i64,
    oversold: i64,
    rejected: u64,
    busy: u64,
    errors: u64,
    wall: Duration,
    requests: u64,
    p50: Duration,
    p99: Duration,
}

impl LoadReport {
    fn line(&self) -> String {
        format!(
            "seckill strategy={} stock={} sold={} oversold={} rejected={} busy={} wall_ms={}",
            self.strategy,
            self.stock,
            self.sold,
            self.oversold,
            self.rejected,
            self.busy,
            self.wall.as_millis()
        )
    }
}

async fn load(args: &LoadArgs, strategy: Option<Strategy>) -> Result<LoadReport, String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let first = args.targets.first().ok_or("give at least one --target")?;
    let created = client
        .post(format!("{first}/products/{}", args.product))
        .json(&CreateProduct::with_stock(args.stock))
        .send()
        .await
        .map_err(|e| format!("cannot reach {first}: {e}"))?;
    if !created.status().is_success() {
        return Err(format!("creating the product failed: {}", created.status()));
    }

    let label = strategy.map_or_else(|| "load".to_owned(), |s| s.to_string());
    let bar = ProgressBar::new(args.buyers).with_style(
        ProgressStyle::with_template("{prefix:>10} [{bar:40}] {pos}/{len} buyers {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    bar.set_prefix(label.clone());
    let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for user in 0..args.buyers {
        let target = &args.targets[usize::try_from(user).unwrap_or(0) % args.targets.len()];
        let url = format!("{target}/products/{}/buy", args.product);
        let (client, limit, bar) = (client.clone(), limit.clone(), bar.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let sent = Instant::now();
            // Counted by the answer's own word: "busy" (409) only when the service says so (an
            // unreachable Redis is an error, not contention).
            let word = match client
                .post(url)
                .json(&BuyRequest { user_id: user })
                .send()
                .await
            {
                Ok(response) => response
                    .json::<BuyResponse>()
                    .await
                    .map_or_else(|_| "unreadable answer".to_owned(), |body| body.status),
                Err(e) => format!("request failed: {e}"),
            };
            bar.inc(1);
            (word, sent.elapsed())
        });
    }
    let (mut bought, mut rejected, mut busy, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut first_error = None;
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (word, latency) = joined.map_err(|e| e.to_string())?;
        latencies.push(latency);
        match word.as_str() {
            "bought" => bought += 1,
            "sold_out" | "already_bought" => rejected += 1,
            "busy" => busy += 1,
            _ => {
                errors += 1;
                first_error.get_or_insert(word);
            }
        }
    }
    let wall = started.elapsed();
    bar.finish_and_clear();
    let report: ProductReport = client
        .get(format!("{first}/products/{}", args.product))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    if let Some(example) = first_error {
        eprintln!(
            "{label}: {errors} requests failed (not bought, sold out or busy), e.g. {example}"
        );
    }
    latencies.sort_unstable();
    let at = |q: f64| {
        let i = ((latencies.len() as f64 - 1.0) * q).round() as usize;
        latencies.get(i).copied().unwrap_or_default()
    };
    if i64::try_from(bought).ok() != Some(report.sold) {
        eprintln!(
            "{label}: {bought} buyers were told \"bought\" but the product records {} sold",
            report.sold
        );
    }
    Ok(LoadReport {
        strategy: label,
        stock: args.stock,
        sold: report.sold,
        oversold: report.oversold,
        rejected,
        busy,
        errors,
        wall,
        requests: args.buyers,
        p50: at(0.50),
        p99: at(0.99),
    })
}

fn print_table(reports: &[LoadReport]) {
    println!(
        "{:<11} {:>5} {:>9} {:>9} {:>5} {:>7} {:>9} {:>11} {:>9} {:>9}",
        "strategy", "sold", "oversold", "rejected", "busy", "errors", "wall", "req/s", "p50", "p99"
    );
    for r in reports {
        let throughput = r.requests as f64 / r.wall.as_secs_f64().max(1e-9);
        println!(
            "{:<11} {:>5} {:>9} {:>9} {:>5} {:>7} {:>7}ms {:>11.0} {:>7.1}ms {:>7.1}ms",
            r.strategy,
            r.sold,
            r.oversold,
            r.rejected,
            r.busy,
            r.errors,
            r.wall.as_millis(),
            throughput,
            r.p50.as_secs_f64() * 1000.0,
            r.p99.as_secs_f64() * 1000.0
        );
    }
}
