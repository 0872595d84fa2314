//! Fencing tokens strictly increase per key, across clients and across expiry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_runtime::LockError;
use distlock_tests::RedisServer;
use redis::AsyncCommands;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_strictly_increase_over_1000_acquisitions_by_16_tasks() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shared = server.manager();
    let mut tasks = Vec::new();
    for task in 0..16 {
        // Half the tasks share a manager, half have their own: tokens order across clients too.
        let locks = if task % 2 == 0 {
            shared.clone()
        } else {
            server.manager()
        };
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..1000 / 16 + 1 {
                let lease = locks
                    .lock("fenced")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                seen.lock().unwrap().push(lease.fencing_token());
                lease.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert!(seen.len() >= 1000);
    for pair in seen.windows(2) {
        assert!(
            pair[1] > pair[0],
            "fencing token went from {} to {}",
            pair[0],
            pair[1]
        );
    }
}

#[tokio::test]
async fn a_token_drawn_after_an_expiry_is_greater() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let first = server.manager();
    let second = server.manager();
    let expired = first
        .lock("fenced")
        .ttl(Duration::from_millis(50))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(expired.is_lost());
    let next = second
        .try_lock("fenced")
        .acquire()
        .await
        .expect("expired lock is free");
    assert!(next.fencing_token() > expired.fencing_token());
    // A different key of the same prefix also moves forward.
    let other = second.lock("other").acquire().await.unwrap();
    assert!(other.fencing_token() > next.fencing_token());
}

/// Takes and releases `n` leases on `key`; returns the greatest fencing token drawn.
async fn draw_tokens(locks: &distlock_runtime::LockManager, key: &str, n: usize) -> u64 {
    let mut greatest = 0;
    for _ in 0..n {
        let lease = locks.lock(key).acquire().await.unwrap();
        assert!(lease.fencing_token() > greatest);
        greatest = lease.fencing_token();
        lease.release().await.unwrap();
    }
    greatest
}

#[tokio::test]
async fn tokens_keep_rising_after_redis_restarts_without_persistence() {
    let mut server = RedisServer::start();
    let locks = server.manager();
    let before = draw_tokens(&locks, "fenced", 20).await;
    // Everything Redis held is gone: locks, counters, queues.
    server.restart();
    let mut after = None;
    for _ in 0..20 {
        // The first call may find the manager's old connection dead.
        if let Ok(lease) = locks.try_lock("fenced").acquire().await {
            after = Some(lease.fencing_token());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = after.expect("a lock after the restart");
    assert!(
        after > before,
        "fencing token went from {before} before the restart to {after} after it"
    );
}

#[tokio::test]
async fn tokens_keep_rising_after_failover_to_a_replica_that_missed_writes() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let on_primary = primary.manager();
    draw_tokens(&on_primary, "fenced", 5).await;
    // Everything so far has reached the replica.
    assert!(primary.command(&["WAIT", "1", "2000"]).starts_with(":1"));
    // The replica is cut off and promoted; the primary goes on granting leases meanwhile, and
    // the replica never sees them.
    assert!(replica
        .command(&["REPLICAOF", "NO", "ONE"])
        .starts_with("+OK"));
    let last_on_primary = draw_tokens(&on_primary, "fenced", 5).await;
    // Clients fail over to the promoted replica (a moved DNS name or virtual IP, say).
    let on_replica = replica.manager();
    let first_on_replica = on_replica
        .try_lock("fenced")
        .acquire()
        .await
        .expect("the key is free on the promoted replica")
        .fencing_token();
    assert!(
        first_on_replica > last_on_primary,
        "fencing token went from {last_on_primary} on the old primary to {first_on_replica} \
         on the promoted replica"
    );
}

/// Every key in the server, with its PTTL.
async fn keys_with_pttl(server: &RedisServer) -> Vec<(String, i64)> {
    let mut conn = server.client().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut listed = Vec::new();
    for key in keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        listed.push((key, pttl));
    }
    listed
}

#[tokio::test]
async fn every_key_a_lock_writes_expires() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let ttl = Duration::from_millis(300);
    // A plain lease, a lease on several keys, and a fair queue with a waiter that gives up.
    let held = locks
        .lock("one")
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let both = locks
        .lock_all(["two", "three"])
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let queued = locks
        .lock("one")
        .fair(true)
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(
        matches!(queued, Err(LockError::Timeout { .. })),
        "{queued:?}"
    );
    let keys = keys_with_pttl(&server).await;
    assert!(!keys.is_empty());
    for (key, pttl) in &keys {
        // -2: gone between the listing and the PTTL (the waiter's queue entry, say).
        assert_ne!(*pttl, -1, "{key} has no expiry: {keys:?}");
    }
    both.release().await.unwrap();
    drop(held);
    // Nothing is left once the leases' ttl has passed.
    let empty = distlock_tests::eventually(Duration::from_secs(3), || async {
        keys_with_pttl(&server).await.is_empty()
    })
    .await;
    assert!(
        empty.is_some(),
        "keys left behind: {:?}",
        keys_with_pttl(&server).await
    );
}

#[tokio::test]
async fn a_counter_ahead_of_the_clock_keeps_tokens_rising() {
    // As after Redis's clock was set back: the counters hold tokens from its future.
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let ahead = (secs + 3600) * 1_000_000;
    for key in ["one", "both:a"] {
        let _: () = redis::cmd("SET")
            .arg(format!("distlock:fence:{{{key}}}"))
            .arg(ahead)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let first = locks.lock("one").acquire().await.unwrap();
    assert_eq!(first.fencing_token(), ahead + 1);
    first.release().await.unwrap();
    let second = locks.lock("one").acquire().await.unwrap();
    assert_eq!(second.fencing_token(), ahead + 2);
    // The counter outlives its lease until the clock has caught up with it.
    let pttl: i64 = redis::cmd("PTTL")
        .arg("distlock:fence:{one}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 3_600_000, "counter expires in {pttl} ms");
    second.release().await.unwrap();
    // Several keys: one token above every counter, and every counter raised to it.
    let both = locks
        .lock_all(["both:a", "both:b"])
        .acquire()
        .await
        .unwrap();
    assert_eq!(both.fencing_token(), ahead + 1);
    let b: u64 = redis::cmd("GET")
        .arg("distlock:fence:{both:b}")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(b, ahead + 1);
    both.release().await.unwrap();
}

#[tokio::test]
async fn a_counter_of_another_type_neither_fails_the_acquire_nor_the_hand_off() {
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    // Another program's list where a counter would be.
    let _: i64 = conn.lpush("distlock:fence:{odd}", "x").await.unwrap();
    let lease = locks.lock("odd").acquire().await.expect("acquire");
    assert!(lease.fencing_token() > 1_000_000_000_000_000);
    // A release that hands the lock to a fair waiter draws from the counter too.
    let _: i64 = conn.del("distlock:fence:{odd}").await.unwrap();
    let _: i64 = conn.lpush("distlock:fence:{odd}", "x").await.unwrap();
    let waiter = {
        let locks = server.manager();
        tokio::spawn(async move {
            locks
                .lock("odd")
                .fair(true)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    distlock_tests::until_queued(&conn, "odd", 1).await;
    let held = lease.fencing_token();
    lease.release().await.expect("release hands the lock over");
    let next = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("handed over")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > held);
    next.release().await.unwrap();
}
