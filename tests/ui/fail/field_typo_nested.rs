use distlock_runtime::{distributed_lock, LockError};

struct Inner {
    from: u64,
}

struct Req {
    inner: Inner,
}

// The typo is in the last field: the error names the type that lacks it.
#[distributed_lock("transfer:{req.inner.fromm}")]
async fn last_field(req: Req) -> Result<(), LockError> {
    let _ = req.inner.from;
    Ok(())
}

// The typo is in the middle of the path.
#[distributed_lock("transfer:{req.iner.from}")]
async fn middle_field(req: Req) -> Result<(), LockError> {
    let _ = req.inner.from;
    Ok(())
}

// A path through `self` in a method.
impl Req {
    #[distributed_lock("transfer:{self.inner.fromm}")]
    async fn method(&self) -> Result<(), LockError> {
        let _ = self.inner.from;
        Ok(())
    }
}

fn main() {}
