//! Default managers scoped to a future (`with_default_manager`) beside the process-wide one
//! (`set_default_manager`): tests in one process, each against its own server, never share a
//! default. Only `a_scoped_default_beats_the_process_wide_one` installs a process-wide default;
//! the other tests use scoped ones alone, which take precedence over it.

use std::sync::Arc;
use std::time::Duration;

use distlock_runtime::{
    default_manager, distributed_lock, set_default_manager, with_default_manager, LockError,
    LockManager,
};
use distlock_tests::RedisServer;
use tokio::sync::Barrier;

/// Holds `seat:{seat}` on the default manager; inside, meets the other callers and the test at
/// `meet` twice (all inside at once, then the test has looked) and returns the lease's token.
#[distributed_lock("seat:{seat}", wait = 0, lease = lease)]
async fn book(seat: u32, meet: Arc<Barrier>) -> Result<u64, LockError> {
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), meet.wait())
            .await
            .expect("the others never met this body");
    }
    Ok(lease.fencing_token())
}

/// The fencing token of `key` on `locks`' server, if held.
async fn token_on(locks: &LockManager, key: &str) -> Option<u64> {
    let info = locks.inspect(key).await.expect("inspect");
    info.map(|info| info.fencing_token)
}

/// Two futures running at once in one process, as two parallel tests would, each with its own
/// default manager on its own server: both hold `seat:1` at the same time (with `wait = 0`),
/// which a shared default would refuse to one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_futures_each_use_their_own_default_manager() {
    let _load = distlock_tests::timed().await;
    let (first, second) = (RedisServer::start(), RedisServer::start());
    let meet = Arc::new(Barrier::new(3));
    let run = |server: &RedisServer| {
        let (locks, meet) = (server.manager(), Arc::clone(&meet));
        tokio::spawn(with_default_manager(locks, book(1, meet)))
    };
    let (a, b) = (run(&first), run(&second));
    // Both bodies are inside now: each server holds seat:1 under its own lease's token.
    tokio::time::timeout(Duration::from_secs(10), meet.wait())
        .await
        .expect("both calls should be inside their bodies at once");
    let held_first = token_on(&first.manager(), "seat:1").await;
    let held_second = token_on(&second.manager(), "seat:1").await;
    tokio::time::timeout(Duration::from_secs(10), meet.wait())
        .await
        .expect("a call left its body before the test had looked");
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    assert_eq!(
        held_first,
        Some(a),
        "the first call locked on the first server"
    );
    assert_eq!(
        held_second,
        Some(b),
        "the second call locked on the second server"
    );
}

/// Takes `seat:{seat}` on the default manager and keeps it held for a minute after the body,
/// so the test can ask each server which one holds it.
#[distributed_lock("seat:{seat}", wait = 0, hold_at_least = "60s")]
async fn take(seat: u32) -> Result<(), LockError> {
    let _ = seat;
    Ok(())
}

/// Which of `servers` (by index) hold `seat:{seat}`.
async fn holders(servers: &[&RedisServer], seat: u32) -> Vec<usize> {
    let mut found = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        if token_on(&server.manager(), &format!("seat:{seat}"))
            .await
            .is_some()
        {
            found.push(i);
        }
    }
    found
}

#[tokio::test]
async fn a_scoped_default_beats_the_process_wide_one() {
    let _load = distlock_tests::timed().await;
    let (global, scoped, inner) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    set_default_manager(global.manager());
    take(1).await.unwrap();

    let (scoped_manager, inner_manager) = (scoped.manager(), inner.manager());
    with_default_manager(scoped_manager, async {
        take(2).await.unwrap();
        with_default_manager(inner_manager, take(3)).await.unwrap();
        // A spawned task is a task of its own: it does not inherit the scope.
        tokio::spawn(take(4)).await.unwrap().unwrap();
        take(5).await.unwrap();
    })
    .await;
    take(6).await.unwrap();
    // `default_manager()` answers the same way, for locks taken by hand beside annotated fns.
    let by_hand = with_default_manager(scoped.manager(), async { default_manager() })
        .await
        .unwrap();
    let lease = by_hand.lock("seat:7").acquire().await.unwrap();

    let servers = [&global, &scoped, &inner];
    let expected = [
        (1, 0, "the process-wide default"),
        (2, 1, "inside the scope: its manager"),
        (3, 2, "an inner scope wins"),
        (
            4,
            0,
            "a spawned task falls back to the process-wide default",
        ),
        (5, 1, "the inner scope ended with its future"),
        (6, 0, "after the scope, the process-wide one"),
        (7, 1, "default_manager() inside a scope"),
    ];
    for (seat, server, what) in expected {
        assert_eq!(
            holders(&servers, seat).await,
            [server],
            "seat:{seat}: {what}"
        );
    }
    lease.release().await.unwrap();
}
