use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", ttl = "10")]
async fn missing_unit(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", wait = "99999999999999999999ms")]
async fn number_beyond_u64(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", wait = "9999999999999999999h")]
async fn duration_beyond_u64(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
