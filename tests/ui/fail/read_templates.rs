use distlock_runtime::{distributed_lock, LockError};

// `read` templates are checked like the keys held exclusively.
#[distributed_lock("doc:{id}", read = ["index:{idx}", "schema:{id}{version}", "open:{id"])]
async fn view(id: u64, version: u32) -> Result<(), LockError> {
    let _ = (id, version);
    Ok(())
}

#[distributed_lock(read = "")]
async fn empty(id: u64) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

struct Doc {
    id: u64,
}

#[distributed_lock(read = "doc:{doc.idd}")]
async fn field_typo(doc: &Doc) -> Result<(), LockError> {
    let _ = doc.id;
    Ok(())
}

fn main() {}
