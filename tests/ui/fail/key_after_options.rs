use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock(read = "index:{id}", "doc:{id}")]
async fn edit(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
