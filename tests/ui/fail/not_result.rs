use distlock_runtime::distributed_lock;

#[distributed_lock("order:{id}")]
async fn returns_nothing(id: u64) {
    let _ = id;
}

#[distributed_lock("order:{id}")]
async fn returns_number(id: u64) -> u64 {
    id
}

fn main() {}
