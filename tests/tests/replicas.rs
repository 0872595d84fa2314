//! `min_replicas`: an acquire counts only once replicas confirmed it; otherwise it is undone
//! and fails with `LockError::Replication`, leaving no lock behind.

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
