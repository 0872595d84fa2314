//! A separate OS process whose tasks contend for a semaphore's permits and record every stay
//! inside in an independent Redis (the ledger), for the quorum semaphore tests
//! (`tests/quorum_semaphores.rs`).
//!
//! `permit_worker TOPOLOGY KEY N TASKS MILLIS LEDGER_URL`
//!
//! - `TOPOLOGY`: what the manager is built for (`quorum=URL,URL,...`; see `with_topology`).
//! - `TASKS` tasks, each until `MILLIS` have passed: read the greatest fencing token of the
//!   leases that left so far (`exited`), take one of `N` permits of `KEY` (ttl 1 s, renewed,
//!   wait 500 ms), stay inside 30 ms, leave, release. An acquire that fails is tried again after
//!   20 ms.
//! - Each stay is recorded in the ledger, whose commands run one at a time, so their order is
//!   the one order of events: entering takes the next number of `seq`, leaving takes the next
//!   too and appends `TOKEN ENTER EXIT VALID FLOOR` to the list `stays` (VALID: `1` when the
//!   lease was still valid on leaving, so it was valid throughout the stay; FLOOR: the `exited`
//!   read before the acquire, which the lease's token must exceed), and raises `exited` to the
//!   token.
//!
//! At the end it prints `done stays N failed N overrun_ms MS`: the stays, the acquires that
//! failed, and by how much the longest failed wait outlived its 500 ms.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_runtime::LockManager;

/// Leaving: `KEYS[1]` the sequence, `KEYS[2]` the list of stays, `KEYS[3]` the greatest token
/// that left; `ARGV`: token, the number taken on entering, valid, floor.
const LEAVE: &str = r"
local exit = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. exit .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[1]) > last then redis.call('SET', KEYS[3], ARGV[1]) end
return exit
";

const WAIT: Duration = Duration::from_millis(500);

#[derive(Default)]
struct Counts {
    stays: AtomicU64,
    failed: AtomicU64,
    overrun_ms: AtomicU64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [topology, key, n, tasks, millis, ledger] = args.as_slice() else {
        return Err("usage: permit_worker TOPOLOGY KEY N TASKS MILLIS LEDGER_URL".into());
    };
    let builder = LockManager::builder()
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(300));
    let locks = distlock_tests::with_topology(builder, topology)?.build()?;
    let ledger = redis::Client::open(ledger.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let (n, until) = (
        n.parse::<u32>()?,
        Instant::now() + Duration::from_millis(millis.parse()?),
    );
    let counts = Arc::new(Counts::default());
    let mut running = tokio::task::JoinSet::new();
    for _ in 0..tasks.parse::<u32>()? {
        let (locks, key, counts) = (locks.clone(), key.clone(), Arc::clone(&counts));
        let mut ledger = ledger.clone();
        running.spawn(async move {
            while Instant::now() < until {
                let floor: Option<u64> = redis::cmd("GET")
                    .arg("exited")
                    .query_async(&mut ledger)
                    .await?;
                let asked = Instant::now();
                let ttl = Duration::from_secs(1);
                let lease = match locks
                    .lock(&key)
                    .permits(n)
                    .ttl(ttl)
                    .wait(WAIT)
                    .acquire()
                    .await
                {
                    Ok(lease) => lease,
                    Err(_) => {
                        let over = asked.elapsed().saturating_sub(WAIT).as_millis();
                        let over = u64::try_from(over).unwrap_or(u64::MAX);
                        counts.overrun_ms.fetch_max(over, Ordering::Relaxed);
                        counts.failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let enter: u64 = redis::cmd("INCR")
                    .arg("seq")
                    .query_async(&mut ledger)
                    .await?;
                tokio::time::sleep(Duration::from_millis(30)).await;
                let valid = !lease.is_lost() && lease.remaining() > Duration::ZERO;
                let () = redis::Script::new(LEAVE)
                    .key("seq")
                    .key("stays")
                    .key("exited")
                    .arg(lease.fencing_token())
                    .arg(enter)
                    .arg(u8::from(valid))
                    .arg(floor.unwrap_or(0))
                    .invoke_async::<u64>(&mut ledger)
                    .await
                    .map(drop)?;
                counts.stays.fetch_add(1, Ordering::Relaxed);
                // Failing or not, the lease ends: released, or expired.
                let _ = lease.release().await;
            }
            Ok::<_, redis::RedisError>(())
        });
    }
    while let Some(task) = running.join_next().await {
        task??;
    }
    println!(
        "done stays {} failed {} overrun_ms {}",
        counts.stays.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.overrun_ms.load(Ordering::Relaxed),
    );
    Ok(())
}
