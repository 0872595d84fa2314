//! distlock's counters (cargo feature `metrics`, on by default), read from a Prometheus
//! recorder this test binary installs: each moves when its event happens against a real
//! `redis-server`, and only then.
//!
//! The recorder is process-wide, and `distlock_renewals_total` and
//! `distlock_subscriber_reconnects_total` have no label a test could keep to itself: the tests
//! of this file run one at a time ([`serial`]) and read each counter before and after.

use std::sync::OnceLock;
use std::time::Duration;

use distlock_runtime::{LockError, LockOrder};
use distlock_tests::{free_port, manager_at, RedisServer};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

const ACQUISITIONS: &str = "distlock_acquisitions_total";
const HANDOFFS: &str = "distlock_handoffs_total";
const RENEWALS: &str = "distlock_renewals_total";
const RECONNECTS: &str = "distlock_subscriber_reconnects_total";

/// Held by each test of this file for its whole run.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// The process's recorder, installed by the first test that reads it.
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("no other metrics recorder in this test binary")
    })
}

/// The sum of the counter `name`'s series whose labels include `labels`, in the recorder's
/// Prometheus text; 0 when there is none yet (a counter appears at its first increment).
fn counter(name: &str, labels: &[(&str, &str)]) -> f64 {
    recorder()
        .render()
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            let (series_name, series_labels) = series.split_once('{').unwrap_or((series, ""));
            series_name == name
                && labels
                    .iter()
                    .all(|(k, v)| series_labels.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, value)| value.parse::<f64>().expect("a sample's value"))
        .fold(0.0, |sum, value| sum + value)
}

/// `distlock_acquisitions_total` of `template`, one value per outcome.
fn acquisitions(template: &str) -> [f64; 5] {
    [
        "acquired",
        "contended",
        "timed_out",
        "not_acquired",
        "error",
    ]
    .map(|outcome| {
        counter(
            ACQUISITIONS,
            &[("template", template), ("outcome", outcome)],
        )
    })
}

/// Waits (at most 5 s) until `check` holds of `counter(name, labels)`.
async fn until_counter(name: &str, labels: &[(&str, &str)], check: impl Fn(f64) -> bool) -> f64 {
    let seen = distlock_tests::eventually(Duration::from_secs(5), || async {
        check(counter(name, labels))
    })
    .await;
    let value = counter(name, labels);
    assert!(seen.is_some(), "{name}{labels:?} is still {value}");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_are_counted_by_outcome() {
    let _serial = serial().await;
    const TEMPLATE: &str = "metrics-acquisitions";
    let server = RedisServer::start();
    let (locks, rival) = (server.manager(), server.manager());
    let conn = server.client().await;
    let mut expected = acquisitions(TEMPLATE);
    // [acquired, contended, timed_out, not_acquired, error]
    let mut step = |outcome: usize, what: &str| {
        expected[outcome] += 1.0;
        assert_eq!(acquisitions(TEMPLATE), expected, "after {what}");
    };

    let held = locks
        .lock("metrics-acq")
        .metrics_label(TEMPLATE)
        .acquire()
        .await
        .unwrap();
    step(0, "a free lock");

    let refused = rival
        .try_lock("metrics-acq")
        .metrics_label(TEMPLATE)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, LockError::NotAcquired { .. }),
        "{refused:?}"
    );
    step(3, "a try-lock of a held lock");

    let late = rival
        .lock("metrics-acq")
        .metrics_label(TEMPLATE)
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(late, LockError::Timeout { .. }), "{late:?}");
    step(2, "a wait that ran out");

    let waiting = {
        let rival = rival.clone();
        tokio::spawn(async move {
            rival
                .lock("metrics-acq")
                .metrics_label(TEMPLATE)
                .fair(false)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    distlock_tests::until_subscribed(&conn, "metrics-acq").await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
    step(1, "a wait that ended with the lock");

    // Nothing listens on this port: the acquire fails (connection refused).
    let nowhere = manager_at(
        &format!("redis://127.0.0.1:{}", free_port()),
        Duration::from_millis(500),
    )
    .build()
    .unwrap();
    let down = nowhere
        .lock("metrics-acq")
        .metrics_label(TEMPLATE)
        .acquire()
        .await
        .unwrap_err();
    assert!(down.is_unavailable(), "{down:?}");
    step(4, "an acquire Redis never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_hand_off_is_counted_and_a_plain_release_is_not() {
    let _serial = serial().await;
    const TEMPLATE: &str = "metrics-handoff";
    let labels = [("template", TEMPLATE)];
    let server = RedisServer::start();
    let (locks, waiter) = (server.manager(), server.manager());
    let conn = server.client().await;
    let mut expected = counter(HANDOFFS, &labels);

    // Fair (the default for one key): the release hands the lock to the queued waiter.
    for fair in [true, false] {
        let held = locks
            .lock("metrics-handoff")
            .metrics_label(TEMPLATE)
            .acquire()
            .await
            .unwrap();
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                waiter
                    .lock("metrics-handoff")
                    .metrics_label(TEMPLATE)
                    .fair(fair)
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await
            })
        };
        if fair {
            distlock_tests::until_queued(&conn, "metrics-handoff", 1).await;
        } else {
            distlock_tests::until_subscribed(&conn, "metrics-handoff").await;
        }
        assert_eq!(counter(HANDOFFS, &labels), expected, "before the release");
        let [acquired, contended, ..] = acquisitions(TEMPLATE);
        held.release().await.unwrap();
        waiting.await.unwrap().unwrap().release().await.unwrap();
        // Either way the waiter's acquisition counts as contended.
        let [now_acquired, now_contended, ..] = acquisitions(TEMPLATE);
        assert_eq!((now_acquired, now_contended), (acquired, contended + 1.0));
        // The fair waiter was handed the lock; the unfair one took it after the notification.
        if fair {
            expected += 1.0;
        }
        assert_eq!(waiter.stats().handed_over, 1, "fair: {fair}");
        assert_eq!(counter(HANDOFFS, &labels), expected, "fair: {fair}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_counted_ok_and_failed_once_redis_is_gone() {
    let _serial = serial().await;
    let (ok, failed) = ([("outcome", "ok")], [("outcome", "failed")]);
    let mut server = RedisServer::start();
    let locks = server.manager();
    let (ok_before, failed_before) = (counter(RENEWALS, &ok), counter(RENEWALS, &failed));

    // Renewed every ttl/3: twice within half a second or so.
    let lease = locks
        .lock("metrics-renew")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    until_counter(RENEWALS, &ok, |n| n >= ok_before + 2.0).await;
    assert!(!lease.is_lost());
    assert_eq!(counter(RENEWALS, &failed), failed_before);

    // Redis gone: the next renewals fail.
    server.kill();
    until_counter(RENEWALS, &failed, |n| n > failed_before).await;
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_connection_opened_again_after_it_was_killed_is_counted() {
    let _serial = serial().await;
    let server = RedisServer::start();
    let locks = server.manager();
    // On a caller's pool: without a subscriber connection of its own (which would listen for
    // forced releases while it holds a lease), so `locks` holds the only one.
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let holder = distlock_runtime::LockManager::builder()
        .pool(pool)
        .build()
        .unwrap();
    let conn = server.client().await;
    let before = counter(RECONNECTS, &[]);

    let first = holder.lock("metrics-sub-1").acquire().await.unwrap();
    let first_waiter =
        distlock_tests::spawn_unfair_waiter(&locks, "metrics-sub-1", Duration::from_secs(10));
    distlock_tests::until_subscribed(&conn, "metrics-sub-1").await;
    // A manager's first subscriber connection is not a reconnect.
    assert_eq!(counter(RECONNECTS, &[]), before);

    assert_eq!(
        server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]),
        ":1\r\n"
    );
    // A new waiter subscribes over a new connection.
    let second = holder.lock("metrics-sub-2").acquire().await.unwrap();
    let second_waiter =
        distlock_tests::spawn_unfair_waiter(&locks, "metrics-sub-2", Duration::from_secs(10));
    distlock_tests::until_subscribed(&conn, "metrics-sub-2").await;
    assert_eq!(counter(RECONNECTS, &[]), before + 1.0);

    first.release().await.unwrap();
    second.release().await.unwrap();
    for waiter in [first_waiter, second_waiter] {
        waiter.await.unwrap().1.unwrap().release().await.unwrap();
    }
    assert_eq!(counter(RECONNECTS, &[]), before + 1.0);
}

#[tokio::test]
async fn every_series_of_a_request_carries_its_mode() {
    let _serial = serial().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let template = "modes-metrics";
    let by_mode = |mode: &str| {
        counter(
            ACQUISITIONS,
            &[
                ("template", template),
                ("mode", mode),
                ("outcome", "acquired"),
            ],
        )
    };
    let before = ["exclusive", "shared", "permits", "mixed"].map(by_mode);
    let lease = locks
        .lock("m-x")
        .metrics_label(template)
        .acquire()
        .await
        .unwrap();
    lease.release().await.unwrap();
    for _ in 0..2 {
        let lease = locks
            .read_lock("m-r")
            .metrics_label(template)
            .acquire()
            .await
            .unwrap();
        lease.release().await.unwrap();
    }
    for _ in 0..3 {
        let lease = locks
            .lock("m-p")
            .permits(2)
            .metrics_label(template)
            .acquire()
            .await
            .unwrap();
        lease.release().await.unwrap();
    }
    let lease = locks
        .lock("m-a")
        .read_keys(["m-b"])
        .metrics_label(template)
        .acquire()
        .await
        .unwrap();
    lease.release().await.unwrap();
    let after = ["exclusive", "shared", "permits", "mixed"].map(by_mode);
    let counted: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(counted, [1.0, 2.0, 3.0, 1.0]);
    // A body's hold is timed under its mode too.
    locks
        .read_lock("m-r")
        .metrics_label(template)
        .run(async {})
        .await
        .unwrap();
    let text = recorder().render();
    assert!(
        text.lines().any(|l| l.starts_with("distlock_hold_seconds")
            && l.contains("template=\"modes-metrics\"")
            && l.contains("mode=\"shared\"")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terms_started_and_lost_are_counted_per_election_and_a_resignation_is_not_a_loss() {
    let _serial = serial().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let (started, lost) = ("distlock_terms_started_total", "distlock_terms_lost_total");
    let election = locks.election("metered").ttl(Duration::from_millis(600));
    let labels = [("election", "metered")];
    let (started_before, lost_before) = (counter(started, &labels), counter(lost, &labels));
    // A term resigned: started, not lost.
    let term = election.campaign().await.expect("leads");
    term.resign().await.expect("resign");
    assert_eq!(counter(started, &labels), started_before + 1.0);
    // A term whose key an operator breaks: started and lost (seen at its next renewal).
    let term = election.campaign().await.expect("leads again");
    assert!(locks
        .force_release("election:metered")
        .await
        .expect("force"));
    until_counter(lost, &labels, |n| n == lost_before + 1.0).await;
    assert!(term.is_lost());
    assert_eq!(counter(started, &labels), started_before + 2.0);
    // Another election's series is its own.
    assert_eq!(counter(started, &[("election", "other")]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_order_inversion_is_counted_and_each_failed_one_too() {
    let _serial = serial().await;
    const INVERSIONS: &str = "distlock_lock_order_inversions_total";
    let server = RedisServer::start();
    let warn = server
        .manager_builder()
        .lock_order(LockOrder::Warn)
        .build()
        .unwrap();
    let before = counter(INVERSIONS, &[]);
    let nest = |locks: distlock_runtime::LockManager, outer: &'static str, inner: &'static str| async move {
        locks
            .lock(outer)
            .run(async { locks.lock(inner).run(async {}).await })
            .await
            .unwrap()
    };
    nest(warn.clone(), "metrics-order-a", "metrics-order-b")
        .await
        .unwrap();
    assert_eq!(
        counter(INVERSIONS, &[]),
        before,
        "the first order is no inversion"
    );
    // Warned once, counted twice.
    nest(warn.clone(), "metrics-order-b", "metrics-order-a")
        .await
        .unwrap();
    nest(warn.clone(), "metrics-order-b", "metrics-order-a")
        .await
        .unwrap();
    assert_eq!(counter(INVERSIONS, &[]), before + 2.0);
    // The harness's managers fail: counted too.
    let fail = server.manager();
    nest(fail.clone(), "metrics-order-c", "metrics-order-d")
        .await
        .unwrap();
    let refused = nest(fail, "metrics-order-d", "metrics-order-c").await;
    assert!(
        matches!(refused, Err(LockError::LockOrderInversion { .. })),
        "{refused:?}"
    );
    assert_eq!(counter(INVERSIONS, &[]), before + 3.0);
}
