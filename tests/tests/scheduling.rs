//! Scheduled jobs: `hold_at_least` keeps a tick's lock held after the body, so instances whose
//! clocks or schedules run a little late skip the tick instead of running it again.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use distlock_runtime::{distributed_lock, LockError, LockManager};
use distlock_tests::RedisServer;

#[distributed_lock("report", wait = 0, hold_at_least = "400ms", manager = locks)]
async fn report(locks: &LockManager) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test]
async fn the_attribute_keeps_the_key_held_until_hold_at_least_has_passed() {
    let server = RedisServer::start();
    let locks = server.manager();
    let started = Instant::now();
    report(&locks).await.unwrap();
    // The body is done, the key is still held, and a second run within the hold is refused.
    let info = locks.inspect("report").await.unwrap().expect("still held");
    assert!(
        info.remaining <= Duration::from_millis(400),
        "{:?}",
        info.remaining
    );
    let again = report(&locks).await.unwrap_err();
    assert!(matches!(again, LockError::NotAcquired { .. }), "{again:?}");
    let gone = distlock_tests::eventually(Duration::from_secs(2), || async {
        locks.inspect("report").await.unwrap().is_none()
    })
    .await;
    let freed = started.elapsed();
    assert!(gone.is_some());
    assert!(freed >= Duration::from_millis(390), "freed after {freed:?}");
    report(&locks).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_run_a_scheduled_job_exactly_once_per_tick() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let url = server.url();
    let ticks = 10;
    let mut children = Vec::new();
    for _ in 0..3 {
        children.push(
            tokio::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
                .args(["schedule", &url, "nightly", "10", "600", "450", "200"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start lock_worker"),
        );
    }
    let mut runs: BTreeMap<u64, usize> = BTreeMap::new();
    for child in children {
        let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("the instances end after their ticks")
            .unwrap();
        assert!(output.status.success(), "{output:?}");
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let tick: u64 = line.strip_prefix("ran ").unwrap().parse().unwrap();
            *runs.entry(tick).or_default() += 1;
        }
    }
    assert_eq!(runs.len(), ticks, "ticks that ran: {runs:?}");
    assert!(runs.values().all(|&n| n == 1), "runs per tick: {runs:?}");
}
