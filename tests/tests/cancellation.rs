//! Cancellation at every point: a waiter or caller whose future is dropped (a `select!` that
//! took another branch, an aborted task, a client that hung up) never takes with it what it
//! was given or may have taken: a release notification goes to the next waiter, a handed-over
//! lock to the next fair waiter, and a lock its request may have taken is released.

use std::time::{Duration, Instant};

use distlock_runtime::{Lease, LockError, LockManager, LockRequest};
use distlock_tests::{
    exists, queued, until_attempts, until_gone, until_queued, until_subscribed, warm_up, Proxy,
    ProxyMode, RedisServer, Tripwire, TripwireHandle,
};
use futures_util::StreamExt;
use tokio::task::JoinHandle;

/// Subscribes to `channel` and forwards the payload of every message published on it.
async fn messages(
    server: &RedisServer,
    channel: &str,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let mut pubsub = redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe(channel).await.unwrap();
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = pubsub.into_on_message();
        while let Some(message) = stream.next().await {
            if sender.send(message.get_payload().unwrap()).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Waits (at most `within`) for the next message.
async fn next_message(
    messages: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    within: Duration,
) -> Option<String> {
    tokio::time::timeout(within, messages.recv())
        .await
        .ok()
        .flatten()
}

/// A waiter racing a tripwire: once armed, the tripwire drops it at its task's next wake-up
/// (a notification or hand-off), before it acts on what woke it. `None` when dropped so.
fn first_waiter(request: LockRequest) -> (JoinHandle<Option<Acquired>>, TripwireHandle) {
    let (tripwire, trip) = Tripwire::new();
    let waiter = tokio::spawn(async move {
        tokio::select! {
            biased;
            () = tripwire => None,
            lease = request.acquire() => Some(lease),
        }
    });
    (waiter, trip)
}

/// What an acquire returned.
type Acquired = Result<Lease, LockError>;

/// A waiter that says when it got the lock.
fn second_waiter(request: LockRequest) -> JoinHandle<(Acquired, Instant)> {
    tokio::spawn(async move {
        let lease = request.acquire().await;
        (lease, Instant::now())
    })
}

/// Arms the first waiter's tripwire, releases `held`, checks that the first waiter was dropped
/// by what the release sent it, and returns the second waiter's lease and how long after the
/// release it got it.
async fn release_past_the_first(
    held: Lease,
    (first, trip): (JoinHandle<Option<Acquired>>, TripwireHandle),
    second: JoinHandle<(Acquired, Instant)>,
) -> (Lease, Duration) {
    trip.arm().await;
    assert!(
        !first.is_finished(),
        "only what the release sends wakes the first waiter"
    );
    let released = Instant::now();
    held.release().await.unwrap();
    let first = first.await.unwrap();
    assert!(first.is_none(), "{first:?}");
    assert!(trip.fired());
    let (lease, acquired) = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second waiter got the lock the first one was sent")
        .unwrap();
    (lease.unwrap(), acquired - released)
}

#[tokio::test]
async fn an_unfair_waiter_cancelled_with_an_unused_notification_passes_it_on() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let holder = server.manager();
    let locks = server.manager();
    warm_up(&holder).await;
    warm_up(&locks).await;
    let conn = server.client().await;
    let held = holder
        .lock("notified")
        .ttl(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let wait = Duration::from_secs(20);
    // The manager's first waiter is the one a release notification wakes.
    let first = first_waiter(locks.lock("notified").fair(false).wait(wait));
    // Its attempt, then another once it subscribed: it sleeps until a notification.
    until_subscribed(&conn, "notified").await;
    until_attempts(&locks, 3).await;
    let second = second_waiter(locks.lock("notified").fair(false).wait(wait));
    until_attempts(&locks, 4).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let (lease, after) = release_past_the_first(held, first, second).await;
    // The holder's lease had 30 s left: without the notification the second waiter would
    // sleep until then (or its deadline).
    assert!(after < Duration::from_secs(5), "{after:?}");
    // The first waiter was dropped before it acted on its notification: only the second one
    // tried again.
    assert_eq!(locks.stats().acquire_requests, 5);
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cancelled_at_any_moment_after_a_release_never_strand_the_next_one() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let holder = server.manager();
    // The waiters' requests and notifications are answered 20 ms late, so a cancellation
    // 0 to 60 ms after the release lands in every phase as often: before the notification,
    // while the retry is out, after the retry took the lock.
    let proxy = Proxy::start(&server).await;
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(20)));
    let locks = LockManager::builder().url(proxy.url()).build().unwrap();
    warm_up(&holder).await;
    warm_up(&locks).await;
    let conn = server.client().await;
    for round in 0..20 {
        let held = holder
            .lock("any-moment")
            .ttl(Duration::from_secs(30))
            .renew(false)
            .acquire()
            .await
            .unwrap();
        let first = tokio::spawn({
            let locks = locks.clone();
            async move {
                let lease = locks
                    .lock("any-moment")
                    .wait(Duration::from_secs(20))
                    .acquire()
                    .await;
                // Held until cancelled, if it got the lock first.
                std::future::pending::<()>().await;
                drop(lease);
            }
        });
        until_subscribed(&conn, "any-moment").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let second = second_waiter(locks.lock("any-moment").wait(Duration::from_secs(20)));
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        let cancel_after = Duration::from_micros(fastrand::u64(0..60_000));
        tokio::time::sleep(cancel_after).await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        let lease = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .unwrap_or_else(|_| {
                panic!("round {round}: the second waiter was stranded by the first, cancelled {cancel_after:?} after the release")
            })
            .unwrap();
        lease.0.unwrap().release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_cancelled_after_the_hand_off_passes_the_lock_on() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let holder = server.manager();
    let locks = server.manager();
    warm_up(&holder).await;
    warm_up(&locks).await;
    let mut conn = server.client().await;
    let held = holder
        .lock("handed")
        .fair(true)
        .ttl(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let wait = Duration::from_secs(20);
    // The head of the queue is the one the release hands the lock to.
    let first = first_waiter(locks.lock("handed").fair(true).wait(wait));
    until_queued(&conn, "handed", 1).await;
    until_subscribed(&conn, "handed").await;
    until_attempts(&locks, 3).await;
    let second = second_waiter(locks.lock("handed").fair(true).wait(wait));
    until_queued(&conn, "handed", 2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut handoffs = messages(&server, &locks.redis_key("handed")).await;

    let (lease, after) = release_past_the_first(held, first, second).await;
    // Passed on at once, not after the first waiter's claim lapsed (2 s, and a quarter more
    // for the watcher), let alone the 30 s ttl.
    assert!(after < Duration::from_secs(1), "{after:?}");
    // Two hand-offs: to the first waiter, then, from its background release, to the second,
    // which took it as a hand-off; the first never acted on its own.
    let recipient = |message: Option<String>| {
        let message = message.expect("a hand-off message");
        assert!(message.starts_with("h "), "{message:?}");
        message.split(' ').nth(1).unwrap().to_owned()
    };
    let to_first = recipient(next_message(&mut handoffs, Duration::from_secs(1)).await);
    let to_second = recipient(next_message(&mut handoffs, Duration::from_secs(1)).await);
    assert_ne!(to_first, to_second);
    assert_eq!(locks.stats().handed_over, 1);
    lease.release().await.unwrap();
    // Nobody holds it, nobody is queued.
    assert!(!exists(&mut conn, &locks.redis_key("handed")).await);
    assert_eq!(queued(&mut conn, "handed").await, 0);
}

#[tokio::test]
async fn an_acquire_cancelled_in_flight_is_undone_once_redis_answers() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = server.manager();
    warm_up(&locks).await;
    let key = locks.redis_key("in-flight");
    // Keyspace events of the lock key: `set` when a request takes it, `del` when a release
    // deletes it.
    server.command(&["CONFIG", "SET", "notify-keyspace-events", "K$g"]);
    let mut events = messages(&server, &format!("__keyspace@0__:{key}")).await;
    let conn = server.client().await;

    server.pause();
    let task = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("in-flight")
                .ttl(Duration::from_secs(30))
                .acquire()
                .await
        }
    });
    until_attempts(&locks, 2).await;
    // Long enough for the request to be written to the socket of the paused server.
    tokio::time::sleep(Duration::from_millis(100)).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    server.resume();
    let resumed = Instant::now();

    // The cancelled request reached Redis and took the lock ...
    let mut seen = Vec::new();
    while let Some(event) = next_message(&mut events, Duration::from_secs(5)).await {
        seen.push(event.clone());
        if event == "del" {
            break;
        }
    }
    assert!(
        seen.first().is_some_and(|e| e == "set"),
        "the cancelled acquire took the lock first: {seen:?}"
    );
    // ... and the in-doubt release deleted it, long before its 30 s ttl.
    assert_eq!(seen.last().map(String::as_str), Some("del"), "{seen:?}");
    assert!(
        resumed.elapsed() < Duration::from_secs(5),
        "{:?}",
        resumed.elapsed()
    );
    assert!(until_gone(&conn, &key, Duration::from_millis(100))
        .await
        .is_some());
}

/// Cancels `request` while its acquire request waits on the paused `server`, resumes it, and
/// returns how many script calls it ran until the background release ended.
async fn script_calls_of_a_cancelled_acquire(
    server: &mut RedisServer,
    locks: &LockManager,
    request: LockRequest,
) -> u64 {
    let before = server.script_calls();
    let attempts = locks.stats().acquire_requests;
    server.pause();
    let task = tokio::spawn(request.wait(Duration::from_secs(30)).acquire());
    until_attempts(locks, attempts + 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(locks.stats().background_releases, 1);
    server.resume();
    let ended = distlock_tests::eventually(Duration::from_secs(5), || async {
        locks.stats().background_releases == 0
    })
    .await;
    assert!(ended.is_some(), "the background release never ended");
    server.script_calls() - before
}

#[tokio::test]
async fn an_acquire_cancelled_in_flight_is_released_again_while_it_may_still_run_late() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = distlock_tests::Logs::capture();
    let mut server = RedisServer::start();
    // Cancelled well within the response timeout: the release follows the acquire on its
    // connection, so it finds whatever the acquire took.
    let locks = server
        .manager_with_timeouts(Duration::from_millis(400))
        .build()
        .unwrap();
    // Both acquire scripts loaded: an acquire answered NOSCRIPT would have taken nothing.
    warm_up(&locks).await;
    let warm = locks.lock("warm-up").fair(false).acquire().await.unwrap();
    warm.release().await.unwrap();
    let mut conn = server.client().await;
    // The acquire took the lock: one release, which found it, is enough.
    let calls =
        script_calls_of_a_cancelled_acquire(&mut server, &locks, locks.lock("free").fair(false))
            .await;
    assert_eq!(calls, 2, "the acquire and one release");
    assert!(!exists(&mut conn, &locks.redis_key("free")).await);
    // So for several keys: the release counts every key it found.
    let both = locks.lock_all(["both-a", "both-b"]);
    let calls = script_calls_of_a_cancelled_acquire(&mut server, &locks, both).await;
    assert_eq!(calls, 2, "the acquire and one release");
    // Another owner holds the key: the release finds nothing, and is repeated twice, a response
    // timeout apart, in case the acquire request still runs late; then it ends.
    server.command(&[
        "SET",
        &locks.redis_key("held"),
        "another-owner",
        "PX",
        "30000",
    ]);
    let calls =
        script_calls_of_a_cancelled_acquire(&mut server, &locks, locks.lock("held").fair(false))
            .await;
    assert_eq!(calls, 4, "the acquire and three releases");
    // A fair acquire could queue again or be handed the key whatever the release found: its
    // release is repeated twice even after it found the key.
    let calls =
        script_calls_of_a_cancelled_acquire(&mut server, &locks, locks.lock("fair").fair(true))
            .await;
    assert_eq!(calls, 4, "the acquire and three releases");
    assert!(!exists(&mut conn, &locks.redis_key("fair")).await);
    // Each is logged (at debug level); a lease dropped instead of released, the usual case,
    // is not.
    let undone = logs.count("distlock releasing in the background");
    assert_eq!(undone, 4, "{}", logs.text());
    drop(locks.lock("dropped").acquire().await.unwrap());
    let key = locks.redis_key("dropped");
    assert!(until_gone(&conn, &key, Duration::from_secs(2))
        .await
        .is_some());
    assert_eq!(logs.count("distlock releasing in the background"), undone);
}
