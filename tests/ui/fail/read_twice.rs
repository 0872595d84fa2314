use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock(read = "doc:{id}", ttl = 5, read = "index:{id}")]
async fn view(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
