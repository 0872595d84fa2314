use distlock_runtime::{distributed_lock, LockError};

struct Opaque;

#[distributed_lock("thing:{thing}")]
async fn pay(thing: Opaque) -> Result<(), LockError> {
    let _ = thing;
    Ok(())
}

fn main() {}
