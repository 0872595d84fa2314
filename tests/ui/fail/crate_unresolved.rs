use distlock_runtime::{distributed_lock, LockError};

// A valid path that names no crate: the error comes from rustc, on the string.
#[distributed_lock("order:{id}", crate = "no_such_runtime")]
async fn pay(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
