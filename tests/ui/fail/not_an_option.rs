use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", 42)]
async fn number(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", +)]
async fn punctuation(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// The options after the bad token are still checked.
#[distributed_lock("a:{id}", 42, ttl = 0)]
async fn then_a_bad_ttl(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
