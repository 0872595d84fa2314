use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", renew = "yes")]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
