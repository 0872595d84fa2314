//! A job that must run once per tick across a fleet: `cargo run --example scheduler`.
//!
//! Three instances (each with its own `LockManager`, as three processes would have) wake at
//! every 2 s tick of the wall clock, each up to 300 ms late (a clock a little off, a busy
//! scheduler), and call the same annotated job. `wait = 0` makes the late ones skip the tick
//! instead of queueing; `hold_at_least = "1500ms"` keeps the lock held after the job's quick body,
//! so an instance that arrives late still finds it taken. It prints which instance ran each
//! tick, and says whether every tick ran exactly once.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use distlock_examples::local_redis::LocalRedis;
use distlock_runtime::{distributed_lock, LockError, LockManager};

#[derive(Parser)]
#[command(about = "Three instances, one run per tick")]
struct Cli {
    /// How many ticks to run.
    #[arg(long, default_value_t = 10)]
    ticks: u64,
}

const TICK: Duration = Duration::from_secs(2);
const LATE_AT_MOST: Duration = Duration::from_millis(300);

/// The job: runs on one instance per tick.
#[distributed_lock("nightly-report", wait = 0, hold_at_least = "1500ms", manager = locks)]
async fn send_report(locks: &LockManager, instance: usize, tick: u64) -> Result<(), LockError> {
    println!("tick {tick}: instance {instance} sends the report");
    Ok(())
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(0)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let redis = match LocalRedis::from_env_or_start() {
        Ok(redis) => redis,
        Err(message) => {
            eprintln!("scheduler: {message}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "Redis: {}; 3 instances, a tick every {TICK:?}, {} ticks",
        redis.origin, cli.ticks
    );
    let tick_ms = u64::try_from(TICK.as_millis()).unwrap_or(2000);
    let first = now_ms() / tick_ms + 1;
    let runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>> = Arc::default();
    let mut instances = Vec::new();
    for instance in 1..=3 {
        let locks = match LockManager::builder()
            .url(redis.url.clone())
            .prefix(format!("scheduler-demo:{}:", std::process::id()))
            .holder_label(format!("instance-{instance}"))
            .build()
        {
            Ok(locks) => locks,
            Err(error) => {
                eprintln!("scheduler: {error}");
                return ExitCode::FAILURE;
            }
        };
        let runs = Arc::clone(&runs);
        let ticks = cli.ticks;
        instances.push(tokio::spawn(async move {
            for tick in first..first + ticks {
                let late = fastrand::u64(0..=u64::try_from(LATE_AT_MOST.as_millis()).unwrap_or(0));
                let at = tick * tick_ms + late;
                tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
                match send_report(&locks, instance, tick - first + 1).await {
                    Ok(()) => runs
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(tick)
                        .or_default()
                        .push(instance),
                    Err(error) if error.is_contention() => {}
                    Err(error) => eprintln!("instance {instance}: {error}"),
                }
            }
        }));
    }
    for instance in instances {
        let _ = instance.await;
    }
    let runs = runs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let once = runs.len() as u64 == cli.ticks && runs.values().all(|r| r.len() == 1);
    if once {
        println!("every one of the {} ticks ran exactly once", cli.ticks);
        ExitCode::SUCCESS
    } else {
        println!("runs per tick were not exactly one: {runs:?}");
        ExitCode::FAILURE
    }
}
