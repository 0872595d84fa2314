//! [`LockError`] as an HTTP answer, for axum handlers (cargo feature `axum`).
//!
//! The status comes from [`LockError::class`], the one place that sorts errors; this module
//! only says how each class is answered, what the answer tells the client, and what is logged.

use std::sync::Mutex;
use std::time::Duration;

use axum_core::response::{IntoResponse, Response};
use http::header::RETRY_AFTER;
use http::{HeaderValue, StatusCode};

use crate::sync::lock;
use crate::telemetry::Throttle;
use crate::{ErrorClass, LockError};

/// The body of a 409: the lock is held by someone else.
const BUSY: &str = "lock busy: another request holds it; try again";
/// The body of a 503: Redis could not be asked, or could not keep the lease.
const UNAVAILABLE: &str = "lock service unavailable; try again later";
/// The body of a 500: settings or code to fix, said only in the log.
const INTERNAL: &str = "internal error";

/// Answers a lock failure with the status its [`ErrorClass`] calls for, so a handler can return
/// `Result<T, LockError>` (or an app error can delegate its lock variant to this).
///
/// | class | status | `Retry-After` | logged (`tracing`) |
/// |---|---|---|---|
/// | [`Contention`](ErrorClass::Contention) | 409 Conflict | no | no: expected traffic, counted by the metric `distlock_acquisitions_total` |
/// | [`Unavailable`](ErrorClass::Unavailable) | 503 Service Unavailable | for [`RedisTimeout`](LockError::RedisTimeout) and [`Replication`](LockError::Replication), see below | `warn`, with the whole error, at most once a second (with how many went unlogged) |
/// | [`Misconfigured`](ErrorClass::Misconfigured), [`CallerBug`](ErrorClass::CallerBug) | 500 Internal Server Error | no | `error`, with the whole error, at most once a second: the body says nothing, so the log is where an operator learns what to fix |
///
/// The body is a short `text/plain; charset=utf-8` sentence per status (`lock busy: another
/// request holds it; try again`, `lock service unavailable; try again later`, `internal
/// error`). It never carries the error's message, which may name the lock's keys (they can
/// hold user data), Redis's own error text, or hosts.
///
/// `Retry-After` (whole seconds, rounded up, at least 1) is sent where the error carries how long
/// the part that failed was just waited for in vain: the response timeout of a
/// [`RedisTimeout`](LockError::RedisTimeout) (the server, or a pooled connection, was not had for
/// that long) and
/// the replica wait of a [`Replication`](LockError::Replication) (the replicas did not confirm
/// within it). A retry sooner would most likely meet the same; it is a floor, not a forecast of
/// the recovery. The other unavailable errors carry no such time: the durations of
/// [`AnsweredTooLate`](LockError::AnsweredTooLate) are a response time that did end in an
/// answer (a retry may succeed at once), and [`Redis`](LockError::Redis),
/// [`NoQuorum`](LockError::NoQuorum) and [`LeaseLost`](LockError::LeaseLost) carry none.
///
/// ```
/// use axum::extract::{Path, State};
/// use axum::routing::post;
/// use axum::Router;
/// use distlock_runtime::{distributed_lock, LockError, LockManager};
///
/// // A second payment of the same order while one runs is answered 409 at once; Redis down, 503.
/// #[distributed_lock("order:{order_id}", manager = &locks, wait = 0)]
/// async fn pay(
///     State(locks): State<LockManager>,
///     Path(order_id): Path<u64>,
/// ) -> Result<String, LockError> {
///     Ok(format!("order {order_id} paid"))
/// }
///
/// # fn main() -> Result<(), LockError> {
/// let locks = LockManager::from_url("redis://127.0.0.1:6379")?;
/// let app: Router = Router::new()
///     .route("/orders/{order_id}/pay", post(pay))
///     .with_state(locks);
/// # let _ = app;
/// # Ok(()) }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        match self.class() {
            ErrorClass::Contention => (StatusCode::CONFLICT, BUSY).into_response(),
            ErrorClass::Unavailable => {
                if let Some(held_back) = note(&UNAVAILABLE_LOGGED) {
                    tracing::warn!(
                        error = %self,
                        unlogged_before = held_back,
                        "distlock: answering 503, a lock could not be had (logged at most once a second)"
                    );
                }
                let retry_after = retry_after(&self).map(|after| [(RETRY_AFTER, after)]);
                (StatusCode::SERVICE_UNAVAILABLE, retry_after, UNAVAILABLE).into_response()
            }
            ErrorClass::Misconfigured | ErrorClass::CallerBug => {
                if let Some(held_back) = note(&INTERNAL_LOGGED) {
                    tracing::error!(
                        error = %self,
                        class = ?self.class(),
                        unlogged_before = held_back,
                        "distlock: answering 500 to a lock failure (logged at most once a second)"
                    );
                }
                (StatusCode::INTERNAL_SERVER_ERROR, INTERNAL).into_response()
            }
        }
    }
}

/// The 503s and the 500s logged: each at most once a second, so an outage or a wrong setting
/// that fails every request does not log every request.
static UNAVAILABLE_LOGGED: Mutex<Throttle> = Mutex::new(Throttle::new());
static INTERNAL_LOGGED: Mutex<Throttle> = Mutex::new(Throttle::new());

/// Counts one answer of a kind; `Some(how many went unlogged since the last line)` when this one
/// is to be logged.
fn note(logged: &Mutex<Throttle>) -> Option<u64> {
    // The process's clock, not a runtime's: a paused test runtime's would be shared by every
    // runtime through these statics.
    lock(logged).note(tokio::time::Instant::from_std(std::time::Instant::now()))
}

/// The `Retry-After` of an unavailable error, where it carries how long the failing part was
/// waited for (see the impl's docs).
fn retry_after(error: &LockError) -> Option<HeaderValue> {
    let waited = match error {
        LockError::RedisTimeout { after, .. } => *after,
        LockError::Replication { within, .. } => *within,
        _ => return None,
    };
    Some(HeaderValue::from(whole_seconds(waited)))
}

/// `duration` in whole seconds, rounded up, at least 1 (`Retry-After: 0` would invite an
/// immediate retry).
fn whole_seconds(duration: Duration) -> u64 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    seconds.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Misconfiguration;
    use http::header::CONTENT_TYPE;

    const KEY: &str = "order:secret-user@example.com";
    const URL: &str = "redis://app:hunter2@10.0.0.7:6379";

    /// The answer's status, `Retry-After` and content type, and its body as text.
    async fn answer(error: LockError) -> (StatusCode, Option<String>, String, String) {
        let response = error.into_response();
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|value: &HeaderValue| value.to_str().unwrap().to_owned())
        };
        let (retry_after, content_type) = (header(RETRY_AFTER), header(CONTENT_TYPE));
        let status = response.status();
        let body =
            futures_util::StreamExt::collect::<Vec<_>>(response.into_body().into_data_stream())
                .await
                .into_iter()
                .map(|chunk| String::from_utf8(chunk.unwrap().to_vec()).unwrap())
                .collect::<String>();
        (
            status,
            retry_after,
            content_type.expect("a content type"),
            body,
        )
    }

    /// The body tells the client nothing it should not see: no key, no URL, no Redis text.
    fn assert_discreet(body: &str) {
        for secret in ["secret-user", "hunter2", "10.0.0.7", "redis://", "order:"] {
            assert!(!body.contains(secret), "{body:?} leaks {secret:?}");
        }
    }

    const TEXT: &str = "text/plain; charset=utf-8";

    fn redis_error() -> redis::RedisError {
        redis::RedisError::from((
            redis::ErrorKind::Io,
            "connection refused",
            format!("dialling {URL} for {KEY}"),
        ))
    }

    #[tokio::test]
    async fn a_try_lock_that_found_the_lock_held_is_409() {
        let (status, retry_after, content_type, body) = answer(LockError::NotAcquired {
            key: KEY.to_owned(),
        })
        .await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(retry_after, None);
        assert_eq!(content_type, TEXT);
        assert_eq!(body, BUSY);
        assert_discreet(&body);
    }

    #[tokio::test]
    async fn a_wait_that_ran_out_is_409() {
        let (status, retry_after, content_type, body) = answer(LockError::Timeout {
            key: KEY.to_owned(),
            waited: Duration::from_secs(10),
        })
        .await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(retry_after, None);
        assert_eq!(content_type, TEXT);
        assert_discreet(&body);
    }

    #[tokio::test]
    async fn redis_not_answering_is_503_with_the_timeout_rounded_up_as_retry_after() {
        let (status, retry_after, content_type, body) = answer(LockError::RedisTimeout {
            op: "acquire",
            after: Duration::from_millis(1500),
        })
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after.as_deref(), Some("2"));
        assert_eq!(content_type, TEXT);
        assert_eq!(body, UNAVAILABLE);
        assert_discreet(&body);
    }

    #[tokio::test]
    async fn replicas_that_did_not_confirm_are_503_with_at_least_one_second_to_wait() {
        let (status, retry_after, _, body) = answer(LockError::Replication {
            op: "acquire",
            acked: 0,
            needed: 1,
            within: Duration::from_millis(40),
        })
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert_discreet(&body);
    }

    #[tokio::test]
    async fn a_redis_error_is_503_without_retry_after_and_without_its_text() {
        let (status, retry_after, content_type, body) = answer(LockError::Redis {
            op: "acquire",
            source: redis_error(),
        })
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after, None);
        assert_eq!(content_type, TEXT);
        assert!(!body.contains("refused"), "{body:?}");
        assert_discreet(&body);
    }

    #[tokio::test]
    async fn a_lost_lease_is_503_without_retry_after() {
        let (status, retry_after, _, body) = answer(LockError::LeaseLost {
            keys: vec![KEY.to_owned()],
        })
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after, None);
        assert_discreet(&body);
    }

    #[tokio::test]
    async fn a_misconfiguration_is_500_and_says_nothing_of_it() {
        let (status, retry_after, content_type, body) = answer(LockError::Misconfigured {
            op: "acquire",
            problem: Misconfiguration::Credentials,
            detail: format!("ACL SETUSER app on ~{KEY}"),
            source: redis_error(),
        })
        .await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(retry_after, None);
        assert_eq!(content_type, TEXT);
        assert_eq!(body, INTERNAL);
        assert_discreet(&body);
    }

    #[tokio::test]
    async fn a_caller_bug_is_500() {
        let (status, retry_after, content_type, body) = answer(LockError::HeldByThisTask {
            key: KEY.to_owned(),
        })
        .await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(retry_after, None);
        assert_eq!(content_type, TEXT);
        assert_discreet(&body);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_and_is_never_zero() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(1)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(30)), 30);
    }
}
