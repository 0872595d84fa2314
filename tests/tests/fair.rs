//! Fair locks: waiters queue in Redis and a release hands the lock straight to the oldest live
//! waiter; waiters that die or give up do not stall the queue for longer than the documented
//! bound (`HANDOFF_CLAIM` and a quarter more).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_runtime::{distributed_lock, LockError, LockManager, HANDOFF_CLAIM};
use distlock_tests::{eventually, queued, until_queued, until_subscribed, warm_up, RedisServer};
use redis::AsyncCommands;

/// Spawns a fair waiter on `key` that records `name` in `order` when it gets the lock, holds it
/// for `hold`, and returns when it got the lock.
fn fair_waiter(
    locks: &LockManager,
    key: &'static str,
    name: usize,
    order: &Arc<Mutex<Vec<usize>>>,
    hold: Duration,
) -> tokio::task::JoinHandle<Result<Instant, LockError>> {
    let (locks, order) = (locks.clone(), Arc::clone(order));
    tokio::spawn(async move {
        let lease = locks
            .lock(key)
            .fair(true)
            .wait(Duration::from_secs(20))
            .acquire()
            .await?;
        let acquired = Instant::now();
        order.lock().unwrap().push(name);
        tokio::time::sleep(hold).await;
        lease.release().await?;
        Ok(acquired)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_waiters_are_served_in_the_order_they_queued() {
    let server = RedisServer::start();
    let managers: Vec<LockManager> = (0..4).map(|_| server.manager()).collect();
    for locks in &managers {
        warm_up(locks).await;
    }
    let conn = server.client().await;
    let holder = managers[0].lock("fifo").fair(true).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..20 {
        // Waiters of several managers (processes), interleaved, each queued before the next.
        let locks = &managers[i % managers.len()];
        waiters.push(fair_waiter(locks, "fifo", i, &order, Duration::ZERO));
        until_queued(&conn, "fifo", i + 1).await;
    }
    let requests_before: u64 = managers.iter().map(|m| m.stats().acquire_requests).sum();
    holder.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap().expect("every waiter got the lock");
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
    // Each lock went over by hand-off, with no further acquire request.
    let handed: u64 = managers.iter().map(|m| m.stats().handed_over).sum();
    assert_eq!(handed, 20);
    let requests_after: u64 = managers.iter().map(|m| m.stats().acquire_requests).sum();
    assert_eq!(requests_after, requests_before);
    let mut conn = conn;
    assert_eq!(queued(&mut conn, "fifo").await, 0);
    assert!(!conn
        .exists::<_, bool>("distlock:waiters:{fifo}")
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_killed_mid_queue_delay_the_next_by_one_claim_each_at_most() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("killed").fair(true).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = fair_waiter(&locks, "killed", 1, &order, Duration::from_millis(50));
    until_queued(&conn, "killed", 1).await;
    // Next come two waiters of another process, killed while they wait in the queue: the
    // second of them is the one a hand-off to the first names as next, so the claim must be
    // watched from this process too.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
        .args(["wait-fair", &server.url(), "killed", "2"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    until_queued(&conn, "killed", 3).await;
    let third = fair_waiter(&locks, "killed", 3, &order, Duration::ZERO);
    until_queued(&conn, "killed", 4).await;
    child.kill().await.unwrap();

    holder.release().await.unwrap();
    let first_at = first.await.unwrap().unwrap();
    // The first waiter holds 50 ms, then the lock is handed to each dead one in turn; each
    // claim lapses, watched, and then the third waiter takes the lock.
    let third_at = third.await.unwrap().unwrap();
    let delay = third_at - first_at;
    let bound = 2 * (HANDOFF_CLAIM + HANDOFF_CLAIM / 4) + Duration::from_millis(500);
    assert!(
        delay >= 2 * HANDOFF_CLAIM && delay <= bound,
        "the third waiter got the lock {delay:?} after the first (bound {bound:?})"
    );
    assert_eq!(*order.lock().unwrap(), [1, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_give_up_or_are_cancelled_leave_the_queue() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("leave").fair(true).acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let first = fair_waiter(&locks, "leave", 1, &order, Duration::from_millis(20));
    until_queued(&conn, "leave", 1).await;
    let impatient = tokio::spawn(
        locks
            .lock("leave")
            .fair(true)
            .wait(Duration::from_millis(200))
            .acquire(),
    );
    until_queued(&conn, "leave", 2).await;
    let cancelled = fair_waiter(&locks, "leave", 99, &order, Duration::ZERO);
    until_queued(&conn, "leave", 3).await;
    let last = fair_waiter(&locks, "leave", 4, &order, Duration::ZERO);
    until_queued(&conn, "leave", 4).await;
    cancelled.abort();
    assert!(matches!(
        impatient.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    until_queued(&conn, "leave", 2).await;

    holder.release().await.unwrap();
    let first_at = first.await.unwrap().unwrap();
    let last_at = last.await.unwrap().unwrap();
    assert!(
        last_at - first_at < Duration::from_millis(500),
        "the last waiter waited {:?} after the first: a departed waiter stalled the queue",
        last_at - first_at
    );
    assert_eq!(*order.lock().unwrap(), [1, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_lease_is_extended_from_its_claim_to_its_ttl_also_without_renewal() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let mut conn = server.client().await;
    let holder = locks.lock("claim").fair(true).acquire().await.unwrap();
    let waiting = tokio::spawn(
        locks
            .lock("claim")
            .fair(true)
            .renew(false)
            .ttl(Duration::from_secs(10))
            .acquire(),
    );
    until_queued(&conn, "claim", 1).await;
    until_subscribed(&conn, "claim").await;
    holder.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    assert_eq!(locks.stats().handed_over, 1);
    let extended = eventually(Duration::from_secs(1), || {
        let mut conn = conn.clone();
        async move {
            let pttl: i64 = conn.pttl("distlock:lock:{claim}").await.unwrap();
            pttl > i64::try_from(HANDOFF_CLAIM.as_millis()).unwrap()
        }
    })
    .await;
    assert!(extended.is_some(), "the claim was extended to the ttl");
    tokio::time::sleep(HANDOFF_CLAIM + Duration::from_millis(200)).await;
    assert!(!lease.is_lost());
    let pttl: i64 = conn.pttl("distlock:lock:{claim}").await.unwrap();
    assert!(pttl > 7_000 && pttl <= 10_000, "pttl {pttl}");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_handed_over_for_its_whole_ttl_is_not_extended() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("whole").fair(true).acquire().await.unwrap();
    // A ttl under the hand-off claim: the claim is the ttl, nothing is left to extend.
    let ttl = Duration::from_secs(1);
    let waiting = tokio::spawn(
        locks
            .lock("whole")
            .fair(true)
            .renew(false)
            .ttl(ttl)
            .acquire(),
    );
    until_queued(&conn, "whole", 1).await;
    until_subscribed(&conn, "whole").await;
    let before = server.script_calls();
    holder.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    assert_eq!(locks.stats().handed_over, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.script_calls() - before, 1, "the release only");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_of_a_hand_off_tries_again_once_the_claim_and_a_quarter_have_passed() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("watched").fair(true).acquire().await.unwrap();
    let wait = Duration::from_secs(20);
    let first = tokio::spawn(locks.lock("watched").fair(true).wait(wait).acquire());
    until_queued(&conn, "watched", 1).await;
    let second = tokio::spawn(locks.lock("watched").fair(true).wait(wait).acquire());
    until_queued(&conn, "watched", 2).await;
    until_subscribed(&conn, "watched").await;
    holder.release().await.unwrap();
    let lease = first.await.unwrap().unwrap();
    let handed = Instant::now();
    assert_eq!(locks.stats().handed_over, 1);
    // The second waiter, the process's oldest other one, watches the claim: it tries again
    // once the claim and a quarter (2.5 s) have passed, in case the first is gone; not before,
    // while the recipient's extension may still be on its way.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let attempts = locks.stats().acquire_requests;
    tokio::time::sleep_until((handed + HANDOFF_CLAIM * 5 / 4 - Duration::from_millis(200)).into())
        .await;
    assert_eq!(
        locks.stats().acquire_requests,
        attempts,
        "the watcher tried again early"
    );
    let retried = eventually(Duration::from_secs(1), || async {
        locks.stats().acquire_requests > attempts
    })
    .await;
    assert!(retried.is_some(), "the watcher never tried again");
    lease.release().await.unwrap();
    second.await.unwrap().unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_locks_exclude_across_processes() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let url = server.url();
    distlock_tests::run_processes(
        env!("CARGO_BIN_EXE_lock_worker"),
        &["count-fair", &url, "fair-xproc", "fair-counter", "100"],
        3,
    )
    .await;
    let mut conn = server.client().await;
    let total: i64 = conn.get("fair-counter").await.unwrap();
    assert_eq!(total, 300);
}

#[tokio::test]
async fn a_fair_request_for_several_keys_is_refused() {
    let locks = LockManager::from_url("redis://127.0.0.1:1").unwrap();
    let error = locks
        .lock_all(["a", "b"])
        .fair(true)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(error, LockError::InvalidConfig { what: "fair", .. }),
        "{error}"
    );
}

/// Records `name` in `order` under the fair lock on `key`.
#[distributed_lock("{key}", fair = true, wait = 20, manager = locks)]
async fn served(
    locks: &LockManager,
    key: &str,
    name: usize,
    order: &Mutex<Vec<usize>>,
) -> Result<(), LockError> {
    order.lock().unwrap().push(name);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_serves_fair_waiters_in_arrival_order() {
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("attr-fifo").acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut calls = Vec::new();
    for i in 0..8 {
        let (locks, order) = (locks.clone(), Arc::clone(&order));
        calls.push(tokio::spawn(async move {
            served(&locks, "attr-fifo", i, &order).await
        }));
        until_queued(&conn, "attr-fifo", i + 1).await;
    }
    holder.release().await.unwrap();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..8).collect::<Vec<_>>());
    assert_eq!(locks.stats().handed_over, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_learned_too_late_to_trust_is_confirmed_by_an_attempt() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("late").fair(true).acquire().await.unwrap();
    let waiting = tokio::spawn(
        // A 20 ms claim, dated against an attempt 3 s before the hand-off: the 1% drift
        // allowance (30 ms) exceeds it, so the message alone cannot be trusted.
        locks
            .lock("late")
            .fair(true)
            .ttl(Duration::from_millis(20))
            .acquire(),
    );
    until_queued(&conn, "late", 1).await;
    until_subscribed(&conn, "late").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = locks.stats().acquire_requests;
    holder.release().await.unwrap();
    let lease = waiting.await.unwrap().expect("the waiter got the lock");
    assert_eq!(locks.stats().handed_over, 0, "not trusted from the message");
    // One attempt confirmed it (finding the key set to the waiter's own marked token), rather
    // than queueing again and taking the lock once the claim had lapsed.
    assert_eq!(
        locks.stats().acquire_requests - before,
        1,
        "attempts after the hand-off"
    );
    let _ = lease.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_with_an_endless_wait_queues_for_its_presence() {
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let holder = locks.lock("endless").fair(true).acquire().await.unwrap();
    let waiting = tokio::spawn(
        locks
            .lock("endless")
            .fair(true)
            .wait(Duration::from_millis(u64::MAX))
            .acquire(),
    );
    until_queued(&conn, "endless", 1).await;
    // An endless wait (no overflow on the way) keeps the entry for its presence, twice the
    // default ttl of 30 s, renewed by its attempts; the queue keys outlive it by a claim of 2 s,
    // set a quarter longer by the waiter that joins (`fair/acquire.lua`): 1.25 * 62 s.
    for key in ["distlock:queue:{endless}", "distlock:waiters:{endless}"] {
        let pttl: i64 = conn.pttl(key).await.unwrap();
        assert!(pttl > 70_000 && pttl <= 77_500, "{key} has pttl {pttl}");
    }
    holder.release().await.unwrap();
    waiting
        .await
        .unwrap()
        .expect("the waiter got the lock")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_gives_up_passes_its_watch_on() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("heir").fair(true).acquire().await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
        .args(["wait-fair", &server.url(), "heir", "1"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    until_queued(&conn, "heir", 1).await;
    // This waiter will watch the hand-off to the dead one, then give up before its claim lapses.
    let impatient = tokio::spawn(
        locks
            .lock("heir")
            .fair(true)
            .wait(Duration::from_millis(1500))
            .acquire(),
    );
    until_queued(&conn, "heir", 2).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let last = fair_waiter(&locks, "heir", 2, &order, Duration::ZERO);
    until_queued(&conn, "heir", 3).await;
    child.kill().await.unwrap();

    let released = Instant::now();
    holder.release().await.unwrap();
    assert!(matches!(
        impatient.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    let acquired = last.await.unwrap().unwrap();
    let bound = HANDOFF_CLAIM + HANDOFF_CLAIM / 4 + Duration::from_millis(500);
    assert!(
        acquired - released <= bound,
        "the last waiter got the lock {:?} after the release (bound {bound:?})",
        acquired - released
    );
}

#[tokio::test]
async fn a_forged_hand_off_message_does_not_start_a_fair_waiter() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    // A client that may publish on any channel but read or write no key.
    let acl = server.command(&[
        "ACL",
        "SETUSER",
        "mallory",
        "on",
        ">mallory-password",
        "resetchannels",
        "&*",
        "-@all",
        "+publish",
    ]);
    assert!(acl.starts_with("+OK"), "{acl}");
    let mut mallory = redis::Client::open(format!(
        "redis://mallory:mallory-password@127.0.0.1:{}",
        server.port()
    ))
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();

    let locks = server.manager();
    let holder = locks.lock("vault").acquire().await.unwrap();
    let waiter = {
        let locks = server.manager();
        tokio::spawn(async move {
            locks
                .lock("vault")
                .fair(true)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    let mut conn = server.client().await;
    until_queued(&conn, "vault", 1).await;
    until_subscribed(&conn, "vault").await;
    // Tokens of queued waiters travel in hand-off messages: assume the forger knows this one.
    let token: String = conn.lindex("distlock:queue:{vault}", 0).await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    for forged in [
        format!("h {token} 999999 {now_ms} 2000 "),
        format!("h {token} 999999 {now_ms} 2000 {token}"),
        format!("h {token} 999999 {now_ms} 2000 00000000000000000000000000000000"),
    ] {
        let _: i64 = mallory
            .publish("distlock:lock:{vault}", forged)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter started its body on a forged hand-off while the holder still holds the lock: {:?}",
        waiter.await
    );
    // A real release still hands the lock over.
    let held_token = holder.fencing_token();
    holder.release().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("handed over after the real release")
        .unwrap()
        .unwrap();
    assert!(lease.fencing_token() > held_token);
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_real_hand_off_rewritten_by_a_subscriber_is_refused() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let url = server.url();
    // A client that sees the channel (as any subscriber with channel rights does) republishes
    // the real hand-off at once with its own fencing token and a long claim.
    let attacker_url = url.clone();
    let attacker = std::thread::spawn(move || {
        let client = redis::Client::open(attacker_url.as_str()).unwrap();
        let mut publisher = client.get_connection().unwrap();
        let mut subscriber = client.get_connection().unwrap();
        let mut pubsub = subscriber.as_pubsub();
        pubsub.subscribe("distlock:lock:{rewritten}").unwrap();
        loop {
            let payload: String = pubsub.get_message().unwrap().get_payload().unwrap();
            if let Some(fields) = payload.strip_prefix("h ") {
                let f: Vec<&str> = fields.split(' ').collect();
                // `h <token> <fence> <ms> <claim> <mac>`: the fence and the claim rewritten.
                let forged = format!("h {} 9000000000000000 {} 600000 {}", f[0], f[2], f[4]);
                let _: i64 = redis::cmd("PUBLISH")
                    .arg("distlock:lock:{rewritten}")
                    .arg(forged)
                    .query(&mut publisher)
                    .unwrap();
                return;
            }
        }
    });
    let locks = server.manager();
    let holder = locks.lock("rewritten").acquire().await.unwrap();
    // The waiter's thread is busy now and then, so both messages wait for it together.
    tokio::spawn(async {
        loop {
            std::thread::sleep(Duration::from_millis(30));
            tokio::task::yield_now().await;
        }
    });
    let waiter = {
        let locks = server.manager();
        tokio::spawn(async move {
            locks
                .lock("rewritten")
                .fair(true)
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    let mut conn = server.client().await;
    until_queued(&conn, "rewritten", 1).await;
    holder.release().await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    attacker.join().unwrap();
    assert!(
        lease.fencing_token() < 9_000_000_000_000_000,
        "the waiter took the rewritten message's fencing token"
    );
    // Past the real claim (2 s): the lease must still be held in Redis (it was extended to its
    // ttl), or know that it is lost; never believe in a lock Redis has expired.
    tokio::time::sleep(HANDOFF_CLAIM + Duration::from_millis(700)).await;
    let held: Option<String> = conn.get("distlock:lock:{rewritten}").await.unwrap();
    assert!(
        held.is_some() || lease.is_lost(),
        "the waiter believes it holds a lock that Redis expired"
    );
    lease.release().await.unwrap();
}

/// Starts `lock_worker wait-fair` with `n` waiters on `key` (each waiting up to `wait`).
fn wait_fair_process(
    server: &RedisServer,
    key: &str,
    n: usize,
    wait: Duration,
) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
        .args([
            "wait-fair",
            &server.url(),
            key,
            &n.to_string(),
            &wait.as_millis().to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiters_entry_whose_wait_has_passed_is_skipped_at_once() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("stale").fair(true).acquire().await.unwrap();
    // A waiter of another process, with a 500 ms wait, killed in the queue: its entry stays,
    // carrying a deadline that passes.
    let mut child = wait_fair_process(&server, "stale", 1, Duration::from_millis(500));
    until_queued(&conn, "stale", 1).await;
    child.kill().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let live = fair_waiter(&locks, "stale", 2, &order, Duration::ZERO);
    until_queued(&conn, "stale", 2).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    // Handed straight to the live waiter: no claim is spent on the dead one.
    let taken = live.await.unwrap().unwrap();
    assert!(
        taken - released < HANDOFF_CLAIM / 2,
        "the live waiter got the lock {:?} after the release",
        taken - released
    );
    assert_eq!(locks.stats().handed_over, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_waiters_of_several_processes_delay_a_live_one_elsewhere_by_one_claim_each() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let holder = locks.lock("spread").fair(true).acquire().await.unwrap();
    // Two processes each queue a waiter and are killed; a third process's waiter queues last.
    // This process waits for nothing: the only watcher of the lapsing claims is elsewhere.
    let wait = Duration::from_secs(60);
    let mut dead = Vec::new();
    for n in 1..=2 {
        dead.push(wait_fair_process(&server, "spread", 1, wait));
        until_queued(&conn, "spread", n).await;
    }
    let mut live = wait_fair_process(&server, "spread", 1, wait);
    until_queued(&conn, "spread", 3).await;
    for mut child in dead {
        child.kill().await.unwrap();
    }
    let released = Instant::now();
    holder.release().await.unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(live.stdout.take().unwrap()));
    let line = tokio::time::timeout(Duration::from_secs(15), lines.next_line())
        .await
        .expect("the live waiter got the lock")
        .unwrap()
        .unwrap_or_default();
    let delay = released.elapsed();
    assert!(line.starts_with("acquired"), "{line}");
    let bound = 2 * (HANDOFF_CLAIM + HANDOFF_CLAIM / 4) + Duration::from_millis(700);
    assert!(
        delay >= 2 * HANDOFF_CLAIM && delay <= bound,
        "the live waiter got the lock {delay:?} after the release (bound {bound:?})"
    );
    live.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_one_key_are_fair_unless_they_say_otherwise() {
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let mut conn = server.client().await;
    let holder = locks.lock("default").acquire().await.unwrap();
    // A request that says nothing queues in Redis, as a fair one does; one that says
    // fair(false) does not.
    let fair = distlock_tests::spawn_waiter(&locks, "default", Duration::from_secs(10));
    until_queued(&conn, "default", 1).await;
    let unfair = tokio::spawn(
        locks
            .lock("default")
            .fair(false)
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(queued(&mut conn, "default").await, 1);
    // The release hands the lock to the queued waiter, ahead of the unfair one.
    holder.release().await.unwrap();
    let (_, lease) = fair.await.unwrap();
    assert_eq!(locks.stats().handed_over, 1);
    lease.unwrap().release().await.unwrap();
    unfair.await.unwrap().unwrap().release().await.unwrap();

    // Several keys are never fair by default (a fair request for them is refused).
    let both = locks.lock_all(["default:a", "default:b"]).acquire().await;
    both.expect("several keys, unfair by default")
        .release()
        .await
        .unwrap();

    // A manager that says default_fair(false): its waiters do not queue.
    let unfair_locks = server
        .manager_builder()
        .default_fair(false)
        .build()
        .unwrap();
    let holder = unfair_locks.lock("plain").acquire().await.unwrap();
    let waiter = distlock_tests::spawn_waiter(&unfair_locks, "plain", Duration::from_secs(10));
    distlock_tests::until_subscribed(&conn, "plain").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(queued(&mut conn, "plain").await, 0);
    holder.release().await.unwrap();
    waiter.await.unwrap().1.unwrap().release().await.unwrap();
    assert_eq!(unfair_locks.stats().handed_over, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_to_a_waiter_that_polls_is_confirmed_by_its_next_attempt() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    // A manager on a pool cannot subscribe: its waiters poll (every 1 to 50 ms) and never see a
    // hand-off message. A waiter handed the lock learns of it from its next attempt, which finds
    // the key set to its own token marked as waited on (`~` + token): that attempt confirms the
    // hand-off at once, rather than queueing behind itself until the claim lapses.
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let polling = LockManager::builder()
        .pool(pool)
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut conn = server.client().await;
    let holder = locks.lock("polled").fair(true).acquire().await.unwrap();
    let waiting = tokio::spawn(
        polling
            .lock("polled")
            .fair(true)
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_secs(10))
            .acquire(),
    );
    until_queued(&conn, "polled", 1).await;
    let token: String = conn.lindex("distlock:queue:{polled}", 0).await.unwrap();
    let held_token = holder.fencing_token();
    let released = Instant::now();
    holder.release().await.unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    let taken = released.elapsed();
    assert!(
        taken < HANDOFF_CLAIM / 4,
        "the polling waiter got the lock {taken:?} after the release (a claim lapses after \
         {HANDOFF_CLAIM:?})"
    );
    assert_eq!(polling.stats().handed_over, 0, "no message reached it");
    let value: String = conn.get("distlock:lock:{polled}").await.unwrap();
    assert_eq!(
        value,
        format!("~{token}"),
        "still marked for the waiters behind"
    );
    let pttl: i64 = conn.pttl("distlock:lock:{polled}").await.unwrap();
    assert!(pttl > 9_000, "confirmed with its ttl, PTTL {pttl}");
    assert!(lease.fencing_token() > held_token);
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_a_short_presence_behind_one_with_a_long_one_keeps_its_place() {
    // In one process: a fair waiter with a 30 s ttl (presence 60 s) queued first, one with a
    // 1 s ttl (presence 10 s) behind it. The first keeps both queued within the shorter
    // presence: the second's entry is moved on within a third of it.
    let server = RedisServer::start();
    let locks = server.manager();
    let conn = server.client().await;
    let holder = locks
        .lock("mixed-ttl")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let long = distlock_tests::spawn_waiter(&locks, "mixed-ttl", Duration::from_secs(60));
    until_queued(&conn, "mixed-ttl", 1).await;
    let short = tokio::spawn(
        locks
            .lock("mixed-ttl")
            .ttl(Duration::from_secs(1))
            .wait(Duration::from_secs(60))
            .acquire(),
    );
    until_queued(&conn, "mixed-ttl", 2).await;
    let deadline_of = |entries: std::collections::HashMap<String, String>, token: &str| -> u64 {
        entries[token].split(' ').next().unwrap().parse().unwrap()
    };
    let mut c = conn.clone();
    let queue: Vec<String> = c.lrange("distlock:queue:{mixed-ttl}", 0, -1).await.unwrap();
    let second = queue[1].clone();
    let entries: std::collections::HashMap<String, String> =
        c.hgetall("distlock:waiters:{mixed-ttl}").await.unwrap();
    let first_deadline = deadline_of(entries, &second);
    // Its own attempt kept it 10 s; the first waiter keeps it again within 10 s / 3.
    let kept = distlock_tests::eventually(Duration::from_secs(5), || {
        let (mut c, second) = (conn.clone(), second.clone());
        async move {
            let entries: std::collections::HashMap<String, String> =
                c.hgetall("distlock:waiters:{mixed-ttl}").await.unwrap();
            entries.get(&second).is_some_and(|e| {
                e.split(' ').next().and_then(|d| d.parse::<u64>().ok())
                    > Some(first_deadline + 1_000)
            })
        }
    })
    .await;
    assert!(kept.is_some(), "the short waiter's entry was not kept");
    holder.release().await.unwrap();
    long.await
        .unwrap()
        .1
        .expect("the first waiter gets the lock")
        .release()
        .await
        .unwrap();
    short
        .await
        .unwrap()
        .expect("then the second")
        .release()
        .await
        .unwrap();
}
