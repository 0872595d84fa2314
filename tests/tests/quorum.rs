//! Redlock over five independent servers: a majority holds the lock, a minority down changes
//! nothing, a majority down is refused fast, an extension without a majority loses the lease,
//! and fencing tokens keep rising when nodes come back empty.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager};
use distlock_tests::{Occupancy, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(500);

fn quorum(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn manager(servers: &[RedisServer]) -> LockManager {
    builder(servers).build().unwrap()
}

fn builder(servers: &[RedisServer]) -> distlock_runtime::LockManagerBuilder {
    LockManager::builder()
        .quorum(servers.iter().map(RedisServer::url))
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .pool_wait_timeout(TIMEOUT)
}

/// How many nodes hold `key`'s lock.
fn holders(servers: &[RedisServer], key: &str) -> usize {
    servers
        .iter()
        .filter(|s| s.pid().is_some())
        .filter(|s| s.command(&["EXISTS", &format!("distlock:lock:{{{key}}}")]) == ":1\r\n")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_five_down_locks_still_exclude_and_tokens_rise() {
    let _load = distlock_tests::heavy().await;
    let mut servers = quorum(5);
    servers[0].kill();
    servers[3].kill();
    let locks = [manager(&servers), manager(&servers)];
    let lease = locks[0].lock("q-two-down").acquire().await.unwrap();
    assert_eq!(holders(&servers, "q-two-down"), 3);
    let taken = locks[1].try_lock("q-two-down").acquire().await.unwrap_err();
    assert!(matches!(taken, LockError::NotAcquired { .. }), "{taken:?}");
    let first = lease.fencing_token();
    lease.release().await.unwrap();
    assert_eq!(holders(&servers, "q-two-down"), 0);

    // Two managers, four workers each, one key: never two inside, tokens only rise.
    let occupancy = Arc::new(Occupancy::default());
    let last = Arc::new(std::sync::Mutex::new(first));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let locks = locks[i % 2].clone();
        let occupancy = Arc::clone(&occupancy);
        let last = Arc::clone(&last);
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let lease = locks
                    .lock("q-two-down")
                    .ttl(Duration::from_secs(5))
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await
                    .unwrap();
                {
                    let _inside = occupancy.enter(&["q-two-down"]);
                    let mut last = last.lock().unwrap();
                    assert!(lease.fencing_token() > *last, "token went backwards");
                    *last = lease.fencing_token();
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                lease.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(occupancy.overlaps(), 0);
    assert_eq!(occupancy.entries(), 120);
}

#[tokio::test]
async fn with_three_of_five_down_an_acquire_is_refused_at_once_and_leaves_nothing() {
    let _load = distlock_tests::timed().await;
    let mut servers = quorum(5);
    let locks = manager(&servers);
    distlock_tests::lock_once(&locks, "warm").await;
    servers[1].kill();
    servers[2].kill();
    // Hung, not down: its connection stays open and nothing is answered.
    servers[4].pause();
    let started = Instant::now();
    let refused = locks
        .lock("q-three-down")
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            refused,
            LockError::NoQuorum {
                needed: 3,
                nodes: 5,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("majority"), "{refused}");
    // Not the 10 s wait, and not a response timeout per node: the paused node's bound is a
    // tenth of the ttl.
    assert!(took < TIMEOUT, "refused after {took:?}");
    // The paused node runs the acquire when it resumes; the release by token that the
    // refused acquire left behind takes it back.
    servers[4].resume();
    let released = distlock_tests::eventually(Duration::from_secs(3), || async {
        holders(&servers, "q-three-down") == 0
    })
    .await;
    assert!(released.is_some(), "a node still holds the refused lock");
}

#[tokio::test]
async fn an_extension_without_a_majority_loses_the_lease() {
    let mut servers = quorum(5);
    let locks = manager(&servers);
    let lease = locks
        .lock("q-extend")
        .ttl(Duration::from_secs(10))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    lease.extend(Duration::from_secs(10)).await.unwrap();
    servers[0].kill();
    servers[1].kill();
    servers[2].kill();
    let lost = lease.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(matches!(lost, LockError::LeaseLost { .. }), "{lost:?}");
    tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .expect("the lease reports itself lost");
}

#[tokio::test]
async fn tokens_rise_past_an_earlier_lease_whose_token_ran_ahead_also_after_a_node_restarts() {
    let mut servers = quorum(3);
    let locks = manager(&servers);
    let first = locks.lock("q-fence").acquire().await.unwrap();
    let t1 = first.fencing_token();
    first.release().await.unwrap();
    // An earlier lease's token far ahead (drawn by a node whose clock runs ahead), written back
    // to a majority, as a lease's token always is: every later majority meets one of them.
    let ahead = t1 + 1_000_000_000;
    for server in &servers[..2] {
        server.command(&[
            "SET",
            "distlock:fence:{q-fence}",
            &ahead.to_string(),
            "PX",
            "600000",
        ]);
    }
    let second = locks.lock("q-fence").acquire().await.unwrap();
    let t2 = second.fencing_token();
    assert!(t2 > ahead, "{t2} <= {ahead}");
    second.release().await.unwrap();
    // A node restarts empty: every majority still has a node that remembers the token. (Nodes
    // 0 and 1 both drew it, so they hold it whether the round waited for node 2 or ended as
    // soon as they agreed; node 2 may have been left behind, so it is the one restarted. A
    // node of the majority that holds the token restarting at once breaks Redlock's restart
    // rule, which the crate docs state.)
    servers[2].restart();
    let third = locks.lock("q-fence").acquire().await.unwrap();
    let t3 = third.fencing_token();
    assert!(t3 > t2, "{t3} <= {t2}");
    third.release().await.unwrap();
}

#[tokio::test]
async fn tokens_keep_rising_when_every_node_restarts_empty_after_the_ttl() {
    let mut servers = quorum(3);
    let locks = manager(&servers);
    let ttl = Duration::from_millis(300);
    let mut last = 0;
    for _ in 0..3 {
        let lease = locks.lock("q-restart").ttl(ttl).acquire().await.unwrap();
        assert!(
            lease.fencing_token() > last,
            "{} <= {last}",
            lease.fencing_token()
        );
        last = lease.fencing_token();
        lease.release().await.unwrap();
        // The restart rule: a node that lost its data stays away for the longest ttl. Every
        // counter is gone then, and tokens go on from the nodes' clocks, past every earlier one.
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        for server in &mut servers {
            server.restart();
        }
    }
}

#[tokio::test]
async fn fair_requests_are_refused_on_a_quorum() {
    let servers = quorum(3);
    let locks = manager(&servers);
    let refused = locks.lock("q-fair").fair(true).acquire().await.unwrap_err();
    assert!(
        matches!(refused, LockError::InvalidConfig { what: "fair", .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("quorum"), "{refused}");
    let built = LockManager::builder()
        .quorum(servers.iter().map(RedisServer::url))
        .default_fair(true)
        .build()
        .unwrap_err();
    assert!(
        matches!(built, LockError::InvalidConfig { .. }),
        "{built:?}"
    );
}

#[tokio::test]
async fn a_waiter_on_a_quorum_is_woken_by_the_release() {
    let servers = quorum(3);
    let locks = [manager(&servers), manager(&servers)];
    let held = locks[0]
        .lock("q-wake")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let info = locks[1].inspect("q-wake").await.unwrap().unwrap();
    assert!(info.remaining > Duration::from_secs(29));
    let listed = locks[1].held_locks("q-*").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let waiting = distlock_tests::spawn_waiter(&locks[1], "q-wake", Duration::from_secs(20));
    // The waiter subscribes on the first node that answers.
    distlock_tests::until_subscribed_on_any(&clients(&servers).await, "q-wake").await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = waiting.await.unwrap();
    let lease = lease.unwrap();
    assert!(acquired - released < Duration::from_secs(1));
    lease.release().await.unwrap();
}

/// A quorum's waiter listens on one node, and the attempt that marked the holder as waited on
/// may have failed on that node: a quorum announces every release, so such a waiter is still
/// woken by the release, not at the holder's 30 s expiry. Here the marks are taken away on every
/// node that has one: the holder holds a majority, not necessarily every node (under load one
/// node's request can miss its time and leave that node unlocked, with nothing to mark), so
/// the test waits for no mark on any given node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_waiter_is_woken_even_where_its_mark_is_missing() {
    let _load = distlock_tests::timed().await;
    let servers = quorum(3);
    let locks = [manager(&servers), manager(&servers)];
    // Connections open and scripts loaded, so that no node's request in the rounds below pays
    // for them within its time (a tenth of the ttl, at most the response timeout).
    for locks in &locks {
        distlock_tests::lock_once(locks, "warm").await;
    }
    let held = locks[0]
        .lock("q-unmarked")
        .fair(false)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiting =
        distlock_tests::spawn_unfair_waiter(&locks[1], "q-unmarked", Duration::from_secs(20));
    distlock_tests::until_subscribed_on_any(&clients(&servers).await, "q-unmarked").await;
    // Both of the waiter's attempts sent (held, then once more once subscribed): the first one
    // was answered held, and its mark set where it found the holder.
    distlock_tests::until_attempts(&locks[1], 2).await;
    let key = locks[0].redis_key("q-unmarked");
    let unmarked = unmark_until_none_is_left(&servers, &key).await;
    assert!(unmarked > 0, "the waiter marked no node");
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = waiting.await.unwrap();
    let lease = lease.expect("woken by the release");
    assert!(
        acquired - released < Duration::from_secs(1),
        "{:?}",
        acquired - released
    );
    lease.release().await.unwrap();
}

/// Takes the mark (waited on) off the lock key `key` on every server, as if the attempts that
/// marked it had failed there, again and again until none is left 200 ms later (an attempt's
/// request still on its way would mark it again); returns on how many servers a mark was taken
/// off.
///
/// # Panics
/// When marks keep coming back for 10 s.
async fn unmark_until_none_is_left(servers: &[RedisServer], key: &str) -> usize {
    let unmark = "local v = redis.call('GET', KEYS[1]) \
        if v and string.byte(v) == 126 then \
          redis.call('SET', KEYS[1], string.sub(v, 2), 'KEEPTTL') return 1 end return 0";
    let mut unmarked = vec![false; servers.len()];
    let started = Instant::now();
    loop {
        for (server, unmarked) in servers.iter().zip(&mut unmarked) {
            if server.command(&["EVAL", unmark, "1", key]) == ":1\r\n" {
                *unmarked = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let marked = servers
            .iter()
            .filter(|server| server.command(&["GET", key]).contains("\r\n~"))
            .count();
        if marked == 0 {
            return unmarked.iter().filter(|u| **u).count();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{key} marked again on {marked} nodes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_five_hung_a_waiter_waits_for_the_holder_and_gets_the_lock() {
    let mut servers = quorum(5);
    let locks = [manager(&servers), manager(&servers)];
    for locks in &locks {
        distlock_tests::lock_once(locks, "warm").await;
    }
    servers[1].pause();
    servers[3].pause();
    let held = locks[0]
        .lock("q-hung")
        .ttl(Duration::from_secs(2))
        .acquire()
        .await
        .unwrap();
    let waiter = locks[1].clone();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("q-hung")
            .ttl(Duration::from_secs(2))
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    // Contention, not an outage: the waiter is told the key is held and waits.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiting.is_finished(), "{:?}", waiting.await);
    held.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    lease.release().await.unwrap();
    servers[1].resume();
    servers[3].resume();
}

/// The documented formula: a quorum lease is valid for its ttl, less the time since before the
/// round was sent, less the drift margin (1% of the ttl + 2 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_lease_is_valid_for_its_ttl_less_the_round_and_the_drift_margin() {
    let _load = distlock_tests::timed().await;
    let servers = quorum(3);
    // Every node's answers reach the manager 200 ms late: the round takes at least that long
    // after it was sent (a node's bound in an acquire is a tenth of the 3 s ttl, 300 ms).
    let delay = Duration::from_millis(200);
    let mut proxies = Vec::new();
    for server in &servers {
        let proxy = distlock_tests::Proxy::start(server).await;
        proxy.set_mode(distlock_tests::ProxyMode::Delay(delay));
        proxies.push(proxy);
    }
    let locks = LockManager::builder()
        .quorum(proxies.iter().map(distlock_tests::Proxy::url))
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .pool_wait_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    distlock_tests::warm_up(&locks).await;
    let ttl = Duration::from_secs(3);
    let margin = Duration::from_millis(30 + 2);
    let lease = locks
        .lock("q-validity")
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let remaining = lease.remaining();
    let most = ttl - delay - margin;
    assert!(
        remaining <= most && remaining > most - 2 * delay,
        "remaining {remaining:?} after a round of at least {delay:?} (at most {most:?})"
    );
    assert_eq!(holders(&servers, "q-validity"), 3);
    lease.release().await.unwrap();
}

/// A round that left nodes in doubt (hung, so their acquire may still run) takes back what
/// they may grant late. That clean-up belongs to the round: when a later round of the same
/// request takes the lock on those nodes, it must not be released from under the lease (which
/// would leave it on a minority, and let a second holder take a majority).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_clean_up_of_a_hung_round_never_releases_the_lease_a_later_round_took() {
    let mut servers = quorum(5);
    let locks = [manager(&servers), manager(&servers), manager(&servers)];
    for locks in &locks {
        distlock_tests::lock_once(locks, "warm").await;
    }
    let ttl = Duration::from_secs(10);
    let held = locks[0].lock("q-late").ttl(ttl).acquire().await.unwrap();
    for server in &mut servers[2..] {
        server.pause();
    }
    let waiter = locks[1].clone();
    let started = Instant::now();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("q-late")
            .ttl(ttl)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    // The waiter's first round: two nodes say the key is held, three hang until the node
    // timeout (TIMEOUT), which leaves them in doubt.
    tokio::time::sleep(TIMEOUT + Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    for server in &mut servers[2..] {
        server.resume();
    }
    held.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    assert!(started.elapsed() < TIMEOUT * 2, "{:?}", started.elapsed());
    // Held on every node the later round took: all five, or a majority when the holder's
    // release (which returns once a majority answered) had not yet reached the others.
    let took = holders(&servers, "q-late");
    assert!(took >= 3, "{took}");
    // Past every clean-up the first round could have left behind: not one node lost.
    tokio::time::sleep(TIMEOUT * 3).await;
    assert_eq!(holders(&servers, "q-late"), took);
    let other = locks[2].try_lock("q-late").acquire().await;
    assert!(
        matches!(other, Err(LockError::NotAcquired { .. })),
        "a second holder while the first holds the lease: {other:?}"
    );
    lease.release().await.unwrap();
}

/// A try-lock that ends while nodes hang (their acquire may still run, and grant on a free key)
/// takes those late grants back: a majority is never left locked by nobody until the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_lock_that_meets_hung_nodes_takes_their_late_grants_back() {
    let mut servers = quorum(5);
    let locks = [manager(&servers), manager(&servers)];
    for locks in &locks {
        distlock_tests::lock_once(locks, "warm").await;
    }
    // Another owner holds the key on two nodes only; the other three are free, and hang.
    for server in &servers[..2] {
        server.command(&[
            "SET",
            "distlock:lock:{q-try}",
            "someone-else",
            "PX",
            "60000",
        ]);
    }
    for server in &mut servers[2..] {
        server.pause();
    }
    let tried = locks[0]
        .try_lock("q-try")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await;
    assert!(
        matches!(tried, Err(LockError::NotAcquired { .. })),
        "{tried:?}"
    );
    // Back: they run the try-lock's acquire now, and grant it the free key.
    for server in &mut servers[2..] {
        server.resume();
    }
    // Those grants are taken back within a few response timeouts, not left for 30 s: the three
    // free nodes are a majority another request can take.
    let started = Instant::now();
    let lease = locks[1]
        .lock("q-try")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    lease.release().await.unwrap();
}

/// A refusal on a majority of nodes says what exactly was refused, as on one server: a lock key
/// another program wrote is `WrongType`, naming the key and what it holds.
#[tokio::test]
async fn a_lock_key_of_another_type_on_a_majority_is_named() {
    let servers = quorum(3);
    let locks = manager(&servers);
    for server in &servers {
        server.command(&["RPUSH", "distlock:lock:{q-list}", "someone else's"]);
    }
    let error = locks.try_lock("q-list").acquire().await.unwrap_err();
    match &error {
        LockError::WrongType { key, found, .. } => {
            assert_eq!(key, "distlock:lock:{q-list}");
            assert_eq!(found, "a list");
        }
        other => panic!("{other:?}"),
    }
}

/// A read just after an acquire or a release may find the nodes apart (the requests reach
/// them one by one): `inspect` reports a holder only when a majority of nodes list it, never
/// what the first node to answer says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reports_the_lock_as_a_majority_of_nodes_hold_it() {
    let servers = quorum(3);
    let owner = builder(&servers).holder_label("a").build().unwrap();
    let reader = manager(&servers);
    let lease = owner
        .lock("q-apart")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let lock = "distlock:lock:{q-apart}";
    // The first node has not seen the acquire yet: a majority holds it.
    servers[0].command(&["DEL", lock]);
    for _ in 0..20 {
        let info = reader.inspect("q-apart").await.unwrap();
        let label = info.as_ref().and_then(|i| i.holder.as_deref());
        assert_eq!(label, Some("a"), "{info:?}");
        assert!(info.unwrap().remaining > Duration::from_secs(25));
    }
    // Only the first node holds it now (a release on its way to it): nobody does.
    servers[1].command(&["DEL", lock]);
    let value = servers[2].command(&["GET", lock]);
    servers[2].command(&["DEL", lock]);
    servers[0].command(&["SET", lock, value.lines().nth(1).unwrap(), "PX", "30000"]);
    assert_eq!(holders(&servers, "q-apart"), 1);
    for _ in 0..20 {
        let info = reader.inspect("q-apart").await.unwrap();
        assert!(info.is_none(), "{info:?}");
    }
    assert!(reader.held_locks("q-*").await.unwrap().is_empty());
    drop(lease);
}

/// A connection to each server, for the test's own commands.
async fn clients(servers: &[RedisServer]) -> Vec<redis::aio::MultiplexedConnection> {
    let mut clients = Vec::with_capacity(servers.len());
    for server in servers {
        clients.push(server.client().await);
    }
    clients
}
