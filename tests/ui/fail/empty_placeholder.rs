use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("order:{}")]
async fn empty(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("order:{ }")]
async fn blank(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
