//! Try-lock, waiting, multi-key requests and re-entrancy.

use std::time::{Duration, Instant};

use distlock_runtime::{current_fencing_token, current_lease, LockError};
use distlock_tests::{exists, warm_up, RedisServer};

#[tokio::test]
async fn acquire_when_free_and_try_lock_when_held_each_take_one_round_trip() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    // Warm up: connection set-up and script loading are not part of a lock cycle.
    warm_up(&locks).await;

    let before = server.requests();
    let lease = locks.lock("one-trip").acquire().await.unwrap();
    assert_eq!(server.requests() - before, 1, "acquire of a free lock");

    let other = server.manager();
    warm_up(&other).await;
    let before = server.requests();
    let started = Instant::now();
    let held = other.try_lock("one-trip").acquire().await;
    assert!(
        matches!(held, Err(LockError::NotAcquired { ref key }) if key == "one-trip"),
        "{held:?}"
    );
    assert_eq!(server.requests() - before, 1, "try-lock on a held lock");
    assert!(started.elapsed() < Duration::from_millis(100));

    let before = server.requests();
    lease.release().await.unwrap();
    assert_eq!(server.requests() - before, 1, "release");

    // So does a plain (not fair) acquire, of one key or several (the all-or-nothing script,
    // loaded first).
    lock_plain(&locks, &["plain"])
        .await
        .release()
        .await
        .unwrap();
    for keys in [&["plain"][..], &["several-a", "several-b"]] {
        let before = server.requests();
        let lease = lock_plain(&locks, keys).await;
        assert_eq!(server.requests() - before, 1, "plain acquire of {keys:?}");
        lease.release().await.unwrap();
    }
}

/// A plain (not fair) lease on `keys`.
async fn lock_plain(
    locks: &distlock_runtime::LockManager,
    keys: &[&str],
) -> distlock_runtime::Lease {
    locks
        .lock_all(keys.iter().copied())
        .fair(false)
        .acquire()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_waiter_times_out_at_its_deadline() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let _held = locks.lock("busy").acquire().await.unwrap();
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let outcome = locks.lock("busy").wait(wait).acquire().await;
    let took = started.elapsed();
    match outcome {
        Err(LockError::Timeout { key, waited }) => {
            assert_eq!(key, "busy");
            assert!(waited >= wait, "{waited:?}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(
        took >= wait && took <= wait + Duration::from_millis(250),
        "timed out after {took:?}"
    );
}

#[tokio::test]
async fn a_waiter_gets_the_lock_soon_after_release() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let lease = locks.lock("handoff").acquire().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let lease = locks
                .lock("handoff")
                .wait(Duration::from_secs(5))
                .acquire()
                .await;
            (Instant::now(), lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    lease.release().await.unwrap();
    let (acquired_at, lease) = waiter.await.unwrap();
    lease.expect("waiter acquired").release().await.unwrap();
    // Woken by the release (the holder's ttl is 30 s), not by its expiry.
    assert!(
        acquired_at - released_at <= Duration::from_millis(500),
        "{:?}",
        acquired_at - released_at
    );
}

#[tokio::test]
async fn a_multi_key_request_is_all_or_nothing() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let held = locks.lock("b").acquire().await.unwrap();

    let outcome = locks
        .lock_all(["c", "a", "b"])
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(outcome, Err(LockError::NotAcquired { ref key }) if key == "b"),
        "{outcome:?}"
    );
    assert!(
        !exists(&mut conn, &locks.redis_key("a")).await,
        "a must not be set"
    );
    assert!(
        !exists(&mut conn, &locks.redis_key("c")).await,
        "c must not be set"
    );

    held.release().await.unwrap();
    let all = locks
        .lock_all(["c", "a", "b", "a"])
        .acquire()
        .await
        .unwrap();
    assert_eq!(all.keys(), ["a", "b", "c"]);
    for key in ["a", "b", "c"] {
        assert!(exists(&mut conn, &locks.redis_key(key)).await);
    }
    all.release().await.unwrap();
    for key in ["a", "b", "c"] {
        assert!(!exists(&mut conn, &locks.redis_key(key)).await);
    }
}

#[tokio::test]
async fn a_nested_run_on_the_same_key_and_task_completes_at_once() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let inner_locks = locks.clone();
    let server_ref = &server;
    locks
        .lock("nested")
        .run(async move {
            let outer = current_lease().expect("inside a run");
            let before = server_ref.requests();
            let started = Instant::now();
            let inner = inner_locks
                .try_lock("nested")
                .run(async { current_lease().expect("inside the inner run") })
                .await
                .expect("re-entrant run");
            assert!(started.elapsed() < Duration::from_millis(200));
            assert_eq!(
                server_ref.requests(),
                before,
                "no Redis call for a held key"
            );
            assert_eq!(inner, outer, "the inner body runs under the outer lease");
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_partly_overlapping_nested_run_acquires_only_the_missing_keys() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let inner_locks = locks.clone();
    let mut conn = server.client().await;
    let key_y = locks.redis_key("y");
    locks
        .lock("x")
        .run(async move {
            let outer_token = current_fencing_token("x").unwrap();
            let (inner_keys, inner_token, x_token) = inner_locks
                .lock_all(["x", "y"])
                .run(async {
                    let lease = current_lease().unwrap();
                    (
                        lease.keys().to_vec(),
                        lease.fencing_token(),
                        current_fencing_token("x"),
                    )
                })
                .await
                .unwrap();
            assert_eq!(inner_keys, ["y"]);
            assert!(inner_token > outer_token);
            assert_eq!(x_token, Some(outer_token));
            assert!(
                !exists(&mut conn, &key_y).await,
                "y released by the inner run"
            );
        })
        .await
        .unwrap();
    assert_eq!(current_lease(), None);
}

#[tokio::test]
async fn only_an_acquire_that_waited_is_logged_with_its_attempts() {
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let holder = server.manager();
    let held = holder
        .lock("logged")
        .ttl(Duration::from_millis(200))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    assert_eq!(logs.count("acquired after waiting"), 0, "{}", logs.text());
    // Another manager's request finds the key held, and takes it once it expired.
    let waiter = server.manager();
    let lease = waiter
        .lock("logged")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        logs.count("distlock acquired after waiting"),
        1,
        "{}",
        logs.text()
    );
    lease.release().await.unwrap();
    drop(held);
}
