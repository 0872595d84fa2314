use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("a:{id}", "b:{id}")]
async fn keys_without_brackets(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", tll = 1, ttl = 5 6)]
async fn several_problems(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{idd}", manager = )]
async fn empty_manager_and_bad_placeholder(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("a:{id}", ttl = 40000000, wait = "1.5s")]
async fn too_long_and_fraction(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

fn main() {}
