use distlock_runtime::{distributed_lock, LockError};

trait Orders {
    #[distributed_lock("order:{id}")]
    async fn pay(&self, id: u64) -> Result<(), LockError>;
}

fn main() {}
