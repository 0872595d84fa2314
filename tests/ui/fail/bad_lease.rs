// `lease` takes a plain variable name, once, that no parameter has.
use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("account:{id}", lease = "lease")]
async fn quoted(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("account:{id}", lease = self.lease)]
async fn path(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("account:{id}", lease = id)]
async fn hides_a_parameter(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("account:{id}", lease = a, lease = b)]
async fn twice(id: u64) -> Result<(), LockError> {
    let _ = (id, a);
    Ok(())
}

fn main() {}
