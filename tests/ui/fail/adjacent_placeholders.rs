use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("pair:{a}{b}")]
async fn adjacent(a: String, b: String) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

#[distributed_lock("pair:{a}-{b}")]
async fn dash(a: String, b: String) -> Result<(), LockError> {
    let _ = (a, b);
    Ok(())
}

fn main() {}
