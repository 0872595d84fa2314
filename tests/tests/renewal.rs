//! Renewal, lease loss and cancellation of `run`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager};
use distlock_tests::{exists, until_exists, until_gone, RedisServer};
use redis::AsyncCommands;

#[tokio::test]
async fn renewal_keeps_a_one_second_lease_for_four_seconds() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let key = locks.redis_key("long-job");
    let mut conn = server.client().await;
    let min_pttl = locks
        .lock("long-job")
        .ttl(Duration::from_secs(1))
        .run(async {
            let mut min_pttl = i64::MAX;
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(4) {
                let pttl: i64 = conn.pttl(&key).await.unwrap();
                min_pttl = min_pttl.min(pttl);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            min_pttl
        })
        .await
        .expect("lease held for the whole body");
    // Renewed every ~333 ms, so it never came near expiry.
    assert!(min_pttl > 400, "lowest PTTL seen {min_pttl} ms");
    let mut conn = server.client().await;
    assert!(!exists(&mut conn, &key).await, "released after the body");
}

#[tokio::test]
async fn an_external_del_stops_the_body_with_lease_lost_within_one_renew_interval() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let key = locks.redis_key("deleted");
    let dropped = distlock_tests::DropClock::default();
    let guard = dropped.guard();
    let run = tokio::spawn(
        locks
            .lock("deleted")
            .ttl(Duration::from_millis(900))
            .run(async move {
                let _guard = guard;
                std::future::pending::<()>().await;
            }),
    );
    let mut conn = server.client().await;
    until_exists(&conn, &key, Duration::from_secs(2))
        .await
        .expect("acquired");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _: () = conn.del(&key).await.unwrap();
    let deleted_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(3), run)
        .await
        .expect("run returned")
        .unwrap();
    let took = deleted_at.elapsed();
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert!(
        took <= Duration::from_millis(300 + 100),
        "LeaseLost after {took:?}"
    );
    // The body itself was stopped, within one renewal interval (300 ms) of the DEL.
    let stopped = dropped.at().expect("the body was dropped");
    assert!(
        stopped - deleted_at <= Duration::from_millis(300 + 100),
        "body dropped {:?} after the DEL",
        stopped - deleted_at
    );
    // Renewal never re-creates the lock it found gone: the key stays gone over several
    // renewal intervals.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!exists(&mut conn, &key).await, "the lock was re-created");
    }
}

#[tokio::test]
async fn without_renewal_an_overrunning_body_is_stopped_at_the_deadline() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let ttl = Duration::from_millis(300);
    let finished = Arc::new(AtomicU64::new(0));
    let body_finished = finished.clone();
    let started = Instant::now();
    let outcome = locks
        .lock("overrun")
        .ttl(ttl)
        .renew(false)
        .run(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            body_finished.store(1, Ordering::SeqCst);
        })
        .await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert!(
        took <= ttl + Duration::from_millis(250),
        "stopped after {took:?}"
    );
    assert!(
        took >= ttl - Duration::from_millis(20),
        "stopped early, after {took:?}"
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn dropping_a_run_future_releases_within_100_ms() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let key = locks.redis_key("cancelled");
    let mut conn = server.client().await;
    let task = tokio::spawn(
        locks
            .lock("cancelled")
            .ttl(Duration::from_secs(30))
            .run(tokio::time::sleep(Duration::from_secs(60))),
    );
    until_exists(&conn, &key, Duration::from_secs(2))
        .await
        .expect("acquired");
    task.abort();
    let released = until_gone(&conn, &key, Duration::from_millis(100)).await;
    assert!(
        released.is_some(),
        "lock still held 100 ms after the run future was dropped"
    );
    assert!(!exists(&mut conn, &key).await);
}

#[tokio::test]
async fn a_panicking_body_still_releases() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let key = locks.redis_key("panics");
    let task = tokio::spawn(locks.lock("panics").run(async {
        tokio::task::yield_now().await;
        panic!("body failed");
    }));
    assert!(task.await.unwrap_err().is_panic());
    let mut conn = server.client().await;
    let released = until_gone(&conn, &key, Duration::from_millis(100)).await;
    assert!(
        released.is_some(),
        "lock still held after the body panicked"
    );
    assert!(!exists(&mut conn, &key).await);
}

/// A manager outlives the runtime its renewal driver ran on (a default manager shared by
/// several `#[tokio::test]`s, say): the next runtime still renews its leases.
#[test]
fn renewal_survives_the_runtime_it_started_on() {
    let server = RedisServer::start();
    let locks = server.manager();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    first.block_on(async {
        // Leaves the driver task parked on this runtime, with a lease still registered.
        std::mem::forget(
            locks
                .lock("first")
                .ttl(Duration::from_secs(5))
                .acquire()
                .await
                .unwrap(),
        );
    });
    drop(first);
    let outcome = runtime().block_on(async {
        locks
            .lock("second")
            .ttl(Duration::from_millis(300))
            .run(tokio::time::sleep(Duration::from_secs(1)))
            .await
    });
    assert!(outcome.is_ok(), "{outcome:?}");
}

#[tokio::test]
async fn a_manual_extend_to_a_shorter_ttl_reschedules_renewal() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let lease = locks
        .lock("shortened")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    lease.extend(Duration::from_millis(600)).await.unwrap();
    // Without rescheduling, the next renewal would come 10 s after acquiring: too late.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!lease.is_lost(), "the lease ran out after a shorter extend");
    let mut conn = server.client().await;
    let pttl: i64 = conn.pttl(locks.redis_key("shortened")).await.unwrap();
    assert!(
        pttl > 0 && pttl <= 600,
        "renewed with the new ttl, PTTL {pttl}"
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn one_broken_lease_in_a_renewal_batch_does_not_lose_the_others() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let ttl = Duration::from_millis(600);
    let (healthy, broken, ()) = tokio::join!(
        locks
            .lock("healthy")
            .ttl(ttl)
            .run(tokio::time::sleep(Duration::from_millis(1500))),
        locks
            .lock("broken")
            .ttl(ttl)
            .run(tokio::time::sleep(Duration::from_millis(1500))),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // Someone overwrites one lock key with a hash: GET on it now fails with WRONGTYPE.
            let key = locks.redis_key("broken");
            let _: () = conn.del(&key).await.unwrap();
            let _: () = conn.hset(&key, "field", "value").await.unwrap();
        }
    );
    assert!(healthy.is_ok(), "{healthy:?}");
    assert!(
        matches!(broken, Err(LockError::LeaseLost { .. })),
        "{broken:?}"
    );
}

#[tokio::test]
async fn a_release_cut_short_still_releases_in_the_background() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server
        .manager_with_timeouts(Duration::from_millis(500))
        .build()
        .unwrap();
    let key = locks.redis_key("cut-short");
    let lease = locks
        .lock("cut-short")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let mut conn = server.client().await;
    // Writes wait on the server: the release is sent, and held there.
    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "10000", "WRITE"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let cut = tokio::time::timeout(Duration::from_millis(100), lease.release()).await;
    assert!(
        cut.is_err(),
        "the release should not have finished while writes were paused"
    );
    // Killing the manager's connection discards the release held on it: only the background
    // release (retried on a fresh connection) can free the key now.
    let _: () = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    // (Checked while writes are still paused: the background release, resent at once on a
    // fresh connection, waits behind the pause too, and may run as soon as it ends.)
    assert!(exists(&mut conn, &key).await, "the cut release never ran");
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let released = until_gone(&conn, &key, Duration::from_secs(5)).await;
    assert!(
        released.is_some(),
        "lock left held after a cancelled release"
    );
}

#[tokio::test]
async fn a_holder_cut_off_from_redis_stops_its_body_before_its_key_can_expire() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let proxy = distlock_tests::Proxy::start(&server).await;
    let timeout = Duration::from_millis(200);
    let holder = distlock_tests::manager_at(&proxy.url(), timeout)
        .build()
        .unwrap();
    distlock_tests::warm_up(&holder).await;
    let rival = server.manager();
    let occupancy = Arc::new(distlock_tests::Occupancy::default());
    let dropped = distlock_tests::DropClock::default();
    let entered = Arc::new(tokio::sync::Notify::new());
    let ttl = Duration::from_secs(3);
    // The acquire request is sent after this: its key expires no earlier than `sent + ttl`.
    let sent = Instant::now();
    let holding = tokio::spawn({
        let (occupancy, guard, entered) = (occupancy.clone(), dropped.guard(), entered.clone());
        holder.lock("cut").ttl(ttl).run(async move {
            let _guard = guard;
            let _inside = occupancy.enter(&["cut"]);
            entered.notify_one();
            tokio::time::sleep(Duration::from_secs(60)).await;
        })
    });
    entered.notified().await;
    // The holder's network is cut: its renewals (due at ttl/3) never get through, while Redis
    // keeps running and expires the key on time. A rival polls with try-locks meanwhile.
    proxy.freeze();
    let acquired_at = loop {
        let attempt = rival
            .try_lock("cut")
            .run({
                let occupancy = occupancy.clone();
                async move {
                    let _inside = occupancy.enter(&["cut"]);
                    Instant::now()
                }
            })
            .await;
        match attempt {
            Ok(at) => break at,
            Err(LockError::NotAcquired { .. }) => {}
            Err(other) => panic!("{other}"),
        }
        assert!(sent.elapsed() < Duration::from_secs(10), "never acquired");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let outcome = holding.await.unwrap();
    proxy.thaw();
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        occupancy.overlaps(),
        0,
        "the rival entered while the body ran"
    );
    let dropped = dropped.at().expect("the body was dropped");
    assert!(
        dropped < sent + ttl,
        "body dropped {:?} after the send, the key may expire at {ttl:?}",
        dropped - sent
    );
    assert!(dropped < acquired_at);
    // The path it took: renewal kept failing until the lease expired.
    assert!(logs.count("lease renewal failed") >= 1, "{}", logs.text());
    assert_eq!(
        logs.count("it expired before a renewal got through"),
        1,
        "{}",
        logs.text()
    );
}

#[tokio::test]
async fn an_extend_never_touches_a_lock_another_owner_holds_marked_as_waited_on() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;

    // A's lease runs out; B takes the lock, and a waiter marks B's value as waited on
    // (`~` and B's token). A, still holding its Lease value, asks for an extension.
    let key = locks.redis_key("marked-extend");
    let (stale, owner) = distlock_tests::outlived(&locks, "marked-extend").await;
    let waiting = distlock_tests::spawn_unfair_waiter(
        &server.manager(),
        "marked-extend",
        Duration::from_secs(10),
    );
    let marked = distlock_tests::until_marked(&conn, &key).await;
    let pttl_before: i64 = conn.pttl(&key).await.unwrap();
    let extended = stale.extend(Duration::from_secs(60)).await;
    // (LeaseLost whatever Redis answers: A's validity ran out. What Redis did is checked next.)
    assert!(
        matches!(extended, Err(LockError::LeaseLost { .. })),
        "{extended:?}"
    );
    let after: Option<String> = conn.get(&key).await.unwrap();
    assert_eq!(after.as_deref(), Some(marked.as_str()));
    let pttl_after: i64 = conn.pttl(&key).await.unwrap();
    assert!(
        pttl_after <= pttl_before && pttl_after > 4_000,
        "PTTL {pttl_before} -> {pttl_after}"
    );
    owner.release().await.unwrap();
    let (_, lease) = waiting.await.unwrap();
    lease.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_renewal_never_touches_a_lock_another_owner_holds_marked_as_waited_on() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    // A body runs under a renewing lease (renewed every 200 ms) when its key is found held by
    // another owner, marked as waited on (set by hand, in one command). Its next renewal must
    // lose the lease, stop the body, and leave the other owner's expiry alone.
    let key = locks.redis_key("marked-renew");
    let dropped = distlock_tests::DropClock::default();
    let guard = dropped.guard();
    let run = tokio::spawn(
        locks
            .lock("marked-renew")
            .ttl(Duration::from_millis(600))
            .run(async move {
                let _guard = guard;
                std::future::pending::<()>().await;
            }),
    );
    until_exists(&conn, &key, Duration::from_secs(2))
        .await
        .expect("acquired");
    let foreign = "~0123456789abcdef0123456789abcdef";
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(foreign)
        .arg("PX")
        .arg(5_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let replaced = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(2), run)
        .await
        .expect("the body ran on under a lease whose lock another owner holds")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    let stopped = dropped.at().expect("the body was dropped");
    assert!(
        stopped - replaced <= Duration::from_millis(200 + 100),
        "body dropped {:?} after its lock was taken",
        stopped - replaced
    );
    let value: Option<String> = conn.get(&key).await.unwrap();
    assert_eq!(value.as_deref(), Some(foreign));
    let pttl: i64 = conn.pttl(&key).await.unwrap();
    assert!(
        pttl > 4_000,
        "a renewal moved the other owner's expiry: PTTL {pttl}"
    );
}

/// A manager that reaches `server` through a proxy handing it every answer `delay` after Redis
/// sent it, with `timeout` for each call; its connection is open and its acquire, release and
/// extension scripts are loaded, so that each later call (a renewal too) is one round trip.
async fn manager_behind_delay(
    server: &RedisServer,
    delay: Duration,
    timeout: Duration,
) -> (distlock_tests::Proxy, LockManager) {
    let proxy = distlock_tests::Proxy::start(server).await;
    proxy.set_mode(distlock_tests::ProxyMode::Delay(delay));
    let locks = distlock_tests::manager_at(&proxy.url(), timeout)
        .build()
        .unwrap();
    let warm = locks.lock("warm-up").acquire().await.unwrap();
    warm.extend(Duration::from_secs(30)).await.unwrap();
    warm.release().await.unwrap();
    (proxy, locks)
}

/// The clock-drift margin the docs promise a lease's validity leaves out: 1% of `ttl` + 2 ms,
/// worked out here rather than by the runtime's own function.
fn drift_margin(ttl: Duration) -> Duration {
    Duration::from_micros(u64::try_from(ttl.as_micros() / 100).unwrap() + 2_000)
}

#[tokio::test]
async fn a_fresh_lease_is_valid_for_its_ttl_less_the_drift_margin_at_most() {
    let server = RedisServer::start();
    let locks = server.manager();
    distlock_tests::warm_up(&locks).await;
    // Acquired, and extended: each time the validity is the ttl less 1% and 2 ms (102 ms of
    // 10 s, 202 ms of 20 s), counted from before the request, so at most that right after it.
    let ttl = Duration::from_secs(10);
    let lease = locks
        .lock("margin")
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let remaining = lease.remaining();
    let most = ttl - drift_margin(ttl);
    assert_eq!(most, Duration::from_millis(9_898));
    assert!(
        remaining <= most && remaining > most - Duration::from_millis(500),
        "remaining {remaining:?} right after acquiring for {ttl:?} (at most {most:?})"
    );
    let ttl = Duration::from_secs(20);
    lease.extend(ttl).await.unwrap();
    let remaining = lease.remaining();
    let most = ttl - drift_margin(ttl);
    assert!(
        remaining <= most && remaining > most - Duration::from_millis(500),
        "remaining {remaining:?} right after extending to {ttl:?} (at most {most:?})"
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_lease_is_valid_from_before_its_request_was_sent_not_from_when_the_answer_came() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    // Every answer reaches the manager 300 ms after Redis sent it: each lease's expiry was set
    // in Redis at least 300 ms before its holder learns of it.
    let delay = Duration::from_millis(300);
    let (_proxy, locks) = manager_behind_delay(&server, delay, Duration::from_secs(2)).await;

    let ttl = Duration::from_secs(2);
    let lease = locks
        .lock("slow-answer")
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let remaining = lease.remaining();
    let most = ttl - delay - drift_margin(ttl);
    assert!(
        remaining <= most && remaining > most - delay,
        "remaining {remaining:?} after an answer that took {delay:?} (at most {most:?})"
    );
    lease.release().await.unwrap();

    // Without renewal, the body is stopped when the validity counted from the send ends, not
    // that long after the answer came.
    let ttl = Duration::from_secs(1);
    let dropped = distlock_tests::DropClock::default();
    let guard = dropped.guard();
    let before_send = Instant::now();
    let outcome = locks
        .lock("slow-answer")
        .ttl(ttl)
        .renew(false)
        .run(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        })
        .await;
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    let stopped = dropped.at().expect("the body was dropped") - before_send;
    let deadline = ttl - drift_margin(ttl);
    assert!(
        stopped >= delay && stopped <= deadline + Duration::from_millis(100),
        "body dropped {stopped:?} after the send (validity from the send: {deadline:?}; the \
         answer came {delay:?} after it)"
    );
}

/// Renewals and an explicit `extend` count the new validity from before their request was sent,
/// as the acquire does: behind answers 300 ms late, a lease renewed in the background (and
/// right after an `extend`) is never valid for more than its ttl less those 300 ms and the
/// drift margin. Counted from the answer instead, it would be 300 ms longer after each one.
#[tokio::test]
async fn a_renewed_or_extended_lease_is_valid_from_before_its_request_was_sent() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let delay = Duration::from_millis(300);
    let (_proxy, locks) = manager_behind_delay(&server, delay, Duration::from_secs(2)).await;

    // Renewed every 500 ms (a third of the ttl), each renewal answered 300 ms after it left.
    let ttl = Duration::from_millis(1_500);
    let most = ttl - delay - drift_margin(ttl);
    let lease = locks.lock("renewed-late").ttl(ttl).acquire().await.unwrap();
    let (highest, renewals) = sample_remaining(&lease, Duration::from_secs(2)).await;
    assert!(
        renewals >= 2,
        "{renewals} renewals seen in 2 s (every {:?} expected)",
        ttl / 3
    );
    assert!(
        highest <= most,
        "remaining {highest:?} after a renewal answered {delay:?} after it was sent (at most \
         {most:?} for a {ttl:?} ttl)"
    );

    // An explicit extend, then the renewals at its new ttl.
    let ttl = Duration::from_millis(2_400);
    let most = ttl - delay - drift_margin(ttl);
    lease.extend(ttl).await.unwrap();
    let remaining = lease.remaining();
    assert!(
        remaining <= most,
        "remaining {remaining:?} right after an extend to {ttl:?} answered {delay:?} after it \
         was sent (at most {most:?})"
    );
    let (highest, renewals) = sample_remaining(&lease, Duration::from_millis(1_200)).await;
    assert!(renewals >= 1, "no renewal seen in 1.2 s at a {ttl:?} ttl");
    assert!(
        highest <= most,
        "remaining {highest:?} after a renewal answered {delay:?} after it was sent (at most \
         {most:?} for a {ttl:?} ttl)"
    );
    assert!(!lease.is_lost());
    lease.release().await.unwrap();
}

/// Reads `lease.remaining()` every 5 ms for `during`: the highest value read, and how many
/// times it went up (a renewal answered).
async fn sample_remaining(lease: &distlock_runtime::Lease, during: Duration) -> (Duration, usize) {
    let started = Instant::now();
    let mut last = lease.remaining();
    let (mut highest, mut renewals) = (last, 0);
    while started.elapsed() < during {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let remaining = lease.remaining();
        highest = highest.max(remaining);
        if remaining > last {
            renewals += 1;
        }
        last = remaining;
    }
    (highest, renewals)
}

#[tokio::test]
async fn a_lease_that_expired_before_its_renewal_was_answered_is_renewed_no_more() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    // Every answer comes 700 ms late: the acquire's within the lease's validity (988 ms of a
    // 1 s ttl), the answer to the renewal sent on receiving it only after that validity ended.
    let delay = Duration::from_millis(700);
    let (_proxy, locks) = manager_behind_delay(&server, delay, Duration::from_secs(3)).await;
    let key = locks.redis_key("answered-late");
    let conn = server.client().await;
    let lease = locks
        .lock("answered-late")
        .ttl(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("lost when its validity ran out");
    // The lease is held, not dropped (which would release it): only a renewal could keep its
    // key, and a lost lease is renewed no more, so the key expires by the ttl of the last one.
    let gone = until_gone(&conn, &key, Duration::from_secs(3)).await;
    assert!(gone.is_some(), "a lost lease's renewals kept its key alive");
    assert_eq!(
        logs.count("it expired before its renewal was answered"),
        1,
        "{}",
        logs.text()
    );
    drop(lease);
}

#[tokio::test]
async fn a_stopped_body_is_logged_with_why_its_lease_was_lost() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let locks = server.manager();
    // Without renewal, its ttl passed.
    let outcome = locks
        .lock("unrenewed")
        .ttl(Duration::from_millis(100))
        .renew(false)
        .run(std::future::pending::<()>())
        .await;
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        logs.count(
            "lost: it reached its ttl without renewal (renew = false); the body was stopped"
        ),
        1,
        "{}",
        logs.text()
    );
    // Renewed, but its key was deleted by someone else.
    let key = locks.redis_key("deleted-under-it");
    let mut conn = server.client().await;
    let run = tokio::spawn(
        locks
            .lock("deleted-under-it")
            .ttl(Duration::from_millis(300))
            .run(std::future::pending::<()>()),
    );
    until_exists(&conn, &key, Duration::from_secs(2))
        .await
        .expect("acquired");
    let _: () = conn.del(&key).await.unwrap();
    let outcome = run.await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        logs.count("deleted or taken by another owner; the body was stopped"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(
        logs.count("before a renewal got through"),
        0,
        "{}",
        logs.text()
    );
}

#[tokio::test]
async fn renewals_sent_late_are_reported_together_and_on_time_ones_never() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let locks = server.manager();
    distlock_tests::warm_up(&locks).await;
    let ttl = Duration::from_millis(600);
    // Renewed every 200 ms, on time.
    let on_time = locks
        .lock("on-time")
        .ttl(ttl)
        .run(tokio::time::sleep(Duration::from_secs(1)))
        .await;
    assert!(on_time.is_ok(), "{on_time:?}");
    assert_eq!(logs.count("renewed late"), 0, "{}", logs.text());
    // An overloaded process: this thread, which runs the renewal driver (a current-thread
    // runtime), is blocked from before two leases' first renewal (due 200 ms after their
    // acquire) until 250 ms after it, more than half a renewal interval late.
    let first = locks.lock("late-1").ttl(ttl).acquire().await.unwrap();
    let second = locks.lock("late-2").ttl(ttl).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    std::thread::sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!first.is_lost() && !second.is_lost(), "renewed in time");
    assert_eq!(
        logs.count("distlock leases renewed late"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(logs.count("leases=2"), 1, "{}", logs.text());
    first.release().await.unwrap();
    second.release().await.unwrap();
}

#[tokio::test]
async fn leases_due_together_are_renewed_by_one_call() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    distlock_tests::warm_up(&locks).await;
    // Three leases taken 20 ms apart, renewed every 200 ms: the first renewal, a third of the
    // ttl after the first acquire, takes all three (each may go up to a quarter interval
    // early), and so does every one after it.
    let ttl = Duration::from_millis(600);
    let before = server.script_calls();
    let mut leases = Vec::new();
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        leases.push(
            locks
                .lock(format!("batched-{i}"))
                .ttl(ttl)
                .acquire()
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(260)).await;
    let first = server.script_calls() - before;
    assert_eq!(first, 3 + 1, "three acquires and one renewal");
    // Four more rounds (at 400, 600, 800 and 1000 ms), one call each.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let later = server.script_calls() - before - first;
    assert!((3..=5).contains(&later), "{later} calls for 4 renewals");
    for lease in leases {
        lease.release().await.unwrap();
    }
}

#[tokio::test]
async fn renewal_working_again_after_failures_is_logged_once() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let mut server = RedisServer::start();
    let locks = server
        .manager_with_timeouts(Duration::from_millis(200))
        .build()
        .unwrap();
    distlock_tests::warm_up(&locks).await;
    // Renewed every 500 ms; Redis hangs across the first renewal, then answers again well
    // within the lease's validity.
    let lease = locks
        .lock("flapping")
        .ttl(Duration::from_millis(1500))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.pause();
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.resume();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!lease.is_lost(), "{}", logs.text());
    assert_eq!(
        logs.count("distlock lease renewal failed"),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(
        logs.count("distlock lease renewal works again"),
        1,
        "{}",
        logs.text()
    );
    lease.release().await.unwrap();
}

/// CPU time this thread has used so far (Linux: utime + stime of `/proc/thread-self/stat`, in
/// ticks of 10 ms).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

#[tokio::test]
async fn a_renewal_driver_without_leases_sleeps_until_it_stops() {
    let server = RedisServer::start();
    let locks = server.manager();
    // One lease cycle starts the driver (on this thread: a current-thread runtime); then it
    // has no lease to renew, and waits to stop.
    distlock_tests::warm_up(&locks).await;
    let before = thread_cpu();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let used = thread_cpu() - before;
    assert!(
        used <= Duration::from_millis(100),
        "{used:?} of CPU in 500 ms without leases"
    );
}

#[tokio::test]
async fn a_lease_whose_renewal_keeps_failing_is_lost_at_its_validity_and_said_once() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let mut server = RedisServer::start();
    let locks = server
        .manager_with_timeouts(Duration::from_millis(100))
        .build()
        .unwrap();
    distlock_tests::warm_up(&locks).await;
    let lease = locks
        .lock("failing")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    // Every renewal, from the first (200 ms in), times out on the hung server.
    server.pause();
    tokio::time::timeout(Duration::from_secs(1), lease.lost())
        .await
        .expect("lost by its validity");
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.resume();
    assert_eq!(
        logs.count("distlock lease lost: renewal kept failing until the lease expired"),
        1,
        "{}",
        logs.text()
    );
    drop(lease);
}

#[tokio::test]
async fn a_released_lease_is_renewed_no_more() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let locks = server.manager();
    distlock_tests::warm_up(&locks).await;
    // Due for renewal every 100 ms, released before the first.
    let lease = locks
        .lock("released")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    lease.release().await.unwrap();
    let before = server.script_calls();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        server.script_calls() - before,
        0,
        "renewal calls after the release"
    );
    assert_eq!(logs.count("lease lost"), 0, "{}", logs.text());
}
