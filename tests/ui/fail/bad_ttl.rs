use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", ttl = 0)]
async fn zero(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", ttl = -5)]
async fn negative(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", ttl = "abc")]
async fn letters(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", ttl = "5 parsecs")]
async fn parsecs(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", ttl = "5ms")]
async fn too_short(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
