use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", bogus)]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    // The fn is still emitted beside the error: this call resolves.
    let _ = pay(1);
}
