use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock(["exports:{region}", "imports:{region}"], permits = 4)]
async fn transfer(region: String) -> Result<(), LockError> {
    let _ = region;
    Ok(())
}

// The same key twice still counts as several: the check counts the literals as written.
#[distributed_lock(["exports:{region}", "exports:{region}"], permits = limit)]
async fn same_key_twice(region: String, limit: u32) -> Result<(), LockError> {
    let _ = (region, limit);
    Ok(())
}

fn main() {
    let _ = transfer(String::new());
}
