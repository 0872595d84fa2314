//! `min_replicas`: an acquire counts only once replicas confirmed it; otherwise it is undone
//! and fails with `LockError::Replication`, leaving no lock behind, also when it waited; and
//! its waits end by their deadline like any other.

use std::time::{Duration, Instant};

use distlock_runtime::LockError;
use distlock_tests::RedisServer;

#[tokio::test]
async fn an_acquire_the_replicas_confirm_counts_and_reaches_them() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let locks = primary
        .manager_builder()
        .min_replicas(1)
        .replica_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let lease = locks
        .lock("r-ok")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // WAIT returned: the replica has the lock already, not eventually.
    assert_eq!(
        replica.command(&["EXISTS", "distlock:lock:{r-ok}"]),
        ":1\r\n"
    );
    lease.extend(Duration::from_secs(30)).await.unwrap();
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_paused_replica_fails_the_acquire_with_the_replica_error_and_leaves_no_lock() {
    let _load = distlock_tests::timed().await;
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    let replica_timeout = Duration::from_millis(300);
    let locks = primary
        .manager_builder()
        .min_replicas(1)
        .replica_timeout(replica_timeout)
        .build()
        .unwrap();
    distlock_tests::lock_once(&locks, "warm").await;
    let held = locks
        .lock("r-held")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    replica.pause();
    let started = Instant::now();
    let refused = locks
        .lock("r-paused")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            refused,
            LockError::Replication {
                acked: 0,
                needed: 1,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("replicas"), "{refused}");
    assert!(took < replica_timeout + Duration::from_secs(1), "{took:?}");
    // Undone before the error was returned.
    assert_eq!(
        primary.command(&["EXISTS", "distlock:lock:{r-paused}"]),
        ":0\r\n"
    );
    // A renewal the replica cannot confirm is not counted either.
    let extended = held.extend(Duration::from_secs(30)).await.unwrap_err();
    assert!(
        matches!(extended, LockError::Replication { .. }),
        "{extended:?}"
    );
    replica.resume();
    // Back: the same key is free and the replica confirms again.
    let lease = locks.lock("r-paused").acquire().await.unwrap();
    lease.release().await.unwrap();
    held.release().await.unwrap();
}

/// Waits until `primary` counts no connected replica (it saw the replica's connection close).
fn until_no_replica(primary: &RedisServer) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !primary
        .command(&["INFO", "replication"])
        .contains("connected_slaves:0")
    {
        assert!(
            Instant::now() < deadline,
            "the primary still counts its replica"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts that `outcome` is the error of an acquire the replicas did not confirm.
#[track_caller]
fn unconfirmed<T: std::fmt::Debug>(what: &str, outcome: Result<T, LockError>) {
    let error = outcome.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Replication {
                acked: 0,
                needed: 1,
                ..
            }
        ),
        "{what}: {error:?}"
    );
    assert!(error.is_unavailable() && !error.is_contention(), "{what}");
    assert!(error.to_string().contains("check the replicas"), "{error}");
}

/// While the replicas confirm nothing, no acquire can count, and one that fails says so
/// (`Replication`, an outage), never contention: not a wait that ran out on a key held
/// throughout, nor a try-lock that found it held, nor a wait that found it held and then free,
/// nor waits that ran out on a key held only by the other waiters' own attempts, each holding
/// it while its replicas were waited for (the acquires under way in a cluster whose promoted
/// primary has no replica yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_the_replicas_cannot_confirm_fails_with_replication_never_contention() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    let locks = primary
        .manager_builder()
        .min_replicas(1)
        .replica_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    distlock_tests::lock_once(&locks, "warm").await;
    let holder = locks
        .lock("r-held")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    replica.kill();
    until_no_replica(&primary);
    let wait = Duration::from_secs(1);
    unconfirmed(
        "held throughout the wait",
        locks.lock("r-held").wait(wait).acquire().await,
    );
    unconfirmed("a try-lock", locks.try_lock("r-held").acquire().await);
    let waiter = distlock_tests::spawn_unfair_waiter(&locks, "r-held", Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(500)).await;
    holder.release().await.unwrap();
    unconfirmed("held, then released", waiter.await.unwrap().1);
    let contenders = (0..8).map(|_| locks.lock("r-busy").wait(wait).acquire());
    for (i, outcome) in futures_util::future::join_all(contenders)
        .await
        .into_iter()
        .enumerate()
    {
        unconfirmed(&format!("contender {i}"), outcome);
    }
    assert_eq!(
        primary.command(&["EXISTS", "distlock:lock:{r-busy}"]),
        ":0\r\n"
    );
}

/// With `min_replicas`, a wait ends by its deadline plus one response timeout, as every wait
/// does, even with a replica timeout longer than the wait: the `WAIT` of an attempt does not
/// run past it, on a key held throughout nor among contenders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_with_min_replicas_ends_by_its_deadline_plus_one_response_timeout() {
    let _load = distlock_tests::timed().await;
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    let (response_timeout, wait) = (Duration::from_millis(500), Duration::from_millis(1500));
    let locks = primary
        .manager_builder()
        .response_timeout(response_timeout)
        .min_replicas(1)
        .replica_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    distlock_tests::lock_once(&locks, "warm").await;
    let _holder = locks
        .lock("r-held")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    replica.pause();
    let bound = wait + response_timeout;
    let timed = |key: &'static str| {
        let locks = locks.clone();
        async move {
            let started = Instant::now();
            let outcome = locks.lock(key).wait(wait).acquire().await;
            (outcome.map(drop), started.elapsed())
        }
    };
    let (outcome, took) = timed("r-held").await;
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(took <= bound, "held throughout: ended after {took:?}");
    let contenders = futures_util::future::join_all((0..8).map(|_| timed("r-busy"))).await;
    for (i, (outcome, took)) in contenders.into_iter().enumerate() {
        assert!(outcome.is_err(), "{outcome:?}");
        assert!(took <= bound, "contender {i}: ended after {took:?}");
    }
    replica.resume();
}

#[tokio::test]
async fn min_replicas_is_refused_on_a_quorum() {
    let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let refused = distlock_runtime::LockManager::builder()
        .quorum(nodes.iter().map(RedisServer::url))
        .min_replicas(1)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            refused,
            LockError::InvalidConfig {
                what: "min_replicas",
                ..
            }
        ),
        "{refused:?}"
    );
}

#[tokio::test]
async fn fair_requests_are_refused_with_min_replicas() {
    let primary = RedisServer::start();
    let locks = primary.manager_builder().min_replicas(1).build().unwrap();
    let refused = locks.lock("r-fair").fair(true).acquire().await.unwrap_err();
    assert!(
        matches!(refused, LockError::InvalidConfig { what: "fair", .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("min_replicas"), "{refused}");
    let built = primary
        .manager_builder()
        .min_replicas(1)
        .default_fair(true)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            built,
            LockError::InvalidConfig {
                what: "default_fair",
                ..
            }
        ),
        "{built:?}"
    );
}

/// The connections kept for replicated writes die with their server: after a restart, the
/// next acquires are not failed by them (each is sent again on a fresh connection, and a dead
/// main connection takes the kept ones with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_replicated_connections_do_not_fail_calls_after_a_restart() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let locks = primary
        .manager_builder()
        .min_replicas(1)
        .replica_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // Eight writes at once: eight connections kept.
    let keys: Vec<String> = (0..8).map(|i| format!("spare-{i}")).collect();
    let cycles = keys
        .iter()
        .map(|key| distlock_tests::lock_once(&locks, key));
    futures_util::future::join_all(cycles).await;
    primary.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !replica
        .command(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(Instant::now() < deadline, "the replica did not sync again");
        std::thread::sleep(Duration::from_millis(20));
    }
    for i in 0..12 {
        let lease = locks
            .lock(format!("after-{i}"))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("acquire {i} after the restart: {e}"));
        lease.release().await.unwrap();
    }
}
