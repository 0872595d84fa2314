use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("order:{id}")]
async fn pay(id: u64) -> impl std::fmt::Debug {
    let _: Result<(), LockError> = Ok(());
    id
}

fn main() {}
