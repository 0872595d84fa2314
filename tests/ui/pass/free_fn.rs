use distlock_runtime::{distributed_lock, LockError};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("declined")]
    Declined,
}

/// Pays an order; the doc comment survives the attribute.
#[must_use = "the receipt says whether it was paid"]
#[distributed_lock("order:{order_id}", ttl = 30)]
pub(crate) async fn pay(order_id: u64, amount_cents: u64) -> Result<String, AppError> {
    if amount_cents == 0 {
        return Err(AppError::Declined);
    }
    Ok(format!("{order_id}:{amount_cents}"))
}

#[distributed_lock("job", ttl = "1500ms", wait = 0, renew = false)]
async fn try_once() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock("job:{name}", wait = "250ms", ttl = "5m")]
async fn question_mark(name: &str) -> Result<u32, AppError> {
    let parsed: u32 = name.parse().map_err(|_| AppError::Declined)?;
    try_once().await?;
    Ok(parsed)
}

fn main() {
    let _ = pay(1, 2);
    let _ = question_mark("7");
}
