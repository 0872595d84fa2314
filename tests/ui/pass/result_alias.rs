use distlock_runtime::{distributed_lock, LockError};

#[derive(Debug)]
struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

type AppResult<T> = Result<T, AppError>;

#[distributed_lock("report:{day}")]
async fn daily(day: u32) -> AppResult<u32> {
    Ok(day)
}

#[distributed_lock("report:{day}")]
async fn qualified(day: u32) -> std::result::Result<u32, LockError> {
    Ok(day)
}

fn main() {
    let _ = daily(1);
    let _ = qualified(1);
}
