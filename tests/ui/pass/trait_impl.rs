use distlock_runtime::{distributed_lock, LockError, LockManager};

trait Jobs {
    async fn run(&self, job: u32) -> Result<u32, LockError>;
}

struct Scheduler {
    locks: LockManager,
}

impl Jobs for Scheduler {
    #[distributed_lock("job:{job}", manager = &self.locks, ttl = 60)]
    async fn run(&self, job: u32) -> Result<u32, LockError> {
        Ok(job)
    }
}

fn main() {}
