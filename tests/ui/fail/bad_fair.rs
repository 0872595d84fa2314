use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", fair = 1)]
async fn number(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", fair = "yes")]
async fn string(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", fair)]
async fn no_value(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", fair = true, fair = false)]
async fn twice(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
