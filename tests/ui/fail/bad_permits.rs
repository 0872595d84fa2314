use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("exports", permits = -1)]
async fn negative(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("exports", permits = 4294967296)]
async fn too_large(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("exports", permits = "8")]
async fn string(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("exports", permits)]
async fn no_value(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("exports", permits = 2, permits = 3)]
async fn twice(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
