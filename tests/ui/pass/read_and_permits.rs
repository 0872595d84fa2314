// Shared keys (`read`) alone or beside keys held exclusively, and semaphores (`permits`) from a
// literal or an expression converted at every call.
#![deny(warnings)]

use std::sync::Arc;

use distlock_runtime::{distributed_lock, LockError, LockManager};

const EXPORTS: u32 = 8;

struct Settings {
    exports: i64,
}

struct Doc {
    id: u64,
}

// One shared key, alone: many readers, no writer.
#[distributed_lock(read = "doc:{id}")]
async fn view(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

// Several shared keys, and options before and after them.
#[distributed_lock(ttl = 5, read = ["doc:{doc.id}", "schema:{version}"], wait = "250ms")]
async fn render(doc: &Doc, version: u32) -> Result<u64, LockError> {
    Ok(doc.id + u64::from(version))
}

// Written exclusively, read shared, all taken together.
#[distributed_lock("report:{id}", read = ["sales:{id}", "stock:{id}"], renew = false)]
async fn build_report(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(["a:{id}", "b:{id}"], read = "c:{id}", fair = false)]
async fn several_both_ways(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// One shared key can be fair.
#[distributed_lock(read = "catalog:{sku}", fair = true)]
async fn fair_reader(sku: String) -> Result<(), LockError> {
    let _ = sku;
    Ok(())
}

// A semaphore of a literal count, with a fair queue.
#[distributed_lock("exports", permits = 8, fair = true)]
async fn export() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(["exports:{region}"], permits = 3u8)]
async fn export_in(region: &str) -> Result<(), LockError> {
    let _ = region;
    Ok(())
}

// Counts from a const, a parameter, a field, a reference: any integer type.
#[distributed_lock("exports", permits = EXPORTS)]
async fn from_const() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock("exports:{region}", permits = limit)]
async fn from_parameter(region: String, limit: usize) -> Result<(), LockError> {
    let _ = region;
    Ok(())
}

#[distributed_lock("exports", permits = settings.exports, ttl = 10)]
async fn from_field(settings: &Settings) -> Result<(), LockError> {
    let _ = settings;
    Ok(())
}

#[distributed_lock("exports", permits = limit * 2)]
async fn from_reference(limit: &u16) -> Result<(), LockError> {
    let _ = limit;
    Ok(())
}

struct Service {
    locks: Arc<LockManager>,
    shard: u32,
    workers: u32,
}

impl Service {
    #[distributed_lock(read = "shard:{self.shard}", manager = &self.locks)]
    async fn scan(&self) -> Result<u32, LockError> {
        Ok(self.shard)
    }

    #[distributed_lock("jobs:{self.shard}", permits = self.workers, manager = &self.locks)]
    async fn work(&self, job: u64) -> Result<u64, LockError> {
        Ok(job)
    }
}

fn assert_send<T: Send>(_: &T) {}

fn main() {
    let doc = Doc { id: 1 };
    assert_send(&view(1));
    let _ = render(&doc, 2);
    let _ = build_report(1);
    let _ = several_both_ways(1);
    let _ = fair_reader(String::new());
    assert_send(&export());
    let _ = export_in("eu");
    let _ = from_const();
    let _ = from_parameter(String::new(), 4);
    let _ = from_field(&Settings { exports: 2 });
    let _ = from_reference(&2);
    let locks = Arc::new(LockManager::from_url("redis://127.0.0.1:1").expect("a valid URL"));
    let service = Service { locks, shard: 1, workers: 4 };
    let _ = service.scan();
    let _ = service.work(7);
}
