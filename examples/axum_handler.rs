//! axum handlers under `#[distributed_lock]`, with the runtime's feature `axum` answering lock
//! failures: `cargo run --example axum_handler`, then `curl -X POST localhost:3000/orders/42/pay`
//! (twice at once: the second gets 409).
//!
//! With the feature, `LockError` is an axum response (409 when someone else holds the lock, 503
//! when Redis is unavailable, 500 for settings or code to fix; its `IntoResponse` docs give the
//! details), so a handler whose only failure is the lock returns `Result<T, LockError>`. A
//! handler with failures of its own returns the app's error enum, which needs
//! `From<LockError>` for the attribute (axum's `StatusCode` and `String` lack it, and the
//! attribute says so) and hands its lock variant to `LockError::into_response`.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use distlock_examples::local_redis::LocalRedis;
use distlock_runtime::{distributed_lock, LockError, LockManager};

/// What every handler shares: here, the instance's lock manager.
#[derive(Clone)]
struct AppState {
    locks: LockManager,
}

/// Everything the payment handler can fail with.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("order {0} does not exist")]
    NoSuchOrder(u64),
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            // 409, 503 (with Retry-After where known) or 500, as the runtime answers it.
            AppError::Lock(error) => error.into_response(),
            AppError::NoSuchOrder(_) => (
                StatusCode::NOT_FOUND,
                Json(serde_json::json!({ "error": self.to_string() })),
            )
                .into_response(),
        }
    }
}

/// How long the payment provider takes.
const PROVIDER: Duration = Duration::from_millis(500);

/// Pays an order: at most one request per order at a time across every instance; a second one
/// gets 409 at once (`wait = 0`).
#[distributed_lock("order:{order_id}", manager = &state.locks, ttl = 10, wait = 0)]
async fn pay(
    State(state): State<AppState>,
    Path(order_id): Path<u64>,
) -> Result<Json<serde_json::Value>, AppError> {
    if order_id == 0 {
        return Err(AppError::NoSuchOrder(order_id));
    }
    tokio::time::sleep(PROVIDER).await;
    Ok(Json(serde_json::json!({ "order": order_id, "paid": true })))
}

/// Sends an order's confirmation, one sender per order at a time (waiting up to 1 s for the
/// other): the lock is its only failure, so it returns `LockError` itself.
#[distributed_lock("order:{order_id}:mail", manager = &state.locks, wait = 1)]
async fn confirm(
    State(state): State<AppState>,
    Path(order_id): Path<u64>,
) -> Result<Json<serde_json::Value>, LockError> {
    Ok(Json(
        serde_json::json!({ "order": order_id, "confirmed": true }),
    ))
}

/// The service's routes, on the instance's lock manager.
fn app(locks: LockManager) -> Router {
    Router::new()
        .route("/orders/{order_id}/pay", post(pay))
        .route("/orders/{order_id}/confirm", post(confirm))
        .with_state(AppState { locks })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = LocalRedis::from_env_or_start()?;
    eprintln!("Redis: {}", redis.origin);
    let locks = LockManager::from_url(&redis.url)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    eprintln!("listening on http://127.0.0.1:3000 (POST /orders/42/pay, /orders/42/confirm)");
    axum::serve(listener, app(locks)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
    use distlock_runtime::testing::TestRedis;

    /// Serves `app(locks)` on a free loopback port; returns its base URL.
    async fn serve(locks: LockManager) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app(locks)).await });
        base
    }

    /// The app's own failure keeps its answer; its lock failures get exactly the runtime's.
    #[test]
    fn the_app_error_answers_its_own_variant_and_hands_over_the_lock() {
        let own = AppError::NoSuchOrder(0).into_response();
        assert_eq!(own.status(), StatusCode::NOT_FOUND);
        assert_eq!(own.headers()[CONTENT_TYPE], "application/json");

        let lock = || LockError::RedisTimeout {
            op: "acquire",
            after: Duration::from_secs(2),
        };
        let (ours, theirs) = (
            AppError::from(lock()).into_response(),
            lock().into_response(),
        );
        assert_eq!(ours.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(ours.status(), theirs.status());
        assert_eq!(ours.headers(), theirs.headers());
        assert_eq!(ours.headers()[RETRY_AFTER], "2");
    }

    #[tokio::test]
    async fn two_payments_of_one_order_at_once_get_one_200_and_one_409() {
        let redis = TestRedis::start().await.unwrap();
        let base = serve(redis.manager()).await;
        let client = reqwest::Client::new();
        let pay = || client.post(format!("{base}/orders/42/pay")).send();
        let (a, b) = tokio::join!(pay(), pay());
        let mut statuses = [a.unwrap().status(), b.unwrap().status()];
        statuses.sort();
        assert_eq!(statuses, [StatusCode::OK, StatusCode::CONFLICT]);

        // Another order is not held up; an unknown one is the app's 404.
        let other = client.post(format!("{base}/orders/7/pay")).send().await;
        assert_eq!(other.unwrap().status(), StatusCode::OK);
        let unknown = client.post(format!("{base}/orders/0/pay")).send().await;
        assert_eq!(unknown.unwrap().status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn a_handler_returning_lock_error_answers_409_while_another_instance_holds_the_key() {
        let redis = TestRedis::start().await.unwrap();
        let base = serve(redis.manager()).await;
        let client = reqwest::Client::new();
        let confirm = || client.post(format!("{base}/orders/42/confirm")).send();
        assert_eq!(confirm().await.unwrap().status(), StatusCode::OK);

        // Another instance of the service, with its own manager, holds the key past the wait.
        let other = redis.manager();
        let held = other.lock("order:42:mail").acquire().await.unwrap();
        let busy = confirm().await.unwrap();
        assert_eq!(busy.status(), StatusCode::CONFLICT);
        assert!(!busy.text().await.unwrap().contains("order:42"));
        held.release().await.unwrap();
        assert_eq!(confirm().await.unwrap().status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn a_dead_redis_answers_503_at_once() {
        let mut redis = TestRedis::start().await.unwrap();
        let base = serve(redis.manager()).await;
        let client = reqwest::Client::new();
        let confirm = || client.post(format!("{base}/orders/42/confirm")).send();
        assert_eq!(confirm().await.unwrap().status(), StatusCode::OK);

        redis.kill();
        let started = std::time::Instant::now();
        let down = confirm().await.unwrap();
        assert_eq!(down.status(), StatusCode::SERVICE_UNAVAILABLE);
        // A refused connection is no measure of when Redis will be back.
        assert_eq!(down.headers().get(RETRY_AFTER), None);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_hung_redis_answers_503_with_retry_after_within_the_response_timeout() {
        let mut redis = TestRedis::start().await.unwrap();
        let locks = redis
            .manager_builder()
            .response_timeout(Duration::from_millis(300))
            .build()
            .unwrap();
        let base = serve(locks).await;
        let client = reqwest::Client::new();
        let confirm = || client.post(format!("{base}/orders/42/confirm")).send();
        assert_eq!(confirm().await.unwrap().status(), StatusCode::OK);

        redis.pause().unwrap();
        let started = std::time::Instant::now();
        let hung = confirm().await.unwrap();
        let took = started.elapsed();
        redis.resume().unwrap();
        assert_eq!(hung.status(), StatusCode::SERVICE_UNAVAILABLE);
        // The 300 ms the server went unanswered, in whole seconds.
        assert_eq!(hung.headers()[RETRY_AFTER], "1");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
