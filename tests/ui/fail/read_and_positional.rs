use distlock_runtime::{distributed_lock, LockError};

#[distributed_lock("doc:{id}", read = "doc:{id}")]
async fn edit(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(["doc:{id}", "index:{id}"], read = ["index:{id}", "schema:{id}"])]
async fn reindex(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

// Templates are compared as written: these render different keys.
#[distributed_lock("doc:{id}", read = "doc:{parent}")]
async fn copy(id: u64, parent: u64) -> Result<(), LockError> {
    let _ = (id, parent);
    Ok(())
}

fn main() {
    let _ = edit(1);
}
