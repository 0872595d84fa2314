use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", manager = =>)]
async fn arrow(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", ttl = *, wait = 0u8)]
async fn star_then_suffix(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
