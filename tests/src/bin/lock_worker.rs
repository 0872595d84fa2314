//! A separate OS process that takes locks, for the cross-process tests.
//!
//! `lock_worker count URL KEY COUNTER N`: N times, under the lock on KEY, read COUNTER with GET,
//! yield, and write it back plus one with SET (a deliberately non-atomic increment).
//! `lock_worker count-fair URL KEY COUNTER N`: the same with fair locking.
//! `lock_worker count-attr URL KEY COUNTER N`: the same through a `#[distributed_lock]` fn.
//! `lock_worker wait-fair URL KEY N [WAIT_MS]`: N tasks, one after the other, wait (fairly, up
//! to WAIT_MS, default 60 s) for the lock on KEY; the first to get it prints `acquired` and
//! holds it until killed.
//! `lock_worker hold URL KEY TTL_MS`: take the lock with renewal, print `acquired`, then sleep
//! until killed.
//! `lock_worker hold-read URL KEY TTL_MS` and `lock_worker hold-permit URL KEY N TTL_MS`: the
//! same, holding KEY shared, or as one of N permits.
//! `lock_worker rw URL KEY N WRITE_EVERY`: N times, take KEY exclusively (every WRITE_EVERY-th
//! time) or shared, and inside count in Redis who is in the room `room:{KEY}`: a reader that
//! finds a writer in, or a writer that finds anyone in, adds one to `room:{KEY}:violations`; a
//! reader that finds another reader in adds one to `room:{KEY}:shared`.
//! `lock_worker outage URL KEY TTL_MS SECS`: with distlock's logs on stderr, run a body that
//! sleeps SECS under the lock (renewed), printing `acquired` when it starts; print
//! `outcome OUTCOME after_ms MS` when `run` returns (OUTCOME is `ok`, `lost` or the error), wait
//! until SECS have passed since the start, then print `cpu_ms MS`, the process's CPU time.
//! `lock_worker body TOPOLOGY KEY MODE`: run a body that sleeps 120 s under the lock on KEY
//! (ttl 30 s, renewed; TOPOLOGY as `load_worker` takes it), printing `acquired` when it starts
//! and, when the lock call returns, `lost UNIX_MS` (the wall clock, in ms, when it returned
//! `LeaseLost`) or `outcome OUTCOME`. MODE: `x` (`run`), `attr` (a `#[distributed_lock]` fn),
//! `r` (shared), `pN` (one of N permits), `election` (a term, until it is lost).
//! `lock_worker schedule URL JOB TICKS TICK_MS HOLD_MS LATE_MS`: a scheduled job, one instance
//! of several: at each tick boundary of the wall clock (TICK_MS apart) for TICKS ticks, start up
//! to LATE_MS late (random, as a late clock or a busy scheduler would), try the lock on JOB once
//! with `hold_at_least(HOLD_MS)`, and print `ran TICK` when this instance ran it.

use std::io::Write;
use std::time::Duration;

use distlock_runtime::{distributed_lock, Lease, LockError, LockManager};
use redis::AsyncCommands;

#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

/// A deliberately non-atomic increment, made safe by the attribute alone.
#[distributed_lock("{key}", wait = 60, manager = locks)]
async fn increment(
    locks: &LockManager,
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    counter: &str,
) -> Result<(), WorkerError> {
    let value: i64 = conn.get::<_, Option<i64>>(counter).await?.unwrap_or(0);
    tokio::task::yield_now().await;
    conn.set::<_, _, ()>(counter, value + 1).await?;
    Ok(())
}

/// A body that outlasts any test, under a lock with a 30 s ttl.
#[distributed_lock("{key}", ttl = 30, manager = locks)]
async fn stuck(locks: &LockManager, key: &str) -> Result<(), LockError> {
    println!("acquired");
    std::io::stdout().flush().ok();
    tokio::time::sleep(Duration::from_secs(120)).await;
    Ok(())
}

/// Runs `mode`'s body on `key` (see the module docs) until the lock call returns.
async fn body(locks: &LockManager, key: &str, mode: &str) -> Result<(), LockError> {
    let entered = || {
        println!("acquired");
        std::io::stdout().flush().ok();
    };
    let sleep = || tokio::time::sleep(Duration::from_secs(120));
    let ttl = Duration::from_secs(30);
    match mode {
        "attr" => stuck(locks, key).await,
        "election" => {
            let term = locks.election(key).ttl(ttl).campaign().await?;
            entered();
            tokio::select! {
                () = term.lost() => Err(LockError::LeaseLost { keys: vec![key.to_owned()] }),
                () = sleep() => Ok(()),
            }
        }
        _ => {
            let request = match mode {
                "r" => locks.read_lock(key),
                "x" => locks.lock(key),
                permits => {
                    let n = permits.trim_start_matches('p').parse().unwrap_or(1);
                    locks.lock(key).permits(n)
                }
            };
            request
                .ttl(ttl)
                .run(async {
                    entered();
                    sleep().await;
                })
                .await
        }
    }
}

/// A stay in the room of `key` (see the module docs), as a writer or a reader.
async fn in_room(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    writes: bool,
) -> Result<(), redis::RedisError> {
    let (readers, writers) = (
        format!("room:{{{key}}}:readers"),
        format!("room:{{{key}}}:writers"),
    );
    let (mine, other) = if writes {
        (&writers, &readers)
    } else {
        (&readers, &writers)
    };
    let inside: i64 = conn.incr(mine, 1).await?;
    let others: i64 = conn.get::<_, Option<i64>>(other).await?.unwrap_or(0);
    if others > 0 || (writes && inside > 1) {
        conn.incr::<_, _, ()>(format!("room:{{{key}}}:violations"), 1)
            .await?;
    }
    if !writes && inside > 1 {
        conn.incr::<_, _, ()>(format!("room:{{{key}}}:shared"), 1)
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(if writes { 2 } else { 5 })).await;
    conn.decr::<_, _, ()>(mine, 1).await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [mode @ ("count" | "count-fair"), url, key, counter, n] => {
            let fair = *mode == "count-fair";
            let locks = LockManager::from_url(url)?;
            let mut conn = redis::Client::open(*url)?
                .get_multiplexed_async_connection()
                .await?;
            for _ in 0..n.parse::<u32>()? {
                let mut conn = conn.clone();
                locks
                    .lock(*key)
                    .wait(Duration::from_secs(60))
                    .fair(fair)
                    .run(async move {
                        let value: i64 = conn.get::<_, Option<i64>>(*counter).await?.unwrap_or(0);
                        tokio::task::yield_now().await;
                        conn.set::<_, _, ()>(*counter, value + 1).await
                    })
                    .await??;
            }
            let _: () = conn.incr(format!("{counter}:done"), 1).await?;
            Ok(())
        }
        ["count-attr", url, key, counter, n] => {
            let locks = LockManager::from_url(url)?;
            let mut conn = redis::Client::open(*url)?
                .get_multiplexed_async_connection()
                .await?;
            for _ in 0..n.parse::<u32>()? {
                increment(&locks, &mut conn, key, counter).await?;
            }
            let _: () = conn.incr(format!("{counter}:done"), 1).await?;
            Ok(())
        }
        ["wait-fair", url, key, n, rest @ ..] if rest.len() <= 1 => {
            let wait = match rest.first() {
                Some(ms) => Duration::from_millis(ms.parse()?),
                None => Duration::from_secs(60),
            };
            let locks = LockManager::from_url(url)?;
            let mut waiters = tokio::task::JoinSet::new();
            for _ in 0..n.parse::<u32>()? {
                let (locks, key) = (locks.clone(), key.to_string());
                waiters.spawn(async move {
                    locks
                        .lock(key)
                        .fair(true)
                        .wait(wait)
                        .acquire()
                        .await
                });
                // Queued in a known order.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let lease = waiters.join_next().await.ok_or("no waiter")???;
            hold_until_killed(lease).await
        }
        ["hold-read", url, key, ttl_ms] => {
            let locks = LockManager::from_url(url)?;
            let lease = locks
                .read_lock(*key)
                .ttl(Duration::from_millis(ttl_ms.parse()?))
                .acquire()
                .await?;
            hold_until_killed(lease).await
        }
        ["hold-permit", url, key, n, ttl_ms] => {
            let locks = LockManager::from_url(url)?;
            let lease = locks
                .lock(*key)
                .permits(n.parse()?)
                .ttl(Duration::from_millis(ttl_ms.parse()?))
                .acquire()
                .await?;
            hold_until_killed(lease).await
        }
        ["rw", url, key, n, write_every] => {
            let locks = LockManager::from_url(url)?;
            let conn = redis::Client::open(*url)?
                .get_multiplexed_async_connection()
                .await?;
            let every: usize = write_every.parse()?;
            for i in 0..n.parse::<usize>()? {
                let writes = (i + 1) % every == 0;
                let request = if writes {
                    locks.lock(*key)
                } else {
                    locks.read_lock(*key)
                };
                let mut conn = conn.clone();
                let key = (*key).to_owned();
                request
                    .wait(Duration::from_secs(60))
                    .run(async move { in_room(&mut conn, &key, writes).await })
                    .await??;
            }
            Ok(())
        }
        ["hold", url, key, ttl_ms] => {
            let locks = LockManager::from_url(url)?;
            let lease = locks
                .lock(*key)
                .ttl(Duration::from_millis(ttl_ms.parse()?))
                .acquire()
                .await?;
            hold_until_killed(lease).await
        }
        ["outage", url, key, ttl_ms, secs] => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(tracing::Level::INFO)
                .with_ansi(false)
                .init();
            let started = std::time::Instant::now();
            let secs = Duration::from_secs(secs.parse()?);
            let locks = LockManager::from_url(url)?;
            let outcome = locks
                .lock(*key)
                .ttl(Duration::from_millis(ttl_ms.parse()?))
                .run(async {
                    println!("acquired");
                    let _ = std::io::stdout().flush();
                    tokio::time::sleep(secs).await;
                })
                .await;
            let outcome = match outcome {
                Ok(()) => "ok".to_owned(),
                Err(LockError::LeaseLost { .. }) => "lost".to_owned(),
                Err(other) => other.to_string(),
            };
            println!(
                "outcome {outcome} after_ms {}",
                started.elapsed().as_millis()
            );
            tokio::time::sleep(secs.saturating_sub(started.elapsed())).await;
            println!("cpu_ms {}", cpu_time()?.as_millis());
            Ok(())
        }
        ["body", topology, key, mode] => {
            let builder = distlock_tests::with_topology(LockManager::builder(), topology)?;
            let locks = builder.build()?;
            match body(&locks, key, mode).await {
                Err(LockError::LeaseLost { .. }) => {
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
                    println!("lost {}", now.as_millis());
                }
                outcome => println!("outcome {outcome:?}"),
            }
            std::io::stdout().flush()?;
            Ok(())
        }
        ["schedule", url, job, ticks, tick_ms, hold_ms, late_ms] => {
            let locks = LockManager::from_url(url)?;
            let tick_ms: u64 = tick_ms.parse()?;
            let hold = Duration::from_millis(hold_ms.parse()?);
            let late_ms: u64 = late_ms.parse()?;
            let now_ms = || {
                u64::try_from(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis(),
                )
                .unwrap_or(0)
            };
            // Start at the next tick boundary, so every instance counts the same ticks.
            let first = now_ms() / tick_ms + 1;
            for tick in first..first + ticks.parse::<u64>()? {
                let at = tick * tick_ms + fastrand::u64(0..=late_ms);
                tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
                let ran = locks
                    .try_lock(*job)
                    .ttl(Duration::from_millis(tick_ms))
                    .hold_at_least(hold)
                    .run(async { tokio::time::sleep(Duration::from_millis(20)).await })
                    .await;
                if ran.is_ok() {
                    println!("ran {tick}");
                    std::io::stdout().flush()?;
                }
            }
            Ok(())
        }
        _ => Err(
            "usage: lock_worker count|count-fair|count-attr URL KEY COUNTER N | hold URL KEY TTL_MS \
             | hold-read URL KEY TTL_MS | hold-permit URL KEY N TTL_MS | rw URL KEY N WRITE_EVERY \
             | wait-fair URL KEY N [WAIT_MS] | outage URL KEY TTL_MS SECS | body TOPOLOGY KEY MODE \
             | schedule URL JOB TICKS TICK_MS HOLD_MS LATE_MS".into(),
        ),
    }
}

/// Prints `acquired TOKEN` and holds `lease` (renewed) until the process is killed.
async fn hold_until_killed(lease: Lease) -> Result<(), Box<dyn std::error::Error>> {
    println!("acquired {}", lease.fencing_token());
    std::io::stdout().flush()?;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    lease.release().await?;
    Ok(())
}

/// This process's CPU time so far (user and system), from `/proc/self/stat` (Linux).
fn cpu_time() -> Result<Duration, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The fields after the command name, which is in parentheses and may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .ok_or("unreadable /proc/self/stat")?
        .1
        .split_whitespace()
        .collect();
    // utime and stime (fields 14 and 15 of the whole line), in clock ticks of 1/100 s.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(Duration::from_millis(ticks * 10))
}
