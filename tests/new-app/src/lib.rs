//! A stock counter whose decrement runs under a distributed lock: the app code of the new-app
//! check (see Cargo.toml).

use distlock_runtime::{distributed_lock, LockError, LockManager};
use redis::AsyncCommands;

/// What a sale can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SaleError {
    /// The lock could not be taken or kept.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The stock's store failed.
    #[error(transparent)]
    Store(#[from] redis::RedisError),
    /// Nothing left to sell.
    #[error("sold out")]
    SoldOut,
}

/// Sells one unit of `item`, read and written back under the lock `stock:{item}`.
#[distributed_lock("stock:{item}", ttl = 5, manager = locks)]
pub async fn sell(
    locks: &LockManager,
    store: &mut redis::aio::MultiplexedConnection,
    item: u64,
) -> Result<u64, SaleError> {
    let key = format!("stock:{item}");
    let left: u64 = store.get::<_, Option<u64>>(&key).await?.unwrap_or(0);
    if left == 0 {
        return Err(SaleError::SoldOut);
    }
    // A read-modify-write that oversells without the lock.
    tokio::task::yield_now().await;
    let _: () = store.set(&key, left - 1).await?;
    Ok(left - 1)
}
