//! How distlock behaves while Redis is dead or hung: bounded CPU and logs, calls that end by
//! their deadlines, and no false alarms for requests that never reached Redis.

use std::process::Stdio;
use std::time::{Duration, Instant};

use distlock_runtime::LockError;
use distlock_runtime::LockManager;
use distlock_tests::{warm_up, Logs, Proxy, ProxyMode, RedisServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// What one `lock_worker outage` run printed.
struct OutageRun {
    /// `run`'s outcome, and when it came (since the worker started).
    outcome: String,
    cpu: Duration,
    /// distlock's log lines.
    logs: String,
}

/// Runs `lock_worker outage` on `server` for `secs`, with a lease of `ttl`, and does `then` to
/// the server once the worker holds the lock.
async fn outage_run(
    server: &mut RedisServer,
    ttl: Duration,
    secs: u64,
    then: impl FnOnce(&mut RedisServer),
) -> OutageRun {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
        .args([
            "outage",
            &server.url(),
            "outage",
            &ttl.as_millis().to_string(),
            &secs.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start lock_worker");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let logs = tokio::spawn(async move {
        let mut logs = String::new();
        let _ = stderr.read_to_string(&mut logs).await;
        logs
    });
    let first = stdout.next_line().await.unwrap();
    assert_eq!(first.as_deref(), Some("acquired"));
    then(server);
    let mut outcome = String::new();
    let mut cpu = None;
    let lines = async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("outcome ") {
                outcome = rest.to_owned();
            } else if let Some(ms) = line.strip_prefix("cpu_ms ") {
                cpu = Some(Duration::from_millis(ms.parse().unwrap()));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(secs + 30), lines)
        .await
        .expect("the worker finished");
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{status}");
    OutageRun {
        outcome,
        cpu: cpu.expect("the worker printed its CPU time"),
        logs: logs.await.unwrap(),
    }
}

/// The `after_ms` of an outcome line (`lost after_ms 2010`).
fn after(outcome: &str) -> Duration {
    let ms = outcome.rsplit(' ').next().unwrap().parse().unwrap();
    Duration::from_millis(ms)
}

#[tokio::test]
async fn renewal_against_a_dead_redis_backs_off_and_logs_once_a_second() {
    let _load = distlock_tests::heavy().await;
    let mut server = RedisServer::start();
    // A 3 s lease renews at 1 s; with Redis dead its renewal fails from then until the lease is
    // lost at 3 s. The worker lives 5 s.
    let run = outage_run(&mut server, Duration::from_secs(3), 5, RedisServer::kill).await;
    assert!(run.outcome.starts_with("lost "), "{}", run.outcome);
    let failed = run.logs.matches("lease renewal failed").count();
    assert!(
        (1..=4).contains(&failed),
        "{failed} renewal warnings:\n{}",
        run.logs
    );
    assert_eq!(
        run.logs
            .matches("it expired before a renewal got through")
            .count(),
        1,
        "{}",
        run.logs
    );
    // Connecting, the renewals and the logs: well under a tenth of one core over 5 s.
    assert!(
        run.cpu < Duration::from_millis(400),
        "CPU {:?}:\n{}",
        run.cpu,
        run.logs
    );
}

#[tokio::test]
async fn a_lease_lost_to_a_hung_redis_returns_when_it_ends() {
    let _load = distlock_tests::heavy().await;
    let mut server = RedisServer::start();
    let ttl = Duration::from_secs(2);
    let run = outage_run(&mut server, ttl, 4, RedisServer::pause).await;
    server.resume();
    assert!(run.outcome.starts_with("lost "), "{}", run.outcome);
    // Lost at the lease's validity (a little under its ttl after the acquire was sent), and
    // returned then: not after another response timeout spent on a release that cannot get
    // through (the release goes on in the background).
    let took = after(&run.outcome);
    assert!(
        took <= ttl + Duration::from_millis(300),
        "LeaseLost after {took:?}"
    );
}

#[tokio::test]
async fn acquires_that_never_reached_a_dead_redis_leave_nothing_to_undo_and_no_warning() {
    let (logs, _capture) = Logs::capture();
    let mut server = RedisServer::start();
    let locks = server
        .manager_with_timeouts(Duration::from_millis(300))
        .build()
        .unwrap();
    warm_up(&locks).await;
    server.kill();
    let ttl = Duration::from_millis(500);
    // Fair requests (one key's default) and plain ones (the all-or-nothing script) alike.
    let try_lock = |key: String, fair: bool| {
        let locks = locks.clone();
        async move {
            let outcome = locks
                .lock(key)
                .fair(fair)
                .ttl(ttl)
                .wait(Duration::ZERO)
                .acquire()
                .await;
            assert!(
                outcome.as_ref().is_err_and(LockError::is_unavailable),
                "{outcome:?}"
            );
        }
    };
    // The connection that was open when Redis died has noticed: the first acquire fails on it
    // before it is handed over, so it was never sent either.
    tokio::time::sleep(Duration::from_millis(100)).await;
    try_lock("first".into(), false).await;
    let in_doubt = logs.count("releasing in the background");
    assert_eq!(in_doubt, 0, "{}", logs.text());
    // Every later one fails to connect: never sent, nothing to undo.
    for i in 0..20 {
        try_lock(format!("one-by-one-{i}"), i % 2 == 0).await;
    }
    futures_util::future::join_all((0..20).map(|i| try_lock(format!("together-{i}"), i % 2 == 0)))
        .await;
    assert_eq!(
        logs.count("releasing in the background"),
        in_doubt,
        "{}",
        logs.text()
    );
    // Past every ttl: no warning about a lock that was never taken.
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(logs.count("WARN"), 0, "{}", logs.text());
}

/// A manager reaching `proxy`, with `timeout` for connecting, answers and the pool.
fn proxied(proxy: &Proxy, timeout: Duration) -> LockManager {
    distlock_tests::manager_at(&proxy.url(), timeout)
        .build()
        .unwrap()
}

/// Holds `count` lock keys named `{name}-{i}` for a minute, as another owner.
async fn hold_many(server: &RedisServer, name: &str, count: usize) {
    let mut conn = server.client().await;
    let mut pipe = redis::pipe();
    for i in 0..count {
        pipe.cmd("SET")
            .arg(format!("distlock:lock:{{{name}-{i}}}"))
            .arg("another-owner")
            .arg("PX")
            .arg(60_000)
            .ignore();
    }
    pipe.exec_async(&mut conn).await.unwrap();
}

/// Waits on `key` for `wait`; the outcome and how long it took.
async fn wait_on(
    locks: &LockManager,
    key: String,
    wait: Duration,
) -> (Result<(), LockError>, Duration) {
    let started = Instant::now();
    let outcome = locks.lock(key).wait(wait).acquire().await.map(drop);
    (outcome, started.elapsed())
}

#[tokio::test]
async fn every_waiter_ends_by_its_own_deadline_while_the_subscriber_connection_hangs() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let proxy = Proxy::start(&server).await;
    let timeout = Duration::from_millis(500);
    let locks = proxied(&proxy, timeout);
    // The command connection is open and works; every connection after it hangs.
    warm_up(&locks).await;
    proxy.set_mode(ProxyMode::Silent);
    hold_many(&server, "busy", 5).await;
    let wait = Duration::from_millis(250);
    let waits = (0..5).map(|i| wait_on(&locks, format!("busy-{i}"), wait));
    for (outcome, took) in futures_util::future::join_all(waits).await {
        assert!(
            matches!(outcome, Err(LockError::Timeout { .. })),
            "{outcome:?}"
        );
        // The deadline, plus at most the response timeout of the last attempt.
        assert!(
            took <= wait + timeout + Duration::from_millis(150),
            "{took:?}"
        );
    }
}

#[tokio::test]
async fn subscriptions_whose_answer_never_came_are_not_left_behind() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let proxy = Proxy::start(&server).await;
    let timeout = Duration::from_millis(300);
    let locks = proxied(&proxy, timeout);
    warm_up(&locks).await;
    // The subscriber connection's SUBSCRIBEs reach Redis, but their answers never come back.
    proxy.set_mode(ProxyMode::MuteAfterSubscribe);
    hold_many(&server, "held", 1000).await;
    let wait = Duration::from_millis(400);
    let waits = (0..1000).map(|i| wait_on(&locks, format!("held-{i}"), wait));
    let outcomes = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join_all(waits),
    )
    .await
    .expect("every waiter ended within its wait, not one subscription timeout after another");
    for (outcome, _) in outcomes {
        assert!(
            matches!(outcome, Err(LockError::Timeout { .. })),
            "{outcome:?}"
        );
    }
    proxy.set_mode(ProxyMode::Forward);
    let mut conn = server.client().await;
    // Locks' channels (`distlock:forced`, kept by managers holding leases, is not one).
    let left = distlock_tests::eventually(Duration::from_secs(3), || {
        let mut conn = conn.clone();
        async move {
            distlock_tests::channels(&mut conn, "distlock:lock:*")
                .await
                .is_empty()
        }
    })
    .await;
    let channels = distlock_tests::channels(&mut conn, "distlock:lock:*").await;
    assert!(
        left.is_some(),
        "{} channels still subscribed",
        channels.len()
    );
}

/// Leases dropped while Redis hangs pile up as background releases: counted, and drained once
/// Redis answers again (every key released long before its 30 s ttl), without a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_releases_are_bounded_while_redis_hangs_and_drain_after() {
    let (logs, _capture) = Logs::capture();
    let mut server = RedisServer::start();
    let locks = server
        .manager_with_timeouts(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut leases = Vec::new();
    for i in 0..40 {
        let lease = locks
            .lock(format!("dropped-{i}"))
            .ttl(Duration::from_secs(30))
            .renew(false)
            .acquire()
            .await
            .unwrap();
        leases.push(lease);
    }
    server.pause();
    drop(leases);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(locks.stats().background_releases, 40);
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.resume();
    let drained = Instant::now();
    while locks.stats().background_releases > 0 {
        assert!(
            drained.elapsed() < Duration::from_secs(5),
            "{} still pending",
            locks.stats().background_releases
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = server.command(&["KEYS", "distlock:lock:*"]);
    assert_eq!(left.trim(), "*0", "{left}");
    assert_eq!(logs.count("WARN"), 0, "{}", logs.text());
}

/// A subscriber connection whose network path breaks without closing (nothing passes, nothing
/// is said) is noticed by its `PING` check and replaced: a release it did not carry costs its
/// waiter a few seconds, not the holder's remaining 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_connection_that_stops_answering_is_replaced() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let proxy = Proxy::start(&server).await;
    let waiting_side = proxied(&proxy, Duration::from_millis(500));
    // The waiter's command connection, opened now, forwards for good.
    warm_up(&waiting_side).await;
    let holder = server.manager();
    let held = holder
        .lock("cut")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // Its subscriber connection, opened by the waiter, is cut 300 ms after it subscribed.
    proxy.set_mode(ProxyMode::CutAfterSubscribe(Duration::from_millis(300)));
    let waiting =
        distlock_tests::spawn_unfair_waiter(&waiting_side, "cut", Duration::from_secs(25));
    let conn = server.client().await;
    distlock_tests::until_subscribed(&conn, "cut").await;
    proxy.set_mode(ProxyMode::Forward);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Announced on a connection that no longer carries anything.
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = waiting.await.unwrap();
    lease.expect("acquired").release().await.unwrap();
    // The check runs every 2 s and waits 500 ms for its answer.
    let took = acquired - released;
    assert!(
        took < Duration::from_secs(4),
        "woken {took:?} after the release"
    );
}

/// Leases dropped while Redis stays down: their background releases back off (no tight loop),
/// give up by their ttl (when the keys have expired anyway), and say so once, a lease its owner
/// let go of with a warning, a lost one at debug level (its loss was reported already).
#[tokio::test]
async fn background_releases_back_off_and_give_up_by_their_ttl_while_redis_stays_down() {
    let _load = distlock_tests::timed().await;
    let (logs, _capture) = Logs::capture();
    let mut server = RedisServer::start();
    let locks = server
        .manager_with_timeouts(Duration::from_millis(300))
        .build()
        .unwrap();
    let ttl = Duration::from_secs(1);
    let dropped = locks
        .lock("dropped")
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let lost = locks
        .lock("lost")
        .ttl(Duration::from_millis(100))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(lost.is_lost());
    server.kill();
    let started = Instant::now();
    drop(dropped);
    drop(lost);
    assert_eq!(locks.stats().background_releases, 2);
    let ended = distlock_tests::eventually(Duration::from_secs(5), || async {
        locks.stats().background_releases == 0
    })
    .await;
    assert!(ended.is_some(), "the background releases never gave up");
    let took = started.elapsed();
    assert!(
        took <= ttl + Duration::from_millis(200),
        "gave up {took:?} after the drop (ttl {ttl:?})"
    );
    // 50 ms, doubling: 4 retries within the second, 1 within the lost lease's 100 ms.
    let retries = logs.count("distlock background release failed; retrying");
    assert!(
        (2..=8).contains(&retries),
        "{retries} retries: {}",
        logs.text()
    );
    // Naming the lock.
    let failed = logs.text();
    let failed: Vec<&str> = failed
        .lines()
        .filter(|line| line.contains("distlock release failed; the lock expires after its ttl"))
        .collect();
    assert_eq!(failed.len(), 1, "{}", logs.text());
    assert!(
        failed[0].contains(r#"keys=["distlock:lock:{dropped}"]"#),
        "{}",
        failed[0]
    );
    assert_eq!(
        logs.count("distlock could not release a lost lease"),
        1,
        "{}",
        logs.text()
    );
}
