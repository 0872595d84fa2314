//! An axum handler under `#[distributed_lock]`, with an app error type that turns a
//! `LockError` into an HTTP status: `cargo run --example axum_handler`, then
//! `curl -X POST localhost:3000/orders/42/pay`.
//!
//! A handler's error type needs `From<LockError>`: axum's `StatusCode` and `String` lack it, so
//! the attribute refuses them (with a message saying so). Give the app an error enum with a
//! `Lock(#[from] LockError)` variant and one `IntoResponse`, as here, or return
//! `anyhow::Result<T>` (anyhow's error has `From` for every error type) and map it yourself.
//!
//! By the error's class (`LockError::class`, see `ErrorClass` for which variant is in which):
//!
//! | class | status |
//! |---|---|
//! | `Contention` (`NotAcquired`, `Timeout`: someone else is on it) | 409 Conflict |
//! | `Unavailable` (`Redis`, `RedisTimeout`, `NoQuorum`, `Replication`, `LeaseLost`: try again later) | 503 Service Unavailable |
//! | `Misconfigured`, `CallerBug` (settings or code to fix: retrying will not help) | 500 Internal Server Error |

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use distlock_examples::local_redis::LocalRedis;
use distlock_runtime::{distributed_lock, ErrorClass, LockError, LockManager};

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("order {0} does not exist")]
    NoSuchOrder(u64),
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = match &self {
            AppError::Lock(error) => match error.class() {
                ErrorClass::Contention => StatusCode::CONFLICT,
                ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
            AppError::NoSuchOrder(_) => StatusCode::NOT_FOUND,
        };
        (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response()
    }
}

/// Pays an order: at most one request per order at a time across every instance; a second one
/// gets 409 at once (`wait = 0`).
#[distributed_lock("order:{order_id}", ttl = 10, wait = 0)]
async fn pay(Path(order_id): Path<u64>) -> Result<Json<serde_json::Value>, AppError> {
    if order_id == 0 {
        return Err(AppError::NoSuchOrder(order_id));
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await; // the payment provider
    Ok(Json(serde_json::json!({ "order": order_id, "paid": true })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = LocalRedis::from_env_or_start()?;
    eprintln!("Redis: {}", redis.origin);
    distlock_runtime::set_default_manager(LockManager::from_url(&redis.url)?);
    let app = Router::new().route("/orders/{order_id}/pay", post(pay));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://127.0.0.1:3000 (POST /orders/42/pay)");
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(error: LockError) -> StatusCode {
        AppError::from(error).into_response().status()
    }

    #[test]
    fn lock_failures_map_to_statuses() {
        let key = || "order:1".to_owned();
        assert_eq!(
            status(LockError::NotAcquired { key: key() }),
            StatusCode::CONFLICT
        );
        assert_eq!(
            status(LockError::Timeout {
                key: key(),
                waited: std::time::Duration::from_secs(1)
            }),
            StatusCode::CONFLICT
        );
        assert_eq!(
            status(LockError::RedisTimeout {
                op: "acquire",
                after: std::time::Duration::from_secs(1)
            }),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            status(LockError::LeaseLost { keys: vec![key()] }),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            status(LockError::NotConfigured),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        // A bug in the calling code: no retry will fix it.
        assert_eq!(
            status(LockError::HeldByThisTask { key: key() }),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
