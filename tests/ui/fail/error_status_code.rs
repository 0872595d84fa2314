use distlock_runtime::distributed_lock;

// Stands in for axum's `StatusCode`, which has no `From<LockError>` either.
#[derive(Debug)]
struct StatusCode(u16);

#[distributed_lock("order:{id}")]
async fn handler(id: u64) -> Result<String, StatusCode> {
    if id == 0 {
        return Err(StatusCode(404));
    }
    Ok(id.to_string())
}

fn main() {}
