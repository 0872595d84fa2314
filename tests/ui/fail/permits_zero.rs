use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("exports", permits = 0)]
async fn export(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    // The fn is still emitted beside the error: this call resolves.
    let _ = export(1);
}
