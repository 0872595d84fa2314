use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(ttl = 5)]
async fn options_only(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
