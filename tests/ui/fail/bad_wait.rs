use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", wait = "x")]
async fn letters(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", wait = 1.5)]
async fn call(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
