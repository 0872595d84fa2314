use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", ttl = String::from("30s"))]
async fn text(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
