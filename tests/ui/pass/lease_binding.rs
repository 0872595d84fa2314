// `lease = NAME` binds the body's lease: its fencing token without naming the key, in free fns,
// methods, with `read` and `permits`, and under any name.
#![deny(warnings)]

use distlock_runtime::{distributed_lock, CurrentLease, LockError, LockManager};

struct Storage;

impl Storage {
    fn write(&self, _value: u64, _fencing_token: u64) {}
}

#[distributed_lock("account:{id}", ttl = 30, lease = lease)]
async fn deposit(storage: &Storage, id: u64, cents: u64) -> Result<u64, LockError> {
    storage.write(cents, lease.fencing_token());
    let _ = id;
    Ok(lease.fencing_token())
}

// Options after the binding, and a name of the caller's choosing.
#[distributed_lock(["a:{id}", "b:{id}"], lease = held, wait = 0)]
async fn both(id: u64) -> Result<Vec<String>, LockError> {
    let _ = id;
    Ok(held.keys().to_vec())
}

#[distributed_lock(read = "doc:{id}", lease = lease)]
async fn view(id: u64) -> Result<u64, LockError> {
    let _ = id;
    Ok(lease.fencing_token())
}

#[distributed_lock("exports", permits = 8, lease = permit)]
async fn export() -> Result<CurrentLease, LockError> {
    Ok(permit)
}

struct Service {
    locks: LockManager,
}

impl Service {
    #[distributed_lock("job:{name}", manager = &self.locks, lease = lease)]
    async fn run(&self, name: &str) -> Result<u64, LockError> {
        Ok(lease.fencing_token() + name.len() as u64)
    }
}

fn main() {
    let service = Service {
        locks: LockManager::from_url("redis://127.0.0.1:1").unwrap(),
    };
    let _ = deposit(&Storage, 1, 2);
    let _ = both(1);
    let _ = view(1);
    let _ = export();
    let _ = service.run("x");
}
