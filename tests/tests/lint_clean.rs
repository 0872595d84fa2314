//! The expansion adds no warning: every supported form, compiled with the strictest lints
//! (`cargo test` runs rustc's, `cargo clippy --all-targets` clippy's), and run once against a
//! real Redis so each form is also exercised.
#![deny(warnings, clippy::all, clippy::pedantic, unused_qualifications)]

use std::fmt::Display;
use std::sync::Arc;

use distlock_runtime::{distributed_lock, LockError, LockManager};
use distlock_tests::RedisServer;

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("bad input {0}")]
    Bad(String),
}

type AppResult<T> = Result<T, AppError>;

/// A free fn with a doc comment, visibility and `#[must_use]`.
#[must_use = "the total matters"]
#[distributed_lock("order:{order_id}", ttl = 30, wait = "2s", renew = true)]
pub(crate) async fn pay(order_id: u64, cents: u64) -> Result<u64, AppError> {
    if cents == 0 {
        return Err(AppError::Bad(order_id.to_string()));
    }
    Ok(order_id + cents)
}

#[distributed_lock(["stock:{sku}", "user:{user.id}"], crate = "distlock_runtime")]
async fn multi(sku: &str, user: &User) -> AppResult<String> {
    let total = pay(user.id, 1).await?;
    Ok(format!("{sku}:{total}"))
}

#[distributed_lock("generic:{id}")]
async fn generic<T>(id: T, extra: impl Iterator<Item = u8> + Send) -> Result<usize, LockError>
where
    T: Display + Send + Sync,
{
    Ok(extra.count())
}

#[distributed_lock("name:{name}", wait = 0)]
async fn lifetimes<'a>(name: &'a str, fallback: &'a str) -> Result<&'a str, LockError> {
    Ok(if name.is_empty() { fallback } else { name })
}

#[tracing::instrument(skip(amount))]
#[distributed_lock("traced:{id}")]
async fn traced(id: u32, amount: u32) -> Result<u32, LockError> {
    tracing::debug!(amount, "inside");
    Ok(id + amount)
}

#[distributed_lock("traced-below:{id}")]
#[tracing::instrument]
async fn traced_below(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock("one-line:{id}")]
async fn one_line(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock("impl-result:{id}")]
async fn impl_result(id: u32) -> Result<impl Display + Send, LockError> {
    Ok(id * 2)
}

struct User {
    id: u64,
}

struct Service {
    locks: LockManager,
    shard: u32,
    count: u64,
}

trait Counter {
    async fn bump(&mut self, by: u64) -> Result<u64, LockError>;
}

impl Service {
    #[distributed_lock("svc:{self.shard}:{key}", manager = &self.locks)]
    async fn read(&self, key: u32) -> Result<u64, LockError> {
        Ok(self.count + u64::from(key))
    }

    #[distributed_lock("svc:{self.shard}", manager = self.locks.clone())]
    async fn shared(self: Arc<Self>) -> Result<u64, LockError> {
        Ok(self.count)
    }
}

impl Counter for Service {
    #[distributed_lock("svc:{self.shard}:count", manager = &self.locks)]
    async fn bump(&mut self, by: u64) -> Result<u64, LockError> {
        self.count += by;
        Ok(self.count)
    }
}

#[tokio::test]
async fn every_form_compiles_cleanly_and_runs() {
    let server = RedisServer::start();
    let locks = server.manager();
    distlock_runtime::set_default_manager(locks.clone());

    assert_eq!(pay(1, 2).await.unwrap(), 3);
    assert!(matches!(pay(1, 0).await, Err(AppError::Bad(_))));
    assert_eq!(multi("sku", &User { id: 5 }).await.unwrap(), "sku:6");
    assert_eq!(generic("g", [1_u8, 2].into_iter()).await.unwrap(), 2);
    assert_eq!(lifetimes("", "fallback").await.unwrap(), "fallback");
    assert_eq!(traced(1, 2).await.unwrap(), 3);
    assert_eq!(traced_below(4).await.unwrap(), 4);
    assert_eq!(one_line(5).await.unwrap(), 5);
    assert_eq!(impl_result(3).await.unwrap().to_string(), "6");

    let mut service = Service {
        locks,
        shard: 3,
        count: 0,
    };
    assert_eq!(service.bump(2).await.unwrap(), 2);
    assert_eq!(service.read(1).await.unwrap(), 3);
    assert_eq!(Arc::new(service).shared().await.unwrap(), 2);
}
