use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("k:{id}")]
async fn no_parameters() -> Result<(), LockError> {
    Ok(())
}

fn main() {}
