//! Sentinel: the manager finds the primary through the sentinels and follows it across a
//! failover, whether the old primary died or stayed up as a replica (`READONLY`), with its
//! command and subscriber connections; recovery takes a bounded time.

use std::time::{Duration, Instant};

use distlock_runtime::LockManager;
use distlock_tests::topology::SentinelGroup;
use distlock_tests::Proxy;

const TIMEOUT: Duration = Duration::from_millis(500);

fn manager(group: &SentinelGroup) -> LockManager {
    LockManager::builder()
        .sentinel(group.master_name(), group.sentinel_urls())
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .pool_wait_timeout(TIMEOUT)
        .build()
        .unwrap()
}

/// Tries to lock `key` every 20 ms until it works; how long that took.
async fn until_locks(locks: &LockManager, key: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        match locks.lock(key).wait(Duration::ZERO).acquire().await {
            Ok(lease) => {
                lease.release().await.unwrap();
                return started.elapsed();
            }
            Err(error) => {
                assert!(
                    started.elapsed() < within,
                    "still failing after {within:?}: {error}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Whether the server at `index` holds `key`'s lock.
fn holds(group: &SentinelGroup, index: usize, key: &str) -> bool {
    group
        .server(index)
        .command(&["EXISTS", &format!("distlock:lock:{{{key}}}")])
        == ":1\r\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_within_a_bounded_time() {
    let _load = distlock_tests::heavy().await;
    let mut group = SentinelGroup::start(2, 3);
    let locks = manager(&group);
    let lease = locks.lock("s-kill").acquire().await.unwrap();
    assert!(holds(&group, group.primary_index(), "s-kill"));
    let token = lease.fencing_token();
    lease.release().await.unwrap();
    let old = group.primary_port();
    group.kill_primary();
    let killed = Instant::now();
    let recovered = until_locks(&locks, "s-kill", Duration::from_secs(20)).await;
    let new = group.wait_for_new_primary(old, Duration::from_secs(5));
    assert_ne!(new, old);
    eprintln!("sentinel: locking again {recovered:?} after the primary was killed");
    assert!(killed.elapsed() < Duration::from_secs(20));
    // On the new primary, tokens go on rising.
    let lease = locks.lock("s-kill").acquire().await.unwrap();
    assert!(lease.fencing_token() > token);
    assert!(holds(&group, group.primary_index(), "s-kill"));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_with_the_old_primary_alive_is_followed_by_commands_and_waiters() {
    let _load = distlock_tests::heavy().await;
    let group = SentinelGroup::start(1, 3);
    let locks = [manager(&group), manager(&group)];
    let old_index = group.primary_index();
    let old = group.primary_port();
    // Held across the switch; a waiter of the other manager subscribed on the old primary.
    let held = locks[0]
        .lock("s-switch")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiting = distlock_tests::spawn_waiter(&locks[1], "s-switch", Duration::from_secs(30));
    let conn = group.server(old_index).client().await;
    distlock_tests::until_subscribed(&conn, "s-switch").await;
    // The replica has the lock before it is promoted.
    group.server(old_index).command(&["WAIT", "1", "2000"]);
    let switched = Instant::now();
    group.failover();
    let new = group.wait_for_new_primary(old, Duration::from_secs(15));
    let new_index = group.primary_index();
    assert_ne!(new_index, old_index, "now on port {new}");
    // The old primary stays up as a replica. A manager still talking to it gets READONLY,
    // drops the connection and asks the sentinels again; +switch-master does the same.
    let recovered = until_locks(&locks[0], "s-other", Duration::from_secs(15)).await;
    eprintln!(
        "sentinel: locking again {recovered:?} after the switch was seen ({:?} after SENTINEL FAILOVER)",
        switched.elapsed()
    );
    // The old primary still accepts writes (it says role:master for some 10 s), so locking
    // again proves nothing by itself: the lock must land on the new primary.
    let other = locks[0]
        .lock("s-other")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap();
    assert!(
        holds(&group, new_index, "s-other") && !holds(&group, old_index, "s-other"),
        "commands still go to the old primary after the switch"
    );
    other.release().await.unwrap();
    assert!(
        holds(&group, new_index, "s-switch"),
        "the lock moved with the primary"
    );
    // The waiter resubscribed on the new primary: the release there wakes it at once, not the
    // holder's 30 s expiry.
    let conn = group.server(new_index).client().await;
    distlock_tests::until_subscribed(&conn, "s-switch").await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = waiting.await.unwrap();
    let lease = lease.unwrap();
    assert!(
        acquired - released < Duration::from_secs(1),
        "{:?}",
        acquired - released
    );
    assert!(holds(&group, new_index, "s-switch"));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_answering_readonly_is_left_for_the_new_one() {
    let _load = distlock_tests::heavy().await;
    let group = SentinelGroup::start(1, 3);
    let urls = group.sentinel_urls();
    let first_port: u16 = urls[0].rsplit(':').next().unwrap().parse().unwrap();
    // This manager hears of switches only through a proxy to the first sentinel, which is then
    // cut off: it keeps its connection to the old primary until that one says READONLY.
    let proxy = Proxy::start_to(first_port).await;
    let deaf = LockManager::builder()
        .sentinel(group.master_name(), [proxy.url(), urls[1].clone()])
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .pool_wait_timeout(TIMEOUT)
        .build()
        .unwrap();
    distlock_tests::lock_once(&deaf, "s-readonly").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.freeze();
    let old_index = group.primary_index();
    let old = group.failover();
    let new = group.wait_for_new_primary(old, Duration::from_secs(15));
    // Demoted at once, as Sentinel would do some 10 s later, but without Sentinel's
    // `CLIENT KILL TYPE normal`: the manager's connection to it stays open, and its next write
    // is refused with READONLY.
    let demoted = group
        .server(old_index)
        .command(&["REPLICAOF", "127.0.0.1", &new.to_string()]);
    assert!(demoted.starts_with("+OK"), "{demoted}");
    let started = Instant::now();
    let lease = deaf
        .lock("s-readonly")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .unwrap();
    // READONLY, then a fresh connection to the primary the answering sentinel names: one call.
    assert!(started.elapsed() < TIMEOUT * 4, "{:?}", started.elapsed());
    assert!(holds(&group, group.primary_index(), "s-readonly"));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sentinel_is_passed_over_for_the_others_within_the_timeouts() {
    let _load = distlock_tests::timed().await;
    let group = SentinelGroup::start(0, 3);
    let primary = group.primary_index();
    // The first sentinel, which a new manager asks first, hangs: it accepts connections and
    // answers nothing.
    group.pause_sentinel(0);
    let timeout = Duration::from_millis(300);
    let locks = LockManager::builder()
        .sentinel(group.master_name(), group.sentinel_urls())
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .pool_wait_timeout(timeout)
        .build()
        .unwrap();
    let started = Instant::now();
    let lease = locks
        .lock("s-hung")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("the primary found through the other sentinels");
    let took = started.elapsed();
    // One connect timeout on the hung sentinel, then the next one answers.
    assert!(
        took < timeout * 2,
        "locked {took:?} after the first try (timeouts {timeout:?})"
    );
    assert!(holds(&group, primary, "s-hung"));
    lease.release().await.unwrap();
    group.resume_sentinel(0);
}
