use distlock_runtime::distributed_lock;

#[distributed_lock("order:{id}")]
async fn pay(id: u64) -> Result<u64, String> {
    if id == 0 {
        return Err("no such order".to_owned());
    }
    Ok(id)
}

fn main() {}
