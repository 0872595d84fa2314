//! A separate OS process that locks through partitions and clock jumps and writes its history,
//! for `tests/partitions.rs` (the checker is `distlock_tests::history`).
//!
//! `partition_worker TOPOLOGY STORAGE_URL HISTORY PROCESS TASKS KEYS HOLD_MS [ttl=MS]
//! [wait=MS] [min_replicas=N] [from=N] [unfair]`
//!
//! - `TOPOLOGY`: `url=URL`, `cluster=URL,...`, `sentinel=NAME@URL,...` or `quorum=URL,...`.
//! - `STORAGE_URL`: the fenced storage, a Redis of its own that accepts a write only with a token
//!   not below the newest it accepted for the key (see `FENCED_WRITE`).
//! - `HISTORY`: the file this process appends its events to, as `PROCESS`.
//! - `TASKS` tasks lock random keys among `KEYS` (`{fault}:FROM` ...: one slot) with `acquire`,
//!   hold each for `HOLD_MS` (two fenced writes, each after noting the lease's validity) or
//!   until `Lease::lost` resolves, then release, until stdin closes. Timeouts: 500 ms to connect, 500 ms to answer.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_runtime::{LockError, LockManager};
use distlock_tests::history::{now_us, Recorder, WriteOutcome};

/// `KEYS[1]` the key's newest accepted token, `KEYS[2]` the storage's acceptance counter;
/// `ARGV[1]` the token. Answers the acceptance's sequence number, or -1 for a token below the
/// newest accepted (refused).
const FENCED_WRITE: &str = r"
local newest = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < newest then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
return redis.call('INCR', KEYS[2])
";

fn build(topology: &str, min_replicas: usize) -> Result<LockManager, Box<dyn std::error::Error>> {
    let mut builder = LockManager::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500));
    if min_replicas > 0 {
        builder = builder.min_replicas(min_replicas);
    }
    Ok(distlock_tests::with_topology(builder, topology)?.build()?)
}

/// The class the checker counts a failed acquire under.
fn class(error: &LockError) -> &'static str {
    match error {
        LockError::Replication { .. } => "replication",
        LockError::NoQuorum { .. } => "no-quorum",
        LockError::LeaseLost { .. } => "lost",
        e if e.is_contention() => "busy",
        e if e.is_unavailable() => "unavailable",
        e if e.is_misconfigured() => "misconfigured",
        _ => "other",
    }
}

fn option<T: std::str::FromStr>(rest: &[String], name: &str, default: T) -> T {
    rest.iter()
        .find_map(|arg| arg.strip_prefix(name)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_ansi(false)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [topology, storage, history, process, tasks, keys, hold, rest @ ..] = args.as_slice()
    else {
        return Err(
            "usage: partition_worker TOPOLOGY STORAGE_URL HISTORY PROCESS TASKS KEYS \
                    HOLD_MS [ttl=MS] [wait=MS] [min_replicas=N] [unfair]"
                .into(),
        );
    };
    let (tasks, keys, hold): (usize, u64, u64) = (tasks.parse()?, keys.parse()?, hold.parse()?);
    let ttl = Duration::from_millis(option(rest, "ttl", 2000));
    let wait = Duration::from_millis(option(rest, "wait", 1000));
    let unfair = rest.iter().any(|arg| arg == "unfair");
    let from: u64 = option(rest, "from", 0);
    let locks = build(topology, option(rest, "min_replicas", 0))?;
    let recorder = Arc::new(Recorder::create(history, process)?);
    let storage = redis::Client::open(storage.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let script = Arc::new(redis::Script::new(FENCED_WRITE));
    let running = Arc::new(AtomicBool::new(true));
    {
        let running = Arc::clone(&running);
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            running.store(false, Ordering::Relaxed);
        });
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut handles = vec![];
    for _ in 0..tasks {
        let (locks, recorder, storage, script, running) = (
            locks.clone(),
            Arc::clone(&recorder),
            storage.clone(),
            Arc::clone(&script),
            Arc::clone(&running),
        );
        handles.push(tokio::spawn(async move {
            while running.load(Ordering::Relaxed) {
                let key = format!("{{fault}}:{}", from + fastrand::u64(0..keys));
                let op = recorder.next_op();
                recorder.invoke(op, &key);
                let mut request = locks.lock(key.clone()).ttl(ttl).wait(wait);
                if unfair {
                    request = request.fair(false);
                }
                let lease = match request.acquire().await {
                    Ok(lease) => lease,
                    Err(error) => {
                        recorder.failed(op, &key, class(&error), &error.to_string());
                        if !error.is_contention() {
                            // An outage answers at once: do not spin on it.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        continue;
                    }
                };
                let token = lease.fencing_token();
                recorder.granted(op, &key, token, lease.remaining());
                let work = body(
                    &recorder,
                    op,
                    &key,
                    token,
                    &lease,
                    storage.clone(),
                    &script,
                    hold,
                );
                tokio::select! {
                    () = work => {
                        recorder.body_end(op);
                        let invoked = now_us();
                        let released = lease.release().await;
                        recorder.released(op, invoked, released.is_ok());
                    }
                    () = lease.lost() => {
                        recorder.body_end(op);
                        recorder.lost(op);
                    }
                }
            }
        }));
    }
    for handle in handles {
        handle.await?;
    }
    Ok(())
}

/// The locked body: two fenced writes, at its start and halfway through the hold, and the
/// lease's validity noted before each and every 50 ms (renewals move it on), while it lasts.
#[allow(clippy::too_many_arguments)]
async fn body(
    recorder: &Recorder,
    op: u64,
    key: &str,
    token: u64,
    lease: &distlock_runtime::Lease,
    mut storage: redis::aio::MultiplexedConnection,
    script: &redis::Script,
    hold_ms: u64,
) {
    for _ in 0..2 {
        note_validity(recorder, op, lease);
        let invoked = now_us();
        let reply: redis::RedisResult<i64> = script
            .key(format!("fence:{key}"))
            .key("fence:seq")
            .arg(token)
            .invoke_async(&mut storage)
            .await;
        let outcome = match reply {
            Ok(-1) => WriteOutcome::Refused,
            Ok(seq) => WriteOutcome::Accepted { seq: seq as u64 },
            Err(_) => WriteOutcome::Unknown,
        };
        recorder.write(op, key, token, invoked, outcome);
        let until = tokio::time::Instant::now() + Duration::from_millis(hold_ms / 2);
        while tokio::time::Instant::now() < until {
            tokio::time::sleep_until(
                until.min(tokio::time::Instant::now() + Duration::from_millis(50)),
            )
            .await;
            note_validity(recorder, op, lease);
        }
    }
}

/// Notes how long the lease is valid, while it is (a lost one's zero would move its end on).
fn note_validity(recorder: &Recorder, op: u64, lease: &distlock_runtime::Lease) {
    let remaining = lease.remaining();
    if !remaining.is_zero() {
        recorder.valid(op, remaining);
    }
}
