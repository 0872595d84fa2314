use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("doc:{id}", read = [])]
async fn empty_list(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// Without a key held exclusively, only the `read` error: not a missing key too.
#[distributed_lock(read = [])]
async fn empty_list_alone(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("doc:{id}", read = , ttl = 5)]
async fn missing_value(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(read)]
async fn no_value(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
