use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock(order_id)]
async fn parameter_as_key(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(42)]
async fn number_as_key(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(["a:{order_id}", order_id])]
async fn parameter_in_list(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

#[distributed_lock(["a:{order_id}" "b:{order_id}"])]
async fn list_without_comma(order_id: u64) -> Result<(), LockError> {
    let _ = order_id;
    Ok(())
}

fn main() {}
