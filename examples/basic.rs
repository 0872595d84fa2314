//! The explicit API end to end: `cargo run --example basic` (the Redis at `REDIS_URL`, else a
//! throwaway `redis-server` started for the run).
//!
//! Runs a closure under a lock, holds a multi-key lease by hand, shows try-lock contention and
//! a re-entrant nested call.

use std::time::Duration;

use distlock_examples::local_redis::LocalRedis;
use distlock_runtime::{current_lease, LockError, LockManager};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "distlock_runtime=info".into()),
        )
        .init();
    let redis = LocalRedis::from_env_or_start()?;
    eprintln!("Redis: {}", redis.origin);
    let locks = LockManager::builder()
        .url(&redis.url)
        .prefix("distlock-example:")
        .build()?;

    // 1. Run a future under a lock: released whatever happens.
    let receipt = locks
        .lock("order:42")
        .ttl(Duration::from_secs(10))
        .run(async {
            let lease = current_lease().expect("inside a locked body");
            format!(
                "paid order 42 under fencing token {}",
                lease.fencing_token()
            )
        })
        .await?;
    println!("1. {receipt}");

    // 2. Hold a lease on several keys by hand.
    let lease = locks
        .lock_all(["wallet:7", "stock:sku-1"])
        .acquire()
        .await?;
    println!(
        "2. holding {:?}, fencing token {}",
        lease.keys(),
        lease.fencing_token()
    );

    // 3. While it is held, a try-lock on one of its keys fails at once.
    match locks.try_lock("stock:sku-1").acquire().await {
        Err(err @ LockError::NotAcquired { .. }) => println!("3. try-lock: {err}"),
        other => println!("3. unexpected: {other:?}"),
    }
    lease.release().await?;

    // 4. Re-entrancy: a nested run on a key this task holds runs under the outer lease.
    let inner = locks.clone();
    let nested = locks
        .lock("report:daily")
        .run(async move {
            inner
                .try_lock("report:daily")
                .run(async { "nested call ran without waiting for itself" })
                .await
        })
        .await??;
    println!("4. {nested}");
    Ok(())
}
