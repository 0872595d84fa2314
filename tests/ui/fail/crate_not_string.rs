use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("order:{id}", crate = lock)]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
