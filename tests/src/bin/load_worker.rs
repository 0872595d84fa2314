//! A separate OS process that keeps locks busy through a fault, for the fault matrix
//! (`tests/faults.rs`).
//!
//! `load_worker TOPOLOGY LEDGER_URL MANAGERS TASKS KEYS SECS [unfair] [think=MS]`
//!
//! - `TOPOLOGY`: `url=URL`, `cluster=URL,URL,...`, `sentinel=NAME@URL,URL,...` or
//!   `quorum=URL,URL,...`: what each manager is built for.
//! - `LEDGER_URL`: an independent Redis that plays the guarded resource: each body reads and
//!   writes a per-key counter there with its fencing token, and the ledger refuses a token lower
//!   than one it saw for that key (see `LEDGER` below).
//! - `MANAGERS` managers, each with `TASKS` tasks that lock random keys among `KEYS` (ttl 2 s,
//!   wait 500 ms, a 2 ms body, `think` ms between cycles, 5 unless given) until its stdin
//!   closes, or `SECS` seconds at most.
//!
//! Every 200 ms, per manager, it prints
//! `tick MANAGER UNIX_MS ok N busy N unavailable N misconfigured N other N ping PING_MS first ERROR`:
//! the lock cycles that succeeded, failed by contention, by an outage, by a refusal, or
//! otherwise in that interval, and how long the manager's latest `ping()` took (`-` while it is
//! still out: a ping that never ends shows as a growing gap). At the end it prints
//! `done MANAGER ok N stale N duplicate N` (stale: a write the ledger refused for its token;
//! duplicate: a token the ledger had seen from another lease).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock_runtime::{LockError, LockManager};

/// The guarded resource, keyed by lock key: `KEYS[1]` a hash with the greatest token seen
/// (`max`) and the counter (`count`), `KEYS[2]` the set of tokens seen. `ARGV[1]` is `read` or
/// `write`, `ARGV[2]` the token, `ARGV[3]` the value to write. A read registers the token (a
/// token seen before is a duplicate: two leases shared it) and answers the counter; a write
/// sets it. Either answers `-1` for a token below the greatest seen (stale), and `-2` for a
/// duplicate.
const LEDGER: &str = r"
local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '0')
local token = tonumber(ARGV[2])
if token < max then return -1 end
if ARGV[1] == 'read' then
  if redis.call('SADD', KEYS[2], ARGV[2]) == 0 then return -2 end
  redis.call('HSET', KEYS[1], 'max', ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'count') or '0')
end
redis.call('HSET', KEYS[1], 'count', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'writes', 1)
return 1
";

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    busy: AtomicU64,
    unavailable: AtomicU64,
    misconfigured: AtomicU64,
    other: AtomicU64,
    stale: AtomicU64,
    duplicate: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// The latest ping's duration in ms, or `u64::MAX` while one is out.
    ping_ms: AtomicU64,
}

fn build(topology: &str) -> Result<LockManager, Box<dyn std::error::Error>> {
    let builder = LockManager::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_secs(1));
    Ok(distlock_tests::with_topology(builder, topology)?.build()?)
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // distlock's warnings (and, with RUST_LOG, more) on stderr, which the test keeps to show
    // when a case fails.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_ansi(false)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [topology, ledger, managers, tasks, keys, secs, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: load_worker TOPOLOGY LEDGER_URL MANAGERS TASKS KEYS SECS [unfair] [think=MS]"
                .into(),
        );
    };
    // The manager's default (fair for one key, but on a quorum), or unfair.
    let unfair = rest.iter().any(|arg| arg == "unfair");
    // The pause between a task's lock cycles (`think=MS`, 5 ms unless given).
    let think = rest
        .iter()
        .find_map(|arg| arg.strip_prefix("think="))
        .map_or(Ok(5), str::parse)?;
    let think = Duration::from_millis(think);
    let (managers, tasks, keys): (usize, usize, u64) =
        (managers.parse()?, tasks.parse()?, keys.parse()?);
    let until = Instant::now() + Duration::from_secs(secs.parse()?);
    // Runs until the test closes stdin (or `until`).
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    {
        let running = Arc::clone(&running);
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            running.store(false, Ordering::Relaxed);
        });
    }
    let go_on = move || running.load(Ordering::Relaxed) && Instant::now() < until;
    let ledger = redis::Client::open(ledger.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let ledger_script = Arc::new(redis::Script::new(LEDGER));
    let mut all = Vec::new();
    let mut handles = Vec::new();
    for m in 0..managers {
        let locks = build(topology)?;
        let counts = Arc::new(Counts::default());
        all.push(Arc::clone(&counts));
        for _ in 0..tasks {
            let (locks, counts, ledger, script) = (
                locks.clone(),
                Arc::clone(&counts),
                ledger.clone(),
                Arc::clone(&ledger_script),
            );
            let go_on = go_on.clone();
            handles.push(tokio::spawn(async move {
                while go_on() {
                    let key = format!("load:{}", fastrand::u64(0..keys));
                    let mut request = locks
                        .lock(key.clone())
                        .ttl(Duration::from_secs(2))
                        .wait(Duration::from_millis(500));
                    if unfair {
                        request = request.fair(false);
                    }
                    let outcome = request
                        .run(guarded(ledger.clone(), &script, &key, &counts))
                        .await;
                    let counter = match &outcome {
                        Ok(()) => &counts.ok,
                        Err(e) if e.is_contention() => &counts.busy,
                        Err(e)
                            if e.is_unavailable() || matches!(e, LockError::LeaseLost { .. }) =>
                        {
                            &counts.unavailable
                        }
                        Err(e) if e.is_misconfigured() => &counts.misconfigured,
                        Err(_) => &counts.other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    if let Err(error) = outcome {
                        if !error.is_contention() {
                            counts
                                .first_error
                                .lock()
                                .unwrap()
                                .get_or_insert(error.to_string());
                            // An outage answers at once: do not spin on it.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    tokio::time::sleep(think).await;
                }
            }));
        }
        // One ping at a time, each timed.
        let (pinger, pings) = (locks.clone(), Arc::clone(&counts));
        let going = go_on.clone();
        handles.push(tokio::spawn(async move {
            while going() {
                let started = Instant::now();
                pings.ping_ms.store(u64::MAX, Ordering::Relaxed);
                let _ = pinger.ping().await;
                pings
                    .ping_ms
                    .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
        let (counts, m, ticking) = (Arc::clone(&counts), m, go_on.clone());
        handles.push(tokio::spawn(async move {
            let mut out = std::io::stdout();
            while ticking() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let ping = match counts.ping_ms.load(Ordering::Relaxed) {
                    u64::MAX => "-".to_owned(),
                    ms => ms.to_string(),
                };
                let first = counts.first_error.lock().unwrap().take().unwrap_or_default();
                let _ = writeln!(
                    out,
                    "tick {m} {} ok {} busy {} unavailable {} misconfigured {} other {} ping {ping} first {}",
                    unix_ms(),
                    counts.ok.swap(0, Ordering::Relaxed),
                    counts.busy.swap(0, Ordering::Relaxed),
                    counts.unavailable.swap(0, Ordering::Relaxed),
                    counts.misconfigured.swap(0, Ordering::Relaxed),
                    counts.other.swap(0, Ordering::Relaxed),
                    first.replace('\n', " "),
                );
                let _ = out.flush();
            }
        }));
    }
    for handle in handles {
        handle.await?;
    }
    for (m, counts) in all.iter().enumerate() {
        println!(
            "done {m} stale {} duplicate {}",
            counts.stale.load(Ordering::Relaxed),
            counts.duplicate.load(Ordering::Relaxed)
        );
    }
    std::io::stdout().flush()?;
    Ok(())
}

/// The body: a read-modify-write of the key's counter on the ledger, fenced by the lease's
/// token, with a 2 ms gap between read and write.
async fn guarded(
    mut ledger: redis::aio::MultiplexedConnection,
    script: &redis::Script,
    key: &str,
    counts: &Counts,
) {
    let Some(lease) = distlock_runtime::current_lease() else {
        return;
    };
    let token = lease.fencing_token().to_string();
    let (state, tokens) = (format!("ledger:{key}"), format!("ledger:{key}:tokens"));
    let read: redis::RedisResult<i64> = script
        .key(&state)
        .key(&tokens)
        .arg("read")
        .arg(&token)
        .invoke_async(&mut ledger)
        .await;
    let value = match read {
        Ok(-1) => {
            counts.stale.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Ok(-2) => {
            counts.duplicate.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Ok(value) => value,
        Err(_) => return,
    };
    tokio::time::sleep(Duration::from_millis(2)).await;
    let wrote: redis::RedisResult<i64> = script
        .key(&state)
        .key(&tokens)
        .arg("write")
        .arg(&token)
        .arg(value + 1)
        .invoke_async(&mut ledger)
        .await;
    if let Ok(-1) = wrote {
        counts.stale.fetch_add(1, Ordering::Relaxed);
    }
}
