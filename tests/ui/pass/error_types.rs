//! Every error type with `From<LockError>` can be returned, whatever gives it the impl.

use std::error::Error;
use std::fmt::Display;

use distlock_runtime::{distributed_lock, LockError};

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("not found")]
    NotFound,
}

#[distributed_lock("a:{id}")]
async fn app_error(id: u32) -> Result<u32, AppError> {
    if id == 0 {
        return Err(AppError::NotFound);
    }
    Ok(id)
}

#[distributed_lock("b:{id}")]
async fn boxed(id: u32) -> Result<u32, Box<dyn Error + Send + Sync>> {
    Ok(id)
}

#[distributed_lock("c:{id}")]
async fn boxed_local(id: u32) -> Result<u32, Box<dyn Error>> {
    Ok(id)
}

/// Shaped like `anyhow::Error`: `From` every `std::error::Error + Send + Sync + 'static`.
#[derive(Debug)]
struct AnyError(Box<dyn Error + Send + Sync>);

impl<E: Error + Send + Sync + 'static> From<E> for AnyError {
    fn from(error: E) -> Self {
        AnyError(Box::new(error))
    }
}

type AnyResult<T> = Result<T, AnyError>;

#[distributed_lock("d:{id}")]
async fn anyhow_like(id: u32) -> AnyResult<u32> {
    Ok(id)
}

#[distributed_lock("e:{id}")]
async fn generic_error<E: From<LockError>>(id: u32) -> Result<impl Display, E> {
    Ok(id)
}

fn main() {
    let _ = app_error(1);
    let _ = boxed(1);
    let _ = boxed_local(1);
    let _ = anyhow_like(1);
    let _ = generic_error::<LockError>(1);
    let _ = AnyError::from(std::fmt::Error).0;
}
