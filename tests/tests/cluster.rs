//! A Redis Cluster: locks in many slots, all or nothing, with fencing tokens that rise across
//! slots; waiters woken by sharded pub/sub; scripts lost and a primary killed or paused.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager};
use distlock_tests::topology::RedisCluster;
use distlock_tests::{Occupancy, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(500);

fn manager(cluster: &RedisCluster) -> LockManager {
    builder(cluster).build().unwrap()
}

fn builder(cluster: &RedisCluster) -> distlock_runtime::LockManagerBuilder {
    LockManager::builder()
        .cluster(cluster.seed_urls())
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .pool_wait_timeout(TIMEOUT)
}

/// Whether the node serving `key`'s lock holds it.
fn held(cluster: &RedisCluster, key: &str) -> bool {
    let name = format!("distlock:lock:{{{key}}}");
    let node = cluster.primary_of(&name);
    cluster.node(node).command(&["EXISTS", &name]) == ":1\r\n"
}

/// Whether a client is subscribed to the shard channel `channel` on node `node`.
fn shard_subscribed(cluster: &RedisCluster, node: usize, channel: &str) -> bool {
    cluster
        .node(node)
        .command(&["PUBSUB", "SHARDNUMSUB", channel])
        .contains(":1\r\n")
}

/// Keys whose locks land in different slots (and so, with three primaries, mostly on
/// different nodes).
const KEYS: [&str; 6] = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_many_slots_lock_all_or_nothing_with_tokens_above_every_slot() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    let slots: std::collections::HashSet<u16> = KEYS
        .iter()
        .map(|k| cluster.slot_of(&format!("distlock:lock:{{{k}}}")))
        .collect();
    assert_eq!(slots.len(), KEYS.len(), "the test keys share slots");
    let locks = [manager(&cluster), manager(&cluster)];

    // Taken everywhere at once, as one lease with one token.
    let lease = locks[0].lock_all(KEYS).acquire().await.unwrap();
    assert!(KEYS.iter().all(|k| held(&cluster, k)));
    let token = lease.fencing_token();
    // Extended everywhere: every slot's key now expires a minute from now (it was taken for the
    // default 30 s, so an extension that missed a slot shows).
    lease.extend(Duration::from_secs(60)).await.unwrap();
    for key in KEYS {
        let name = format!("distlock:lock:{{{key}}}");
        let pttl = cluster
            .node(cluster.primary_of(&name))
            .command(&["PTTL", &name]);
        let pttl: i64 = pttl.trim().trim_start_matches(':').parse().unwrap();
        assert!(pttl > 59_000, "{key}: PTTL {pttl} after extending to 60 s");
    }

    lease.release().await.unwrap();
    assert!(KEYS.iter().all(|k| !held(&cluster, k)));
    // All or nothing: one key held elsewhere leaves none of the others taken.
    let blocker = locks[1].lock("delta").acquire().await.unwrap();
    let refused = locks[0]
        .lock_all(KEYS)
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, LockError::NotAcquired { key } if key == "delta"),
        "{refused:?}"
    );
    assert!(KEYS
        .iter()
        .filter(|k| **k != "delta")
        .all(|k| !held(&cluster, k)));
    blocker.release().await.unwrap();

    // Every key's next lease draws above the multi-slot lease's token, whichever slot's
    // counter that token came from.
    for key in KEYS {
        let single = locks[1].lock(key).acquire().await.unwrap();
        assert!(
            single.fencing_token() > token,
            "{key}: {} <= {token}",
            single.fencing_token()
        );
        single.release().await.unwrap();
    }

    // A slot's counter far ahead (a node whose clock runs ahead) sets the lease's token, and
    // is written back to the others.
    let ahead = token + 1_000_000_000;
    let fence = "distlock:fence:{alpha}";
    let node = cluster.primary_of(fence);
    cluster
        .node(node)
        .command(&["SET", fence, &ahead.to_string(), "PX", "600000"]);
    let lease = locks[0].lock_all(KEYS).acquire().await.unwrap();
    assert!(lease.fencing_token() > ahead);
    let multi = lease.fencing_token();
    lease.release().await.unwrap();
    let single = locks[1].lock("foxtrot").acquire().await.unwrap();
    assert!(
        single.fencing_token() > multi,
        "{} <= {multi}",
        single.fencing_token()
    );
    single.release().await.unwrap();

    // A template that chooses a slot puts two keys in one script call.
    let wallet = "{user:7}:wallet";
    let cart = "{user:7}:cart";
    assert_eq!(
        cluster.slot_of(&format!("distlock:lock:{{{wallet}}}")),
        cluster.slot_of(&format!("distlock:lock:{{{cart}}}"))
    );
    let before = locks[0].stats().acquire_requests;
    let lease = locks[0].lock_all([wallet, cart]).acquire().await.unwrap();
    assert_eq!(locks[0].stats().acquire_requests - before, 1);
    lease.release().await.unwrap();

    // Waiters are woken by the release (sharded pub/sub), not by the holder's 30 s expiry, and
    // two managers never hold a key at once.
    let occupancy = Arc::new(Occupancy::default());
    let mut tasks = Vec::new();
    for i in 0..6 {
        let locks = locks[i % 2].clone();
        let occupancy = Arc::clone(&occupancy);
        tasks.push(tokio::spawn(async move {
            for round in 0..10 {
                let keys = [KEYS[(i + round) % 6], KEYS[(i + round + 1) % 6]];
                let lease = locks
                    .lock_all(keys)
                    .ttl(Duration::from_secs(30))
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                let inside = occupancy.enter(&keys);
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(inside);
                lease.release().await.unwrap();
            }
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(occupancy.overlaps(), 0);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_waiter_is_woken_by_a_sharded_release_notification() {
    let cluster = RedisCluster::start(3, 0);
    let locks = [manager(&cluster), manager(&cluster)];
    let held = locks[0]
        .lock("woken")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiting = distlock_tests::spawn_waiter(&locks[1], "woken", Duration::from_secs(20));
    let channel = "distlock:lock:{woken}";
    let node = cluster.primary_of(channel);
    let subscribed = distlock_tests::eventually(Duration::from_secs(5), || async {
        shard_subscribed(&cluster, node, channel)
    })
    .await;
    assert!(
        subscribed.is_some(),
        "the waiter subscribed to its key's shard channel"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = waiting.await.unwrap();
    let lease = lease.unwrap();
    assert!(
        acquired - released < Duration::from_secs(1),
        "{:?}",
        acquired - released
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn scripts_flushed_from_every_node_are_sent_again() {
    let cluster = RedisCluster::start(3, 0);
    let locks = manager(&cluster);
    for key in KEYS {
        distlock_tests::lock_once(&locks, key).await;
    }
    for i in 0..cluster.node_count() {
        cluster.node(i).command(&["SCRIPT", "FLUSH"]);
    }
    let lease = locks.lock_all(KEYS).acquire().await.unwrap();
    lease.extend(Duration::from_secs(10)).await.unwrap();
    // The operator's view spans every primary.
    let held: Vec<String> = locks
        .held_locks("*")
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.key)
        .collect();
    assert_eq!(held, KEYS);
    let info = locks.inspect("delta").await.unwrap().unwrap();
    assert_eq!(info.fencing_token, lease.fencing_token());
    assert!(locks.force_release("delta").await.unwrap());
    assert!(locks.inspect("delta").await.unwrap().is_none());
    let lost = lease.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(lost, LockError::LeaseLost { .. }), "{lost:?}");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_paused_primary_is_an_error_within_the_timeouts() {
    let _load = distlock_tests::timed().await;
    let mut cluster = RedisCluster::start(3, 0);
    let locks = manager(&cluster);
    for key in KEYS {
        distlock_tests::lock_once(&locks, key).await;
    }
    let paused = cluster.pause_primary_of("distlock:lock:{bravo}");
    let started = Instant::now();
    let outcome = locks
        .lock("bravo")
        .wait(Duration::from_secs(10))
        .acquire()
        .await;
    let took = started.elapsed();
    let error = outcome.unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
    assert!(took < TIMEOUT * 3, "{took:?}");
    // Other slots still work meanwhile.
    let other = KEYS
        .iter()
        .find(|k| cluster.primary_of(&format!("distlock:lock:{{{k}}}")) != paused)
        .unwrap();
    distlock_tests::lock_once(&locks, other).await;
    cluster.resume(paused);
}

/// The first call that meets `MOVED` after a slot migrated corrects the manager's slot map:
/// twenty lock cycles on a key of that slot cost its old primary one `MOVED` at most, not one
/// (or more) a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_away_is_learned_from_the_first_moved_not_redirected_on_every_call() {
    let _load = distlock_tests::timed().await;
    let cluster = RedisCluster::start(3, 0);
    let locks = manager(&cluster);
    // The manager learns the map, with the key's slot at its first primary.
    distlock_tests::lock_once(&locks, "moving").await;
    let slot = cluster.slot_of(&locks.redis_key("moving"));
    let from = cluster.primary_of_slot(slot);
    let to = (from + 1) % cluster.node_count();
    cluster.migrate_slot(slot, to);
    assert_eq!(cluster.primary_of_slot(slot), to);
    let before = cluster.node(from).errors_replied("MOVED");
    for _ in 0..20 {
        distlock_tests::lock_once(&locks, "moving").await;
    }
    let moved = cluster.node(from).errors_replied("MOVED") - before;
    println!("MOVED answered by the old primary to 20 lock cycles: {moved}");
    assert!(
        moved <= 1,
        "the old primary (node {from}) answered MOVED {moved} times to 20 lock cycles on a slot \
         that moved to node {to}: the slot map kept the old primary"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_primary_of_a_held_lock_loses_no_update() {
    let _load = distlock_tests::heavy().await;
    let mut cluster = RedisCluster::start(3, 1);
    // The guarded counter lives elsewhere, where the failover cannot touch it.
    let store = RedisServer::start();
    // min_replicas(1): an acquire counts only once the replica has it, so the replica that
    // takes over has every lock its primary granted (asynchronous replication alone could
    // lose one, and let two holders in).
    let locks = [
        builder(&cluster).min_replicas(1).build().unwrap(),
        builder(&cluster).min_replicas(1).build().unwrap(),
    ];
    let occupancy = Arc::new(Occupancy::default());
    // Bodies that got as far as their write.
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let locks = locks[i % 2].clone();
        let occupancy = Arc::clone(&occupancy);
        let written = Arc::clone(&written);
        let stop = Arc::clone(&stop);
        let store = store.client().await;
        tasks.push(tokio::spawn(async move {
            let mut errors = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut store = store.clone();
                let written = Arc::clone(&written);
                let occupancy = Arc::clone(&occupancy);
                let body = async move {
                    let _inside = occupancy.enter(&["counter"]);
                    let value: Option<u64> = redis::cmd("GET")
                        .arg("counter")
                        .query_async(&mut store)
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let () = redis::cmd("SET")
                        .arg("counter")
                        .arg(value.unwrap_or(0) + 1)
                        .query_async(&mut store)
                        .await
                        .unwrap();
                    written.fetch_add(1, Ordering::Relaxed);
                };
                let outcome = locks
                    .lock("counter")
                    .ttl(Duration::from_secs(10))
                    .wait(Duration::from_secs(5))
                    .run(body)
                    .await;
                if outcome.is_err() {
                    // The failover: errors until the replica takes over and has a replica.
                    errors += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            errors
        }));
    }
    // A lease on another key of the same primary, held across the failover by renewal.
    let primary = cluster.primary_of("distlock:lock:{counter}");
    let renewed_key = (0..1000)
        .map(|i| format!("renewed-{i}"))
        .find(|k| cluster.primary_of(&format!("distlock:lock:{{{k}}}")) == primary)
        .unwrap();
    let renewed = locks[0]
        .lock(renewed_key.as_str())
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let slot = cluster.slot_of("distlock:lock:{counter}");
    let before = written.load(Ordering::Relaxed);
    let killed = cluster.kill_primary_of("distlock:lock:{counter}");
    let started = Instant::now();
    cluster.wait_for_failover(slot, Duration::from_secs(15));
    let failover = started.elapsed();
    // The old primary comes back as the new one's replica, so WAIT 1 can succeed again.
    cluster.node_mut(killed).restart();
    let resumed = distlock_tests::eventually(Duration::from_secs(20), || {
        let written = Arc::clone(&written);
        async move {
            let now = written.load(Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            written.load(Ordering::Relaxed) > now + 5
        }
    })
    .await;
    // The renewed lease either went on on the new primary or was reported lost; either way
    // nothing hangs.
    let lost = tokio::time::timeout(Duration::from_millis(100), renewed.lost())
        .await
        .is_ok();
    let released = tokio::time::timeout(Duration::from_secs(3), renewed.release()).await;
    let released = released.expect("the release of a lease held across a failover hung");
    if !lost {
        released.expect("a lease renewed across the failover releases");
    }
    stop.store(true, Ordering::Relaxed);
    let mut errors = 0;
    for task in tasks {
        errors += task.await.unwrap();
    }
    eprintln!(
        "failover of node {killed} in {failover:?}, updates resumed {resumed:?} after it, \
         {errors} errors, renewed lease lost: {lost}"
    );
    assert!(resumed.is_some(), "locking resumed on the new primary");
    let total = written.load(Ordering::Relaxed);
    assert!(total > before);
    assert_eq!(occupancy.overlaps(), 0, "two holders overlapped");
    let counter = store.command(&["GET", "counter"]);
    assert!(
        counter.contains(&format!("\r\n{total}\r\n")),
        "counter {counter:?} after {total} locked updates"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_not_left_asleep_by_a_killed_primary_and_resubscribe_on_the_new_one() {
    let _load = distlock_tests::heavy().await;
    let mut cluster = RedisCluster::start(3, 1);
    // The holder's lock is on the replica before the kill (min_replicas), so it survives.
    let holder = builder(&cluster).min_replicas(1).build().unwrap();
    let waiter = manager(&cluster);
    let held = holder
        .lock("moved")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let asleep = waiter.clone();
    let first = tokio::spawn(async move {
        let outcome = asleep
            .lock("moved")
            .wait(Duration::from_secs(25))
            .acquire()
            .await;
        (Instant::now(), outcome.map(drop))
    });
    let channel = "distlock:lock:{moved}";
    let node = cluster.primary_of(channel);
    let subscribed = distlock_tests::eventually(Duration::from_secs(5), || async {
        shard_subscribed(&cluster, node, channel)
    })
    .await;
    assert!(
        subscribed.is_some(),
        "the waiter subscribed on the key's primary"
    );
    let slot = cluster.slot_of(channel);
    let killed = Instant::now();
    cluster.kill_primary_of(channel);
    // The subscription died with the node: the waiter is woken to try again (and gets the
    // failover's error, or the lock), not left asleep until the holder's 30 s expiry.
    let (ended, _) = first.await.unwrap();
    assert!(
        ended - killed < Duration::from_secs(8),
        "{:?}",
        ended - killed
    );
    let new = cluster.wait_for_failover(slot, Duration::from_secs(15));
    // A waiter of the same manager afterwards subscribes on the new primary, and the release
    // there wakes it.
    let second = distlock_tests::spawn_waiter(&waiter, "moved", Duration::from_secs(25));
    let subscribed = distlock_tests::eventually(Duration::from_secs(10), || async {
        shard_subscribed(&cluster, new, channel)
    })
    .await;
    assert!(
        subscribed.is_some(),
        "the waiter subscribed on the new primary"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = second.await.unwrap();
    let lease = lease.unwrap();
    assert!(
        acquired - released < Duration::from_secs(1),
        "woken {:?} after the release",
        acquired - released
    );
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_costs_no_lease_renewed_on_another_node() {
    let _load = distlock_tests::heavy().await;
    let mut cluster = RedisCluster::start(3, 0);
    // Otherwise every node refuses commands once a slot is uncovered (CLUSTERDOWN), which
    // would take every lease with it, whatever the client does.
    for i in 0..cluster.node_count() {
        cluster
            .node(i)
            .command(&["CONFIG", "SET", "cluster-require-full-coverage", "no"]);
    }
    let locks = manager(&cluster);
    let node_of = |key: &str| cluster.primary_of(&format!("distlock:lock:{{{key}}}"));
    let (stuck, healthy) = (
        KEYS[0],
        KEYS.iter()
            .find(|k| node_of(k) != node_of(KEYS[0]))
            .unwrap(),
    );
    let ttl = Duration::from_millis(900);
    // Acquired together, so their renewals share batches.
    let on_paused = locks.lock(stuck).ttl(ttl).acquire().await.unwrap();
    let elsewhere = locks.lock(*healthy).ttl(ttl).acquire().await.unwrap();
    let paused = cluster.pause_primary_of(&format!("distlock:lock:{{{stuck}}}"));
    tokio::time::sleep(ttl * 3).await;
    cluster.resume(paused);
    assert!(
        tokio::time::timeout(Duration::from_millis(10), on_paused.lost())
            .await
            .is_ok(),
        "the lease on the paused node is lost"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(10), elsewhere.lost())
            .await
            .is_err(),
        "the lease on a healthy node was renewed"
    );
    elsewhere.release().await.unwrap();
}

/// A primary that hangs (paused: as stuck or cut off) is failed over by the cluster while it
/// still hangs; calls to it time out, and each has the slot map fetched anew, so locking moves
/// to its replica soon after the failover, without the hung node ever answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_failed_over_is_routed_around_while_it_still_hangs() {
    let _load = distlock_tests::heavy().await;
    let mut cluster = RedisCluster::start(3, 1);
    let locks = manager(&cluster);
    // No waiter: nothing but the calls themselves can tell the manager the map changed.
    distlock_tests::lock_once(&locks, "hung").await;
    let name = locks.redis_key("hung");
    let slot = cluster.slot_of(&name);
    let paused = cluster.pause_primary_of(&name);
    cluster.wait_for_failover(slot, Duration::from_secs(10));
    let failed_over = Instant::now();
    loop {
        match locks.try_lock("hung").acquire().await {
            Ok(lease) => {
                lease.release().await.unwrap();
                break;
            }
            Err(error) => assert!(
                failed_over.elapsed() < Duration::from_secs(3),
                "still failing {:?} after the failover: {error}",
                failed_over.elapsed()
            ),
        }
    }
    cluster.resume(paused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_in_a_later_slot_releases_what_it_took_in_an_earlier_one() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    // Of two keys in different slots, the user may touch only the one whose slot comes first:
    // the request takes it, then Redis refuses the script for the other (NOPERM, before it ran).
    let mut keys = ["alpha", "bravo"];
    keys.sort_by_key(|k| cluster.slot_of(&format!("distlock:lock:{{{k}}}")));
    let [first, second] = keys;
    for i in 0..cluster.node_count() {
        let reply = cluster.node(i).command(&[
            "ACL",
            "SETUSER",
            "partial",
            "on",
            ">secret",
            "+@all",
            "&*",
            &format!("~distlock:*{{{first}}}"),
        ]);
        assert_eq!(reply, "+OK\r\n");
    }
    let urls = cluster
        .seed_urls()
        .iter()
        .map(|url| url.replace("redis://", "redis://partial:secret@"))
        .collect::<Vec<_>>();
    let locks = LockManager::builder()
        .cluster(urls)
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .pool_wait_timeout(TIMEOUT)
        .build()
        .unwrap();
    let outcome = locks
        .lock_all(keys)
        .ttl(Duration::from_secs(30))
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(outcome.is_err(), "{outcome:?}");
    // What the first call wrote is released by token at once, not left for its 30 s ttl.
    let started = Instant::now();
    while held(&cluster, first) {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{first} left held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!held(&cluster, second));
}

/// Waits until node `node` says `state` (`CLUSTER INFO`'s `cluster_state:fail` or `:ok`).
async fn until_cluster_state(cluster: &RedisCluster, node: usize, state: &str) {
    let started = Instant::now();
    let wanted = format!("cluster_state:{state}");
    while !cluster
        .node(node)
        .command(&["CLUSTER", "INFO"])
        .contains(&wanted)
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "node {node} never said {wanted}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A release refused because the key's primary sees the cluster as failed (`CLUSTERDOWN`: cut
/// off from the other primaries) returns that error, and is retried in the background until
/// the lock is gone: soon after the cluster is whole again, long before the lock's ttl. So is
/// `run`'s release after its body, whose result the failed release does not hide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_with_clusterdown_is_retried_until_the_lock_is_gone() {
    let _load = distlock_tests::heavy().await;
    let mut cluster = RedisCluster::start(3, 0);
    let locks = manager(&cluster);
    let node_of = |key: &str| cluster.primary_of(&format!("distlock:lock:{{{key}}}"));
    let home = node_of("down");
    let ran = (0..)
        .map(|i| format!("down-{i}"))
        .find(|key| node_of(key) == home)
        .unwrap();
    let ttl = Duration::from_secs(30);
    let lease = locks.lock("down").ttl(ttl).acquire().await.unwrap();
    let (end, ended) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(locks.lock(&ran).ttl(ttl).run(async move {
        let _ = ended.await;
        "the body's result"
    }));
    while !held(&cluster, &ran) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The other primaries stop answering: past the node timeout, the key's primary counts
    // itself in a minority and refuses every key (CLUSTERDOWN), as when it is cut off.
    let others: Vec<usize> = (0..cluster.node_count()).filter(|&i| i != home).collect();
    for &i in &others {
        cluster.node_mut(i).pause();
    }
    until_cluster_state(&cluster, home, "fail").await;
    let refused = lease.release().await.unwrap_err();
    assert!(refused.is_unavailable(), "{refused:?}");
    assert!(refused.to_string().contains("cluster is down"), "{refused}");
    end.send(()).unwrap();
    assert_eq!(running.await.unwrap().unwrap(), "the body's result");
    let lock_names = ["down", ran.as_str()].map(|key| format!("distlock:lock:{{{key}}}"));
    // Keyless (`KEYS`): a node that sees the cluster failed refuses `EXISTS` too.
    let still_held = |cluster: &RedisCluster| {
        let held = cluster.node(home).command(&["KEYS", "distlock:lock:*"]);
        let held: Vec<&str> = held.lines().collect();
        lock_names
            .iter()
            .filter(|name| held.contains(&name.as_str()))
            .count()
    };
    assert_eq!(still_held(&cluster), 2, "nothing could release them yet");
    tokio::time::sleep(Duration::from_secs(1)).await;
    for &i in &others {
        cluster.resume(i);
    }
    until_cluster_state(&cluster, home, "ok").await;
    let whole = Instant::now();
    while still_held(&cluster) > 0 {
        assert!(
            whole.elapsed() < Duration::from_secs(5),
            "the locks were left to their {ttl:?} ttl"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("released {:?} after the cluster was whole", whole.elapsed());
}
