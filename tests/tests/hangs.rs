//! Never a hang, for every operation: against a paused Redis (SIGSTOP: connections stay open,
//! nothing is answered) each call ends with an error within the manager's timeouts; a killed
//! connection, a restart and a flushed script cache cost at most a retry.

use std::future::Future;
use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager};
use distlock_tests::{exists, until_gone, until_queued, until_subscribed, warm_up, RedisServer};

/// Connect, response and pool-wait timeouts of the managers in these tests.
const TIMEOUT: Duration = Duration::from_millis(500);

/// What a loaded machine may add to a bound.
const MARGIN: Duration = Duration::from_millis(250);

/// A manager for `server` with [`TIMEOUT`] everywhere.
fn fast_manager(server: &RedisServer) -> LockManager {
    server.manager_with_timeouts(TIMEOUT).build().unwrap()
}

/// Runs `call`, failing the test instead of hanging if it has not ended after 10 s (far past
/// every bound asserted here); returns its outcome and how long it took.
async fn bounded<T>(what: &str, call: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"));
    (outcome, started.elapsed())
}

/// Asserts that `outcome` is the error of a request that got no answer, within [`TIMEOUT`].
fn timed_out<T: std::fmt::Debug>(what: &str, outcome: &Result<T, LockError>, took: Duration) {
    assert!(
        matches!(outcome, Err(LockError::RedisTimeout { .. })),
        "{what}: {outcome:?}"
    );
    assert!(took <= TIMEOUT + MARGIN, "{what} failed after {took:?}");
}

#[tokio::test]
async fn a_release_against_a_paused_redis_fails_within_the_response_timeout() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    let key = locks.redis_key("release");
    let lease = locks
        .lock("release")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    server.pause();
    let (outcome, took) = bounded("release", lease.release()).await;
    timed_out("release", &outcome, took);
    server.resume();
    // The release goes on in the background once Redis answers again.
    let conn = server.client().await;
    let released = until_gone(&conn, &key, Duration::from_secs(3)).await;
    assert!(released.is_some(), "the lock outlived its failed release");
}

#[tokio::test]
async fn an_extend_against_a_paused_redis_fails_within_the_response_timeout() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    let lease = locks
        .lock("extend")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    server.pause();
    let (outcome, took) = bounded("extend", lease.extend(Duration::from_secs(30))).await;
    timed_out("extend", &outcome, took);
    server.resume();
    // A failed extend is not a lost lease: the next one goes through.
    assert!(!lease.is_lost());
    lease.extend(Duration::from_secs(30)).await.unwrap();
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_renewed_lease_on_a_paused_redis_is_lost_by_its_validity() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    // Renewal every 333 ms, each renewal request bounded by a 2 s response timeout: only the
    // lease's own validity can report it lost in time, not a renewal giving up.
    let locks = server.manager();
    warm_up(&locks).await;
    let ttl = Duration::from_secs(1);

    let sent = Instant::now();
    let lease = locks.lock("renewed").ttl(ttl).acquire().await.unwrap();
    server.pause();
    let ((), _) = bounded("Lease::lost", lease.lost()).await;
    let lost_after = sent.elapsed();
    assert!(lease.is_lost());
    assert!(
        lost_after >= ttl - Duration::from_millis(50) && lost_after <= ttl + MARGIN,
        "Lease::lost resolved {lost_after:?} after the acquire (ttl {ttl:?})"
    );
    server.resume();
    drop(lease);

    let started = Instant::now();
    let (outcome, ()) = tokio::join!(
        locks
            .lock("renewed-run")
            .ttl(ttl)
            .run(tokio::time::sleep(Duration::from_secs(10))),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            server.pause();
        }
    );
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(&outcome, Err(LockError::LeaseLost { keys }) if keys == &["renewed-run"]),
        "{outcome:?}"
    );
    assert!(took <= ttl + MARGIN, "run returned after {took:?}");
}

#[tokio::test]
async fn a_fair_acquire_against_a_paused_redis_fails_within_the_response_timeout() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    // Loads the fair script and opens the connection.
    locks
        .lock("fair")
        .fair(true)
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.pause();
    let (outcome, took) = bounded("fair acquire", locks.lock("fair").fair(true).acquire()).await;
    timed_out("fair acquire", &outcome, took);
    server.resume();
}

#[tokio::test]
async fn a_queued_fair_waiter_on_a_paused_redis_ends_by_its_deadline() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let holder = fast_manager(&server);
    let locks = fast_manager(&server);
    warm_up(&locks).await;
    let conn = server.client().await;
    let _held = holder
        .lock("fair-queued")
        .ttl(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("fair-queued")
                .fair(true)
                .wait(wait)
                .acquire()
                .await
        }
    });
    until_queued(&conn, "fair-queued", 1).await;
    server.pause();
    // The holder's lease has 30 s left: only the waiter's deadline ends its wait; its last
    // attempt then gets no answer.
    let (outcome, _) = bounded("a queued fair waiter", waiter).await;
    let took = started.elapsed();
    server.resume();
    let outcome = outcome.unwrap();
    assert!(
        matches!(outcome, Err(LockError::RedisTimeout { .. })),
        "{outcome:?}"
    );
    assert!(
        took <= wait + TIMEOUT + MARGIN,
        "the waiter returned after {took:?}"
    );
}

#[tokio::test]
async fn a_multi_key_acquire_against_a_paused_redis_fails_within_the_response_timeout() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    warm_up(&locks).await;
    server.pause();
    let (outcome, took) =
        bounded("lock_all", locks.lock_all(["multi-a", "multi-b"]).acquire()).await;
    timed_out("lock_all", &outcome, took);
    server.resume();
}

/// The ids of the server's ordinary (not pub/sub) connections whose last command ran a script:
/// a manager's command connection.
fn command_connections(server: &RedisServer) -> Vec<String> {
    server
        .command(&["CLIENT", "LIST", "TYPE", "normal"])
        .lines()
        .filter(|line| line.contains(" cmd=evalsha ") || line.contains(" cmd=eval "))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

/// Kills the one command connection of a manager (there must be exactly one).
fn kill_command_connection(server: &RedisServer) {
    let ids = command_connections(server);
    assert_eq!(ids.len(), 1, "one command connection: {ids:?}");
    let reply = server.command(&["CLIENT", "KILL", "ID", &ids[0]]);
    assert_eq!(reply.trim(), ":1", "CLIENT KILL ID {}", ids[0]);
}

#[tokio::test]
async fn a_killed_command_connection_is_replaced_for_the_next_call() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = fast_manager(&server);
    warm_up(&locks).await;
    kill_command_connection(&server);

    let started = Instant::now();
    let lease = locks
        .lock("killed")
        .acquire()
        .await
        .expect("the first lock after the kill");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    kill_command_connection(&server);
    lease
        .release()
        .await
        .expect("the release after another kill");
    let mut conn = server.client().await;
    assert!(!exists(&mut conn, &locks.redis_key("killed")).await);
}

/// Waiters (fair or not) queued behind a lease with 30 s left when Redis restarts empty: woken
/// when the subscriber connection breaks, each gets the lock or an error at once, long before
/// its deadline, and certainly never hangs.
async fn waiters_across_a_restart(fair: bool) {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let holder = server.manager();
    let locks = server.manager();
    warm_up(&holder).await;
    warm_up(&locks).await;
    let conn = server.client().await;
    let _held = holder
        .lock("restarted")
        .ttl(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let wait = Duration::from_secs(5);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let outcome = locks
                    .lock("restarted")
                    .fair(fair)
                    .wait(wait)
                    .run(tokio::time::sleep(Duration::from_millis(10)))
                    .await;
                (outcome, Instant::now())
            })
        })
        .collect();
    if fair {
        until_queued(&conn, "restarted", 3).await;
    }
    until_subscribed(&conn, "restarted").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(conn);

    server.restart();
    let restarted = Instant::now();
    for waiter in waiters {
        let (outcome, ended) = bounded("a waiter across a restart", waiter)
            .await
            .0
            .unwrap();
        assert!(
            outcome.is_ok() || outcome.as_ref().is_err_and(LockError::is_unavailable),
            "{outcome:?}"
        );
        let after = ended.saturating_duration_since(restarted);
        assert!(
            after < Duration::from_secs(2),
            "a waiter ended {after:?} after the restart ({outcome:?}); its wait was {wait:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_queued_across_a_restart_get_the_lock_or_an_error_at_once() {
    waiters_across_a_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_queued_across_a_restart_get_the_lock_or_an_error_at_once() {
    waiters_across_a_restart(true).await;
}

#[tokio::test]
async fn a_fair_acquire_after_script_flush_reloads_its_scripts() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = fast_manager(&server);
    let conn = server.client().await;
    server.command(&["SCRIPT", "FLUSH"]);
    let holder = locks
        .lock("flushed")
        .fair(true)
        .acquire()
        .await
        .expect("a fair acquire reloads its script");
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("flushed")
                .fair(true)
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        }
    });
    until_queued(&conn, "flushed", 1).await;
    until_subscribed(&conn, "flushed").await;
    server.command(&["SCRIPT", "FLUSH"]);
    holder
        .release()
        .await
        .expect("the hand-off release reloads its script");
    let lease = waiter
        .await
        .unwrap()
        .expect("the waiter was handed the lock");
    assert_eq!(locks.stats().handed_over, 1);
    lease.release().await.unwrap();
}
