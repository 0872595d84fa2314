//! With no default manager installed (this test binary never installs one), an annotated fn
//! without `manager = ...` returns `NotConfigured` and its body does not run.

use std::sync::atomic::{AtomicBool, Ordering};

use distlock_runtime::{distributed_lock, LockError};

static RAN: AtomicBool = AtomicBool::new(false);

#[distributed_lock("unconfigured:{id}")]
async fn unconfigured(id: u32) -> Result<u32, LockError> {
    RAN.store(true, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn no_default_manager_is_not_configured() {
    let outcome = unconfigured(1).await;
    assert!(
        matches!(outcome, Err(LockError::NotConfigured)),
        "{outcome:?}"
    );
    assert!(!RAN.load(Ordering::SeqCst), "the body ran without a lock");
    let message = outcome.unwrap_err().to_string();
    assert!(message.contains("set_default_manager"), "{message}");
}
