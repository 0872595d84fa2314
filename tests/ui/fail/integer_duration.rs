use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", ttl = 30u8)]
async fn suffixed(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", wait = 5_u64)]
async fn suffixed_wait(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// More than u64::MAX seconds.
#[distributed_lock("a:{id}", ttl = 99999999999999999999)]
async fn beyond_u64(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// Fits in u64 seconds, but not in u64 milliseconds.
#[distributed_lock("a:{id}", wait = 18446744073709552)]
async fn beyond_u64_millis(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
