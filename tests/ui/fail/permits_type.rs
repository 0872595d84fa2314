use distlock_runtime::{distributed_lock, LockError};

// An expression is converted at each call: it must be an integer.
#[distributed_lock("exports", permits = limit)]
async fn export(limit: f64) -> Result<(), LockError> {
    let _ = limit;
    Ok(())
}

fn main() {}
