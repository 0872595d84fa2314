use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("sum:{a + b}")]
async fn sum(a: u64, b: u64) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

#[distributed_lock("call:{a.len()}")]
async fn call(a: String) -> Result<(), LockError> {
    let _ = a;
    Ok(())
}

fn main() {}
