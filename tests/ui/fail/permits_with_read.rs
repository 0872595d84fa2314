use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("exports", read = "catalog:{id}", permits = 4)]
async fn export(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(permits = 4, read = ["catalog:{id}"])]
async fn read_only(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {
    let _ = export(1);
}
