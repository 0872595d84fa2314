use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("order:{order_id")]
async fn unclosed(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock("order:order_id}")]
async fn unmatched(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
