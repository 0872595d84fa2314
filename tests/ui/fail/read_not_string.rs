use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock(read = id)]
async fn parameter_as_key(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("doc:{id}", read = ["index:{id}", 42, format!("x")])]
async fn not_literals(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
