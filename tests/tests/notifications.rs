//! Waiters are woken by release notifications (one subscriber connection per manager), not by
//! polling, and a missed or lost notification never leaves a waiter stuck.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_runtime::LockError;
use distlock_tests::{warm_up, RedisServer};

/// Subscriber (pub/sub) connections the server has.
fn subscriber_connections(server: &RedisServer) -> usize {
    server
        .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .lines()
        .filter(|line| line.contains("addr="))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_the_subscription_is_never_missed() {
    release_racing_the_subscription(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_hand_off_racing_the_subscription_is_never_missed() {
    release_racing_the_subscription(true).await;
}

async fn release_racing_the_subscription(fair: bool) {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let holder = server.manager();
    let waiter = server.manager();
    warm_up(&holder).await;
    warm_up(&waiter).await;
    for round in 0..1000u32 {
        // A long ttl: only a notification (or the deadline) can wake the waiter in time.
        let lease = holder
            .lock("race")
            .ttl(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                let lease = waiter
                    .lock("race")
                    .fair(fair)
                    .wait(Duration::from_secs(2))
                    .acquire()
                    .await;
                (Instant::now(), lease)
            }
        });
        // Release at varying moments: before, during and after the waiter subscribes.
        if round % 4 != 0 {
            tokio::time::sleep(Duration::from_micros(u64::from(round % 7) * 300)).await;
        }
        let released_at = Instant::now();
        lease.release().await.unwrap();
        let (acquired_at, lease) = waiting.await.unwrap();
        lease
            .expect("the waiter got the lock")
            .release()
            .await
            .unwrap();
        let late = acquired_at.saturating_duration_since(released_at);
        assert!(
            late <= Duration::from_secs(1),
            "round {round}: the waiter slept {late:?} past the release"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_recover_when_the_subscriber_connection_is_killed() {
    subscriber_connection_killed(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_recover_when_the_subscriber_connection_is_killed() {
    subscriber_connection_killed(true).await;
}

async fn subscriber_connection_killed(fair: bool) {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let lease = locks
        .lock("killed-sub")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for _ in 0..50 {
        let locks = locks.clone();
        waiters.push(tokio::spawn(async move {
            locks
                .lock("killed-sub")
                .fair(fair)
                .wait(Duration::from_secs(20))
                .run(tokio::time::sleep(Duration::from_millis(2)))
                .await
        }));
    }
    // Let them all subscribe, then cut the subscriber connection.
    let deadline = Instant::now() + Duration::from_secs(5);
    while subscriber_connections(&server) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(subscriber_connections(&server), 1);
    server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    lease.release().await.unwrap();
    let started = Instant::now();
    for waiter in waiters {
        waiter.await.unwrap().expect("every waiter acquired");
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_waiters_all_acquire_through_one_subscriber_connection() {
    five_hundred_waiters(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_fair_waiters_all_acquire_through_one_subscriber_connection() {
    five_hundred_waiters(true).await;
}

async fn five_hundred_waiters(fair: bool) {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for _ in 0..500 {
        let (locks, inside) = (locks.clone(), inside.clone());
        waiters.push(tokio::spawn(async move {
            locks
                .lock("crowded")
                .fair(fair)
                .wait(Duration::from_secs(10))
                .run(async move {
                    inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::task::yield_now().await;
                })
                .await
        }));
    }
    let mut most_subscribers = 0;
    let mut timeouts = 0;
    for waiter in waiters {
        most_subscribers = most_subscribers.max(subscriber_connections(&server));
        if waiter.await.unwrap().is_err() {
            timeouts += 1;
        }
    }
    assert_eq!(timeouts, 0, "every waiter acquires within its 10 s wait");
    assert_eq!(inside.load(std::sync::atomic::Ordering::SeqCst), 500);
    assert!(
        most_subscribers <= 1,
        "{most_subscribers} subscriber connections"
    );
}

/// Connections whose last command was SUBSCRIBE or UNSUBSCRIBE: subscriber connections, also
/// when they are subscribed to nothing any more.
fn subscriber_sockets(server: &RedisServer) -> usize {
    server
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.contains("cmd=subscribe") || line.contains("cmd=unsubscribe"))
        .count()
}

#[tokio::test]
async fn dropping_the_manager_closes_its_subscriber_connection() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let holder = server.manager();
    let lease = holder.lock("gone").acquire().await.unwrap();
    let locks = server.manager();
    // A waiter makes `locks` open its subscriber connection; it unsubscribes when it gives up.
    let outcome = locks
        .lock("gone")
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(
        matches!(outcome, Err(distlock_runtime::LockError::Timeout { .. })),
        "{outcome:?}"
    );
    // The holder's own listens for forced releases while it holds a lease.
    assert_eq!(subscriber_sockets(&server), 2);
    let until_sockets = |n: usize| {
        let server = &server;
        async move {
            let deadline = Instant::now() + Duration::from_secs(2);
            while subscriber_sockets(server) > n && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(
                subscriber_sockets(server),
                n,
                "the subscriber connection outlived its manager"
            );
        }
    };
    drop(locks);
    until_sockets(1).await;
    // A manager dropped while its renewal driver still runs (it stops 5 s after the last
    // lease) closes its connection too.
    lease.release().await.unwrap();
    drop(holder);
    until_sockets(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_taking_turns_on_a_key_are_never_left_waiting_for_its_ttl() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    // Each release unsubscribes the key once its last waiter is served, and the other task
    // subscribes it again when it waits next: a waiter must never count on a subscription that
    // is being removed (a release in between would reach nobody until the holder's 30 s ttl).
    let turns = |locks: distlock_runtime::LockManager| async move {
        let mut longest = Duration::ZERO;
        for _ in 0..300 {
            let started = Instant::now();
            let lease = locks
                .lock("turns")
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            longest = longest.max(started.elapsed());
            lease.release().await.unwrap();
        }
        longest
    };
    let (a, b) = tokio::join!(
        tokio::spawn(turns(locks.clone())),
        tokio::spawn(turns(locks.clone()))
    );
    let longest = a.unwrap().max(b.unwrap());
    assert!(longest < Duration::from_secs(2), "a wait took {longest:?}");
}

#[tokio::test]
async fn a_waiter_never_counts_on_a_subscription_being_removed() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let proxy = distlock_tests::Proxy::start(&server).await;
    let locks = distlock_runtime::LockManager::from_url(&proxy.url()).unwrap();
    let other = server.manager();
    warm_up(&locks).await;
    // The subscriber connection's answers (and messages) arrive 200 ms late: an UNSUBSCRIBE
    // is applied long before distlock hears it was.
    proxy.set_mode(distlock_tests::ProxyMode::Delay(Duration::from_millis(200)));
    let held = other.lock("k").acquire().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("k").wait(Duration::from_secs(5)).acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    held.release().await.unwrap();
    // The waiter's ticket goes with it: its key is unsubscribed (answer due in 200 ms). Its
    // own release comes once the UNSUBSCRIBE is applied, so no late message wakes anybody.
    let lease = waiter.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    lease.release().await.unwrap();
    let held = other.lock("k").acquire().await.unwrap();
    let started = Instant::now();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("k").wait(Duration::from_secs(5)).acquire().await }
    });
    // Released after the UNSUBSCRIBE was applied, before a new SUBSCRIBE could be: this
    // release reaches nobody, so the waiter must not be sleeping on the old subscription.
    tokio::time::sleep(Duration::from_millis(30)).await;
    held.release().await.unwrap();
    let lease = waiter
        .await
        .unwrap()
        .expect("acquired long before the wait ran out");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    lease.release().await.unwrap();
}

/// A release wakes only the oldest waiter of the key in each process; the others sleep on. When
/// that waiter takes the lock, the others still wait, so its release must be announced too: a
/// waiter that had to wait takes the key marked as waited on. Without that, the second waiter
/// would sleep until the first holder's 30 s expiry and time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_left_asleep_while_another_took_the_lock_is_woken_by_that_release() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let conn = server.client().await;
    let held = locks
        .lock("relay")
        .fair(false)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // Requests so far: the warm-up's and the holder's.
    let first = distlock_tests::spawn_unfair_waiter(&locks, "relay", Duration::from_secs(10));
    distlock_tests::until_subscribed(&conn, "relay").await;
    // The first waiter's two attempts (held, then once more once subscribed).
    distlock_tests::until_attempts(&locks, 4).await;
    let second = distlock_tests::spawn_unfair_waiter(&locks, "relay", Duration::from_secs(10));
    // The second waiter's attempt, which found the key held (and answered: a little more).
    distlock_tests::until_attempts(&locks, 5).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    held.release().await.unwrap();
    let (_, lease) = first.await.unwrap();
    let lease = lease.expect("the oldest waiter is woken by the release");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    let (acquired, lease) = second.await.unwrap();
    let lease = lease.expect("the second waiter is woken by the first waiter's release");
    let after = acquired.duration_since(released);
    assert!(
        after < Duration::from_secs(1),
        "woken {after:?} after the release"
    );
    lease.release().await.unwrap();
}

/// A lock nobody waited for is released without an announcement (a `GET` and a `DEL`); one
/// somebody waits for announces its release, and inspection still names its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_somebody_waits_for_is_announced() {
    use futures_util::StreamExt;
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server
        .manager_builder()
        .holder_label("api-7")
        .build()
        .unwrap();
    warm_up(&locks).await;
    let mut pubsub = redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe(locks.redis_key("quiet")).await.unwrap();
    let mut messages = pubsub.into_on_message();

    distlock_tests::lock_once(&locks, "quiet").await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), messages.next())
            .await
            .is_err(),
        "a release nobody waited for announced itself"
    );
    // Nor does a try-lock that found the key held wait for it.
    let other = server.manager();
    warm_up(&other).await;
    for fair in [false, true] {
        let held = locks.lock("quiet").acquire().await.unwrap();
        let tried = other
            .lock("quiet")
            .fair(fair)
            .wait(Duration::ZERO)
            .acquire()
            .await;
        assert!(
            matches!(tried, Err(LockError::NotAcquired { .. })),
            "{tried:?}"
        );
        held.release().await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), messages.next())
                .await
                .is_err(),
            "a release only tried for (fair: {fair}) announced itself"
        );
    }

    let held = locks
        .lock("quiet")
        .fair(false)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = distlock_tests::spawn_unfair_waiter(&other, "quiet", Duration::from_secs(10));
    // The waiter's two attempts (held, then once more once subscribed), and their answers.
    distlock_tests::until_attempts(&other, 5).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let info = locks.inspect("quiet").await.unwrap().expect("held");
    assert_eq!(info.holder.as_deref(), Some("api-7"));
    assert!(
        info.token_prefix.chars().all(|c| c.is_ascii_hexdigit()),
        "{:?}",
        info.token_prefix
    );
    held.release().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(1), messages.next()).await;
    assert!(
        matches!(message, Ok(Some(_))),
        "the release the waiter waited for was announced"
    );
    let (_, lease) = waiter.await.unwrap();
    lease.unwrap().release().await.unwrap();
}

/// A waiter that takes a release announcement and then waits for another key (a request for
/// several keys, finding the next one held) passes the announcement on: the younger waiter of
/// the released key in its process takes it at once, instead of sleeping until the first
/// holder's 30 s expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_moves_on_to_another_key_passes_the_release_announcement_on() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let (locks, other) = (server.manager(), server.manager());
    warm_up(&locks).await;
    let conn = server.client().await;
    let first_key = other
        .lock("first")
        .fair(false)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let second_key = other
        .lock("second")
        .fair(false)
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let both = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock_all(["first", "second"])
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });
    distlock_tests::until_subscribed(&conn, "first").await;
    // The warm-up's request and the two of the waiter for both keys.
    distlock_tests::until_attempts(&locks, 3).await;
    let younger = distlock_tests::spawn_unfair_waiter(&locks, "first", Duration::from_secs(10));
    distlock_tests::until_attempts(&locks, 4).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    first_key.release().await.unwrap();
    let (acquired, lease) = younger.await.unwrap();
    let lease = lease.expect("the younger waiter gets the released key");
    let after = acquired.duration_since(released);
    assert!(
        after < Duration::from_secs(1),
        "woken {after:?} after the release"
    );
    lease.release().await.unwrap();
    second_key.release().await.unwrap();
    both.await
        .unwrap()
        .expect("the waiter for both keys gets them")
        .release()
        .await
        .unwrap();
}
