use distlock_runtime::distributed_lock;

#[derive(Debug)]
struct MyError;

#[distributed_lock("order:{id}")]
async fn pay(id: u64) -> Result<u64, MyError> {
    Ok(id)
}

fn main() {}
