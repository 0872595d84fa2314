use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("")]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock([])]
async fn no_keys(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
