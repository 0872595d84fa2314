use std::sync::Arc;

use distlock_runtime::{distributed_lock, LockError, LockManager};

struct Wallets {
    locks: LockManager,
    shard: u32,
    balance: i64,
}

impl Wallets {
    #[distributed_lock("wallet:{self.shard}:{user}", manager = &self.locks)]
    async fn balance(&self, user: u64) -> Result<i64, LockError> {
        let _ = user;
        Ok(self.balance)
    }

    #[distributed_lock("wallet:{self.shard}:{user}", manager = self.locks.clone())]
    async fn credit(&mut self, user: u64, amount: i64) -> Result<i64, LockError> {
        let _ = user;
        self.balance += amount;
        Ok(self.balance)
    }

    #[distributed_lock("wallet:{self.shard}", manager = &self.locks)]
    async fn audit(self: Arc<Self>) -> Result<i64, LockError> {
        Ok(self.balance)
    }

    #[distributed_lock("wallet:{id}")]
    async fn associated(id: u32) -> Result<u32, LockError> {
        Ok(id)
    }
}

fn main() {
    let _ = Wallets::associated(1);
}
