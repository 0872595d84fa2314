use distlock_runtime::{distributed_lock, LockError};

#[tracing::instrument]
#[distributed_lock("order:{order_id}")]
async fn instrument_above(order_id: u64) -> Result<u64, LockError> {
    tracing::info!("paying");
    Ok(order_id)
}

#[distributed_lock("order:{order_id}")]
#[tracing::instrument(skip(note))]
async fn instrument_below(order_id: u64, note: String) -> Result<u64, LockError> {
    let _ = note;
    Ok(order_id)
}

fn main() {
    let _ = instrument_above(1);
    let _ = instrument_below(1, String::new());
}
