use std::sync::Arc;

use distlock_runtime::{distributed_lock, LockError, LockManager};

struct State {
    locks: LockManager,
}

#[distributed_lock("product:{product_id}", manager = &state.locks)]
async fn buy(state: Arc<State>, product_id: u64, user: String) -> Result<String, LockError> {
    tokio::task::yield_now().await;
    Ok(format!("{product_id}:{user}"))
}

#[distributed_lock("job:{id}")]
async fn job(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

fn require_send<T: Send + 'static>(_: T) {}

fn main() {
    let state = Arc::new(State { locks: LockManager::from_url("redis://127.0.0.1:1").unwrap() });
    require_send(buy(state, 1, "u".into()));
    require_send(job(1));
}
