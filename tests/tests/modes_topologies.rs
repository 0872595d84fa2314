//! Read-write locks and semaphores on every topology: a cluster (shared and exclusive keys in
//! different slots in one request), Sentinel, a quorum (a majority for each mode) and
//! `min_replicas`.

use std::time::Duration;

use distlock_runtime::{LockError, LockManager, LockMode};
use distlock_tests::topology::{RedisCluster, SentinelGroup};
use distlock_tests::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(500);
const LONG: Duration = Duration::from_secs(30);

/// Whether `server` holds a live member of `key`'s holders.
fn members(server: &RedisServer, key: &str) -> usize {
    let reply = server.command(&["ZCARD", &format!("distlock:holders:{{{key}}}")]);
    reply.trim().trim_start_matches(':').parse().unwrap_or(0)
}

/// The modes every topology must serve alike: readers share, a writer is kept out until they
/// leave, a semaphore admits `permits`, and tokens rise.
async fn every_mode_works(a: &LockManager, b: &LockManager, permits: u32) {
    let first = a.read_lock("m-doc").ttl(LONG).acquire().await.unwrap();
    let second = b
        .read_lock("m-doc")
        .ttl(LONG)
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("readers share");
    assert!(second.fencing_token() > first.fencing_token());
    let writer = b.lock("m-doc").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(writer, Err(LockError::NotAcquired { .. })),
        "{writer:?}"
    );
    let info = a.inspect("m-doc").await.unwrap().unwrap();
    assert_eq!((info.mode, info.holders), (LockMode::Shared, 2));
    first.extend(Duration::from_secs(60)).await.unwrap();
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = b.lock("m-doc").wait(LONG).acquire().await.unwrap();
    let reader = a.read_lock("m-doc").wait(Duration::ZERO).acquire().await;
    assert!(reader.is_err(), "{reader:?}");
    writer.release().await.unwrap();

    let mut held = Vec::new();
    for _ in 0..permits {
        held.push(a.lock("m-pool").permits(permits).acquire().await.unwrap());
    }
    let over = b
        .lock("m-pool")
        .permits(permits)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(over, Err(LockError::NotAcquired { .. })),
        "{over:?}"
    );
    // A waiter for a permit is woken by the release (the leases run 30 s).
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("m-pool").permits(permits).wait(LONG).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = tokio::time::Instant::now();
    let last = held.last().map(|l| l.fencing_token()).unwrap();
    held.remove(0).release().await.unwrap();
    let woken = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    assert!(woken.fencing_token() > last);
    held.push(woken);
    for lease in held {
        lease.release().await.unwrap();
    }
    assert!(a.inspect("m-pool").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_takes_shared_and_exclusive_keys_in_different_slots_together_or_not_at_all() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    let manager = || {
        LockManager::builder()
            .cluster(cluster.seed_urls())
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .pool_wait_timeout(TIMEOUT)
            .build()
            .unwrap()
    };
    let (a, b) = (manager(), manager());
    let slots: std::collections::HashSet<u16> = ["alpha", "bravo", "charlie"]
        .iter()
        .map(|k| cluster.slot_of(&format!("distlock:lock:{{{k}}}")))
        .collect();
    assert_eq!(slots.len(), 3);
    let nodes = |key: &str| cluster.primary_of(&format!("distlock:holders:{{{key}}}"));

    // `charlie` written by another owner: none of the three is taken.
    let blocker = b.lock("charlie").acquire().await.unwrap();
    let refused = a
        .lock("alpha")
        .read_keys(["bravo", "charlie"])
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(refused, Err(LockError::NotAcquired { ref key }) if key == "charlie"),
        "{refused:?}"
    );
    assert!(a.inspect("alpha").await.unwrap().is_none());
    assert_eq!(members(cluster.node(nodes("bravo")), "bravo"), 0);
    blocker.release().await.unwrap();

    // `charlie` read by another owner: all three are taken, each in its mode, one token.
    let reader = b.read_lock("charlie").acquire().await.unwrap();
    let lease = a
        .lock("alpha")
        .read_keys(["bravo", "charlie"])
        .acquire()
        .await
        .unwrap();
    assert!(lease.fencing_token() > reader.fencing_token());
    assert_eq!(
        a.inspect("alpha").await.unwrap().unwrap().mode,
        LockMode::Exclusive
    );
    assert_eq!(members(cluster.node(nodes("bravo")), "bravo"), 1);
    assert_eq!(members(cluster.node(nodes("charlie")), "charlie"), 2);
    let held = a.held_locks("*").await.unwrap();
    let listed: Vec<(&str, LockMode, usize)> = held
        .iter()
        .map(|i| (i.key.as_str(), i.mode, i.holders))
        .collect();
    assert_eq!(
        listed,
        [
            ("alpha", LockMode::Exclusive, 1),
            ("bravo", LockMode::Shared, 1),
            ("charlie", LockMode::Shared, 2)
        ]
    );
    lease.extend(Duration::from_secs(60)).await.unwrap();
    lease.release().await.unwrap();
    reader.release().await.unwrap();
    assert!(a.held_locks("*").await.unwrap().is_empty());

    // A fair reader is handed the key by a writer's release, over sharded pub/sub.
    let writer = b.lock("delta").acquire().await.unwrap();
    let waiting = {
        let a = a.clone();
        tokio::spawn(async move { a.read_lock("delta").wait(LONG).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer.release().await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("handed over at the release")
        .unwrap()
        .unwrap();
    read.release().await.unwrap();
    assert!(a.stats().handed_over >= 1);

    every_mode_works(&a, &b, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_serves_every_mode() {
    let _load = distlock_tests::heavy().await;
    let group = SentinelGroup::start(1, 3);
    let manager = || {
        LockManager::builder()
            .sentinel(group.master_name(), group.sentinel_urls())
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .pool_wait_timeout(TIMEOUT)
            .build()
            .unwrap()
    };
    every_mode_works(&manager(), &manager(), 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_needs_a_majority_for_each_mode() {
    let _load = distlock_tests::heavy().await;
    let mut servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let manager = |servers: &[RedisServer]| {
        LockManager::builder()
            .quorum(servers.iter().map(RedisServer::url))
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .pool_wait_timeout(TIMEOUT)
            .build()
            .unwrap()
    };
    let (a, b) = (manager(&servers), manager(&servers));
    // A semaphore of several permits too: its holders sit in slots.
    every_mode_works(&a, &b, 3).await;

    // Two of five down: readers still share on the three left, a writer is still kept out.
    servers[1].kill();
    servers[4].kill();
    let first = a.read_lock("q-doc").acquire().await.unwrap();
    let second = b.read_lock("q-doc").acquire().await.unwrap();
    let alive: Vec<&RedisServer> = servers.iter().filter(|s| s.pid().is_some()).collect();
    assert!(alive.iter().all(|s| members(s, "q-doc") == 2));
    let writer = b.lock("q-doc").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(writer, Err(LockError::NotAcquired { .. })),
        "{writer:?}"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = b.lock("q-doc").acquire().await.unwrap();
    // With the writer's lock deleted by hand on one node, a reader gets that node only: no
    // majority, so it is refused, and that node's grant is undone.
    alive[0].command(&["DEL", "distlock:lock:{q-doc}"]);
    let reader = a.read_lock("q-doc").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(reader, Err(LockError::NotAcquired { .. })),
        "{reader:?}"
    );
    assert!(
        alive.iter().all(|s| members(s, "q-doc") == 0),
        "refused reads undone"
    );
    writer.release().await.unwrap();
    // A semaphore of one permit on the three nodes left: one holder at a time.
    let permit = a.lock("q-pool").permits(1).acquire().await.unwrap();
    let second = b
        .lock("q-pool")
        .permits(1)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(second.is_err(), "{second:?}");
    permit.release().await.unwrap();
    // And of two: two holders, each in a slot of its own on the three nodes, a third refused;
    // inspect lists both, renewal keeps them, a release frees a slot.
    let first = a.lock("q-pair").permits(2).acquire().await.unwrap();
    let second = b.lock("q-pair").permits(2).acquire().await.unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    assert!(alive.iter().all(|s| members(s, "q-pair") == 2));
    let third = a
        .lock("q-pair")
        .permits(2)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(third, Err(LockError::NotAcquired { .. })),
        "{third:?}"
    );
    let info = a.inspect("q-pair").await.unwrap().unwrap();
    assert_eq!((info.mode, info.holders), (LockMode::Permits(2), 2));
    first.extend(Duration::from_secs(60)).await.unwrap();
    first.release().await.unwrap();
    assert!(alive.iter().all(|s| members(s, "q-pair") == 1));
    let third = a
        .lock("q-pair")
        .permits(2)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    let third = third.expect("a released slot is free again");
    third.release().await.unwrap();
    second.release().await.unwrap();
    // Three of five down: no majority for any mode.
    servers[2].kill();
    let c = manager(&servers);
    let reader = c.read_lock("q-doc").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(reader, Err(LockError::NoQuorum { .. })),
        "{reader:?}"
    );
}

#[tokio::test]
async fn min_replicas_confirms_shared_and_permit_leases() {
    let _load = distlock_tests::timed().await;
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let locks = primary
        .manager_builder()
        .min_replicas(1)
        .replica_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let reader = locks.read_lock("r-doc").ttl(LONG).acquire().await.unwrap();
    // WAIT returned: the replica has the member already, not eventually.
    assert_eq!(members(&replica, "r-doc"), 1);
    let permit = locks
        .lock("r-pool")
        .permits(3)
        .ttl(LONG)
        .acquire()
        .await
        .unwrap();
    assert_eq!(members(&replica, "r-pool"), 1);
    reader.extend(Duration::from_secs(60)).await.unwrap();
    permit.extend(Duration::from_secs(60)).await.unwrap();
    reader.release().await.unwrap();
    permit.release().await.unwrap();
    // A paused replica fails a shared acquire with the replica error, and leaves no member.
    let mut replica = replica;
    replica.pause();
    let refused = locks.read_lock("r-doc").ttl(LONG).acquire().await;
    replica.resume();
    assert!(
        matches!(refused, Err(LockError::Replication { .. })),
        "{refused:?}"
    );
    assert_eq!(members(&primary, "r-doc"), 0);
}
