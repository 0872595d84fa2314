//! The lock order check: a nesting in the order opposite to one seen before, and another key of
//! a class nested under a key of it, fail at once under `LockOrder::Fail` (before Redis is
//! asked, even where the wanted key is held elsewhere) and warn once per pair under
//! `LockOrder::Warn`, the call going on; re-entry and multi-key requests are never inversions.

use std::time::{Duration, Instant};

use distlock_runtime::{distributed_lock, LockError, LockManager, LockOrder};
use distlock_tests::{Logs, RedisServer};

/// How soon a refused nesting must return: no Redis round trip, no wait.
const AT_ONCE: Duration = Duration::from_millis(50);

fn manager(server: &RedisServer, order: LockOrder) -> LockManager {
    server
        .manager_builder()
        .lock_order(order)
        .build()
        .expect("a manager")
}

#[distributed_lock("acct:{from}", manager = locks, ttl = 5)]
async fn transfer(locks: &LockManager, from: u32, to: u32) -> Result<(), LockError> {
    deposit(locks, to).await
}

#[distributed_lock("acct:{to}", manager = locks, ttl = 5)]
async fn deposit(locks: &LockManager, to: u32) -> Result<(), LockError> {
    let _ = (locks, to);
    Ok(())
}

#[distributed_lock("ledger:{day}", manager = locks, ttl = 5)]
async fn close_day(locks: &LockManager, day: u32) -> Result<(), LockError> {
    audit(locks, day).await
}

#[distributed_lock("audit:{day}", manager = locks, ttl = 5)]
async fn audit(locks: &LockManager, day: u32) -> Result<(), LockError> {
    let _ = (locks, day);
    Ok(())
}

#[distributed_lock("audit:{day}", manager = locks, ttl = 5)]
async fn audit_then_close(locks: &LockManager, day: u32) -> Result<(), LockError> {
    close_ledger(locks, day).await
}

#[distributed_lock("ledger:{day}", manager = locks, ttl = 5)]
async fn close_ledger(locks: &LockManager, day: u32) -> Result<(), LockError> {
    let _ = (locks, day);
    Ok(())
}

fn inversion(result: Result<(), LockError>) -> (String, String) {
    match result {
        Err(LockError::LockOrderInversion { held, wanted }) => (held, wanted),
        other => panic!("expected LockOrderInversion, got {other:?}"),
    }
}

#[tokio::test]
async fn an_inversion_fails_at_once_under_fail_while_the_wanted_key_is_held_elsewhere() {
    let server = RedisServer::start();
    let locks = manager(&server, LockOrder::Fail);
    // One task nests audit under ledger.
    let first = {
        let locks = locks.clone();
        tokio::spawn(async move { close_day(&locks, 1).await })
    };
    first.await.unwrap().expect("the first order is fine");
    // Another task nests ledger under audit: refused.
    let (held, wanted) = inversion(audit_then_close(&locks, 2).await);
    assert_eq!((held.as_str(), wanted.as_str()), ("audit:{}", "ledger:{}"));
    // The outer key was released: the failed call left nothing held.
    assert!(locks.inspect("audit:2").await.unwrap().is_none());
    // The first order still stands.
    close_day(&locks, 3).await.expect("the first order again");

    // At once: the same with keys as classes, the nested call alone timed, while another
    // manager holds the wanted key (a wait for it would last the full 10 s default wait).
    locks
        .lock("ledger:9")
        .run(async { locks.lock("audit:9").run(async {}).await })
        .await
        .unwrap()
        .unwrap();
    let other = server.manager();
    let _held = other.lock("ledger:9").acquire().await.unwrap();
    let (nested, took) = locks
        .lock("audit:9")
        .run(async {
            let started = Instant::now();
            let nested = locks.lock("ledger:9").run(async {}).await;
            (nested, started.elapsed())
        })
        .await
        .unwrap();
    assert!(
        matches!(nested, Err(LockError::LockOrderInversion { .. })),
        "{nested:?}"
    );
    assert!(took < AT_ONCE, "refused after {took:?}, not at once");
}

#[tokio::test]
async fn a_try_lock_never_waits_so_is_never_an_inversion() {
    let server = RedisServer::start();
    let locks = manager(&server, LockOrder::Fail);
    locks
        .lock("a")
        .run(async { locks.lock("b").run(async {}).await })
        .await
        .unwrap()
        .unwrap();
    // b then a, trying once: fine, and not recorded as an order.
    locks
        .lock("b")
        .run(async { locks.try_lock("a").run(async {}).await })
        .await
        .unwrap()
        .unwrap();
    locks
        .lock("a")
        .run(async { locks.lock("b").run(async {}).await })
        .await
        .unwrap()
        .expect("a then b still stands alone");
}

#[tokio::test]
async fn a_two_account_nesting_fails_at_once_under_fail() {
    let server = RedisServer::start();
    let locks = manager(&server, LockOrder::Fail);
    let started = Instant::now();
    let (held, wanted) = inversion(transfer(&locks, 1, 2).await);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!((held.as_str(), wanted.as_str()), ("acct:{}", "acct:{}"));
    // The explicit API's classes are the keys: the same pair taken by hand, in both orders.
    locks
        .lock("a")
        .run(async { locks.lock("b").run(async {}).await })
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let nested = locks
        .lock("b")
        .run(async { locks.lock("a").run(async {}).await })
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(nested, Err(LockError::LockOrderInversion { ref held, ref wanted }) if held == "b" && wanted == "a"),
        "{nested:?}"
    );
    // A plain acquire inside a body is checked too.
    let plain = locks
        .lock("b")
        .run(async { locks.lock("a").acquire().await.map(drop) })
        .await
        .unwrap();
    assert!(
        matches!(plain, Err(LockError::LockOrderInversion { .. })),
        "{plain:?}"
    );
}

#[tokio::test]
async fn warn_lets_the_call_go_on_and_warns_once_per_pair_naming_both_orders() {
    let server = RedisServer::start();
    let (logs, _guard) = Logs::capture();
    let locks = manager(&server, LockOrder::Warn);
    close_day(&locks, 1).await.unwrap();
    audit_then_close(&locks, 2)
        .await
        .expect("Warn: the call goes on");
    audit_then_close(&locks, 3).await.unwrap();
    close_day(&locks, 4).await.unwrap();
    let warnings: Vec<String> = logs
        .text()
        .lines()
        .filter(|line| line.contains("lock order inversion"))
        .map(str::to_owned)
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let warning = &warnings[0];
    for needle in [
        "WARN",
        "`ledger:{}`",
        "`audit:{}`",
        "fn `lock_order::audit_then_close`",
        "fn `lock_order::close_ledger`",
        "fn `lock_order::close_day`",
        "fn `lock_order::audit`",
    ] {
        assert!(warning.contains(needle), "no {needle} in {warning}");
    }
    // Two accounts: warned once, and the transfers go on.
    transfer(&locks, 1, 2).await.unwrap();
    transfer(&locks, 2, 1).await.unwrap();
    assert_eq!(
        logs.count("inside another key of its class"),
        1,
        "{}",
        logs.text()
    );
}

#[tokio::test]
async fn re_entry_and_multi_key_requests_are_never_inversions() {
    let server = RedisServer::start();
    let locks = manager(&server, LockOrder::Fail);
    // a, then b inside it.
    locks
        .lock("a")
        .run(async { locks.lock("b").run(async {}).await })
        .await
        .unwrap()
        .unwrap();
    // Inside b inside a, asking for a again re-enters it: no inversion.
    locks
        .lock("a")
        .run(async {
            locks
                .lock("b")
                .run(async { locks.lock("a").run(async {}).await })
                .await
        })
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // b and a together, all or nothing: not a nesting.
    locks
        .lock_all(["b", "a"])
        .run(async {})
        .await
        .expect("a multi-key request");
    // Two accounts in one request.
    locks
        .lock_all(["acct:1", "acct:2"])
        .run(async {})
        .await
        .unwrap();
    // Another manager's holds are not this manager's nesting.
    let other = server.manager();
    other
        .lock("b")
        .run(async { locks.lock("a").run(async {}).await })
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn off_checks_nothing() {
    let server = RedisServer::start();
    let locks = manager(&server, LockOrder::Off);
    close_day(&locks, 1).await.unwrap();
    audit_then_close(&locks, 2).await.unwrap();
    transfer(&locks, 1, 2).await.unwrap();
}
