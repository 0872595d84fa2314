//! The runtime renamed to `lock` in Cargo.toml, found through `crate = "lock"`.

/// Locks `job:{id}` through the renamed runtime.
///
/// # Errors
/// Any [`lock::LockError`] of the lock.
#[lock::distributed_lock("job:{id}", crate = "lock", wait = 0)]
pub async fn run_job(id: u32) -> Result<u32, lock::LockError> {
    Ok(id * 2)
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn the_renamed_runtime_is_called() {
        // No default manager is installed in this test binary: the expansion reached the
        // runtime, which answered NotConfigured without running the body.
        let outcome = super::run_job(21).await;
        assert!(
            matches!(outcome, Err(lock::LockError::NotConfigured)),
            "{outcome:?}"
        );
    }
}
