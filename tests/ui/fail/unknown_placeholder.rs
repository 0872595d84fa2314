use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("order:{orderid}")]
async fn pay(order_id: u64, amount: u64) -> Result<(), LockError> {
    let _ = (order_id, amount);
    Ok(())
}

#[distributed_lock("order:{self.id}")]
async fn no_self(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
