use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("order:{id}", manager)]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("order:{id}", manager = 5)]
async fn not_a_manager(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
