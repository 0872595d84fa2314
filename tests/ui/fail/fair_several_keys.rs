use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock(["stock:{sku}", "wallet:{user}"], fair = true)]
async fn buy(sku: u64, user: u64) -> Result<(), LockError> {
    let _ = (sku, user);
    Ok(())
}

// The same key twice still counts as several: the check counts the literals as written.
#[distributed_lock(["stock:{sku}", "stock:{sku}"], ttl = 5, fair = true)]
async fn same_key_twice(sku: u64) -> Result<(), LockError> {
    let _ = sku;
    Ok(())
}

// Not fair: several keys are fine.
#[distributed_lock(["stock:{sku}", "wallet:{user}"], fair = false)]
async fn unfair(sku: u64, user: u64) -> Result<(), LockError> {
    let _ = (sku, user);
    Ok(())
}

// The `read` keys count too: the request is for two keys.
#[distributed_lock("stock:{sku}", read = "catalog:{sku}", fair = true)]
async fn with_read(sku: u64) -> Result<(), LockError> {
    let _ = sku;
    Ok(())
}

// One shared key alone can be fair.
#[distributed_lock(read = "catalog:{sku}", fair = true)]
async fn read_alone(sku: u64) -> Result<(), LockError> {
    let _ = sku;
    Ok(())
}

fn main() {
    // The fn is still emitted beside the error: this call resolves.
    let _ = buy(1, 2);
}
