use distlock_runtime::{distributed_lock, LockError};

struct Req {
    from: u64,
    to: u64,
}

#[distributed_lock("transfer:{req.fromm}")]
async fn transfer(req: Req) -> Result<(), LockError> {
    let _ = (req.from, req.to);
    Ok(())
}

fn main() {}
