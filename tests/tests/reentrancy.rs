//! Re-entrancy is for strict nesting only: inner calls for a held key that run side by side on
//! one task (`join!`, `select!`, `FuturesUnordered`) are separate critical sections and never
//! overlap, while a call nested inside another still re-enters at once.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_runtime::{current_lease, distributed_lock, LockError, LockManager};
use distlock_tests::RedisServer;
use futures_util::stream::{FuturesUnordered, StreamExt};

#[derive(Debug, thiserror::Error)]
enum BankError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("insufficient funds: balance {balance}, debit {amount}")]
    InsufficientFunds { balance: i64, amount: i64 },
    #[error("two critical sections on one account overlapped")]
    Overlap,
}

/// An account whose balance lives in this process; every critical section on it marks itself
/// inside, so an overlap is caught where it happens, not only by its effect on the balance.
#[derive(Default)]
struct Account {
    balance: AtomicI64,
    inside: AtomicU32,
    most_inside: AtomicU32,
}

impl Account {
    fn with_balance(balance: i64) -> Arc<Self> {
        let account = Self::default();
        account.balance.store(balance, Ordering::SeqCst);
        Arc::new(account)
    }

    /// Read, check, pause (other futures of the task run now), write: safe only under the
    /// lock, with no other critical section on the account at the same time.
    async fn debit(&self, amount: i64) -> Result<i64, BankError> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_inside.fetch_max(now, Ordering::SeqCst);
        let balance = self.balance.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let outcome = if self.inside.load(Ordering::SeqCst) != 1 {
            Err(BankError::Overlap)
        } else if balance < amount {
            Err(BankError::InsufficientFunds { balance, amount })
        } else {
            self.balance.store(balance - amount, Ordering::SeqCst);
            Ok(balance - amount)
        };
        self.inside.fetch_sub(1, Ordering::SeqCst);
        outcome
    }
}

/// Two debits of 60 from 100 ran as separate critical sections: one succeeded, none overlapped.
fn exactly_one_debit_of_60(a: &Debit, b: &Debit, account: &Account) {
    assert_eq!(
        [a, b].iter().filter(|r| r.is_ok()).count(),
        1,
        "{a:?} / {b:?}"
    );
    assert_eq!(account.most_inside.load(Ordering::SeqCst), 1);
    assert_eq!(account.balance.load(Ordering::SeqCst), 40);
}

#[distributed_lock("acct:{id}", wait = 5, manager = locks)]
async fn debit(
    locks: &LockManager,
    account: &Account,
    id: u32,
    amount: i64,
) -> Result<i64, BankError> {
    account.debit(amount).await
}

/// What one debit returned: the balance left, or why it was refused.
type Debit = Result<i64, BankError>;

#[distributed_lock("acct:{id}", wait = 5, manager = locks)]
async fn transfer_joined(
    locks: &LockManager,
    account: &Account,
    id: u32,
) -> Result<(Debit, Debit), BankError> {
    Ok(tokio::join!(
        debit(locks, account, id, 60),
        debit(locks, account, id, 60)
    ))
}

#[tokio::test]
async fn two_debits_joined_inside_a_transfer_never_both_succeed() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    for round in 0..5 {
        let account = Account::with_balance(100);
        let (first, second) = transfer_joined(&locks, &account, round)
            .await
            .expect("the transfer holds the account's lock");
        let succeeded = [&first, &second].iter().filter(|r| r.is_ok()).count();
        assert_eq!(
            succeeded, 1,
            "round {round}: exactly one debit of 60 from 100 succeeds: {first:?} / {second:?}"
        );
        assert!(
            matches!(
                (&first, &second),
                (
                    Ok(40),
                    Err(BankError::InsufficientFunds { balance: 40, .. })
                ) | (
                    Err(BankError::InsufficientFunds { balance: 40, .. }),
                    Ok(40)
                )
            ),
            "round {round}: the second debit saw the first one's write: {first:?} / {second:?}"
        );
        assert_eq!(account.balance.load(Ordering::SeqCst), 40);
        assert_eq!(account.most_inside.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn sibling_calls_in_select_never_overlap() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let account = Account::with_balance(100);
    let inner = locks.clone();
    let account_ref = &account;
    locks
        .lock("acct:7")
        .run(async move {
            // Both branches are polled until the first finishes; the loser is dropped.
            let winner = tokio::select! {
                a = debit(&inner, account_ref, 7, 30) => a,
                b = debit(&inner, account_ref, 7, 30) => b,
            };
            assert_eq!(winner.expect("one debit ran"), 70);
            // The loser, dropped while waiting its turn, let go: another inner call runs.
            assert_eq!(debit(&inner, account_ref, 7, 30).await.unwrap(), 40);
        })
        .await
        .unwrap();
    assert_eq!(account.most_inside.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn sibling_calls_in_futures_unordered_never_overlap() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let account = Account::with_balance(100);
    let inner = locks.clone();
    let account_ref = &account;
    let results = locks
        .lock("acct:8")
        .run(async move {
            let mut calls: FuturesUnordered<_> =
                (0..5).map(|_| debit(&inner, account_ref, 8, 30)).collect();
            let mut results = Vec::new();
            while let Some(result) = calls.next().await {
                results.push(result);
            }
            results
        })
        .await
        .unwrap();
    let succeeded = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(succeeded, 3, "three debits of 30 fit in 100: {results:?}");
    assert!(
        results
            .iter()
            .all(|r| !matches!(r, Err(BankError::Overlap))),
        "{results:?}"
    );
    assert_eq!(account.balance.load(Ordering::SeqCst), 10);
    assert_eq!(account.most_inside.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_call_nested_in_a_sibling_still_reenters_at_once() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let account = Account::with_balance(100);
    let inner = locks.clone();
    let account_ref = &account;
    let started = Instant::now();
    let (a, b) = locks
        .lock("acct:9")
        .run(async move {
            let nested = |amount| {
                let inner = inner.clone();
                async move {
                    // A sibling whose body makes a strictly nested call on the same key.
                    inner
                        .lock("acct:9")
                        .run(async { debit(&inner, account_ref, 9, amount).await })
                        .await
                        .map_err(BankError::from)?
                }
            };
            tokio::join!(nested(10), nested(20))
        })
        .await
        .unwrap();
    assert!(a.is_ok() && b.is_ok(), "{a:?} / {b:?}");
    assert_eq!(account.balance.load(Ordering::SeqCst), 70);
    assert_eq!(account.most_inside.load(Ordering::SeqCst), 1);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no wait on Redis"
    );
}

#[tokio::test]
async fn siblings_that_reenter_part_of_their_keys_never_overlap() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let account = Account::with_balance(100);
    let inner = locks.clone();
    let account_ref = &account;
    let (a, b) = locks
        .lock("acct:10")
        .run(async move {
            // Each sibling holds a key of its own and re-enters the outer one: the outer key
            // is still shared between them.
            let sibling = |own: &'static str| {
                let inner = inner.clone();
                async move {
                    inner
                        .lock_all([own, "acct:10"])
                        .run(async {
                            let keys = current_lease().unwrap().keys().to_vec();
                            assert_eq!(keys, [own], "only the missing key is a new lease");
                            account_ref.debit(60).await
                        })
                        .await
                        .map_err(BankError::from)?
                }
            };
            tokio::join!(sibling("side:a"), sibling("side:b"))
        })
        .await
        .unwrap();
    exactly_one_debit_of_60(&a, &b, &account);
}

#[tokio::test]
async fn a_sibling_inside_a_new_lease_still_waits_for_the_outer_key() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let account = Account::with_balance(100);
    let inner = locks.clone();
    let account_ref = &account;
    let (a, b) = locks
        .lock("acct:11")
        .run(async move {
            // The second sibling first takes a key of its own, then, inside that lease, asks
            // for the outer key that the first sibling is using.
            let direct = debit(&inner, account_ref, 11, 60);
            let through_other_lease = inner.lock("side:c").run(debit(&inner, account_ref, 11, 60));
            let (a, b) = tokio::join!(direct, through_other_lease);
            (a, b.map_err(BankError::from).and_then(|r| r))
        })
        .await
        .unwrap();
    exactly_one_debit_of_60(&a, &b, &account);
}

#[tokio::test]
async fn a_sibling_waits_no_longer_than_its_wait() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let inner = locks.clone();
    locks
        .lock("acct:12")
        .run(async move {
            let slow = inner
                .lock("acct:12")
                .run(tokio::time::sleep(Duration::from_millis(600)));
            let impatient = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let started = Instant::now();
                let waited = inner
                    .lock("acct:12")
                    .wait(Duration::from_millis(200))
                    .run(async {})
                    .await;
                let tried = inner.try_lock("acct:12").run(async {}).await;
                (waited, started.elapsed(), tried)
            };
            let (slow, (waited, elapsed, tried)) = tokio::join!(slow, impatient);
            slow.expect("the first sibling ran");
            assert!(
                matches!(waited, Err(LockError::Timeout { ref key, .. }) if key == "acct:12"),
                "{waited:?}"
            );
            assert!(
                elapsed >= Duration::from_millis(200) && elapsed < Duration::from_millis(450),
                "{elapsed:?}"
            );
            assert!(
                matches!(tried, Err(LockError::NotAcquired { ref key }) if key == "acct:12"),
                "{tried:?}"
            );
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_sibling_needing_a_held_and_a_free_key_never_stalls_the_other() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let inner = locks.clone();
    let started = Instant::now();
    let (first, second) = locks
        .lock("z")
        .run(async move {
            // Both take their keys in sorted order: `a` (free in Redis), then `z` (held by the
            // enclosing body). The second takes `a` first and asks for `z` inside.
            let first = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                inner
                    .lock_all(["a", "z"])
                    .wait(Duration::from_secs(3))
                    .run(async {})
                    .await
            };
            let second = inner.lock("a").wait(Duration::from_secs(3)).run(async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                inner
                    .lock("z")
                    .wait(Duration::from_secs(3))
                    .run(async {})
                    .await
            });
            tokio::join!(first, second)
        })
        .await
        .unwrap();
    first.expect("the first sibling got both keys");
    second
        .expect("the second sibling")
        .expect("its nested call re-entered `z`");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the siblings waited on each other for {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_explicit_acquire_of_a_key_the_task_holds_fails_at_once() {
    let server = RedisServer::start();
    let locks = server.manager();
    let inner = locks.clone();
    let started = Instant::now();
    let outcome = locks
        .lock("held")
        .run(async move {
            // It would wait for the enclosing lease, which waits for this body.
            let own = inner
                .lock_all(["other", "held"])
                .wait(Duration::from_secs(5))
                .acquire()
                .await;
            // A key the task does not hold is acquired as usual.
            let free = inner.lock("free").acquire().await;
            (own, free)
        })
        .await
        .unwrap();
    assert!(
        matches!(&outcome.0, Err(LockError::HeldByThisTask { key }) if key == "held"),
        "{:?}",
        outcome.0
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let message = outcome.0.unwrap_err().to_string();
    assert!(
        message.contains("use `run`") || message.contains("with `run`"),
        "{message}"
    );
    outcome.1.unwrap().release().await.unwrap();
    // Outside the body the key is free again, and acquire works.
    locks
        .lock("held")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_task_spawned_inside_a_body_waits_for_the_outer_lease() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let outer_done = Arc::new(AtomicU32::new(0));
    let (spawned, outer_ended) = locks
        .lock("spawned")
        .run({
            let (locks, outer_done) = (locks.clone(), Arc::clone(&outer_done));
            async move {
                let spawned = tokio::spawn({
                    let outer_done = Arc::clone(&outer_done);
                    async move {
                        // The record of held keys stays with the task that holds them.
                        assert!(current_lease().is_none());
                        locks
                            .lock("spawned")
                            .wait(Duration::from_secs(5))
                            .run(async move { (outer_done.load(Ordering::SeqCst), Instant::now()) })
                            .await
                    }
                });
                // The spawned task asks for the key meanwhile, and must wait.
                tokio::time::sleep(Duration::from_millis(300)).await;
                outer_done.store(1, Ordering::SeqCst);
                (spawned, Instant::now())
            }
        })
        .await
        .unwrap();
    let (seen, started) = spawned
        .await
        .unwrap()
        .expect("the spawned task got the lock");
    assert_eq!(
        seen, 1,
        "the spawned task's body ran while the outer body ran"
    );
    assert!(started >= outer_ended);
}

#[tokio::test]
async fn another_manager_on_the_same_task_does_not_reenter() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    // Same Redis, same prefix, but not a clone: its leases are its own.
    let other = server.manager();
    let ran = Arc::new(AtomicU32::new(0));
    let (run, acquired, tried, clone) = locks
        .lock("two-managers")
        .run({
            let (locks, ran) = (locks.clone(), Arc::clone(&ran));
            async move {
                let run = other
                    .lock("two-managers")
                    .wait(Duration::from_millis(300))
                    .run(async { ran.fetch_add(1, Ordering::SeqCst) })
                    .await;
                let acquired = other
                    .lock("two-managers")
                    .wait(Duration::from_millis(100))
                    .acquire()
                    .await;
                let tried = other.try_lock("two-managers").run(async {}).await;
                // A clone of the holding manager does re-enter.
                let clone = locks.clone().lock("two-managers").run(async {}).await;
                (run, acquired, tried, clone)
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(&run, Err(LockError::Timeout { key, .. }) if key == "two-managers"),
        "{run:?}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the other manager's body ran"
    );
    assert!(
        matches!(&acquired, Err(LockError::Timeout { .. })),
        "{acquired:?}"
    );
    assert!(
        matches!(&tried, Err(LockError::NotAcquired { .. })),
        "{tried:?}"
    );
    clone.expect("a clone re-enters");
}

/// Sets its flag when dropped.
struct Dropped(Arc<AtomicU32>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_reentered_body_stops_when_the_outer_lease_is_lost() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let key = locks.redis_key("lost-outer");
    let conn = server.client().await;
    let dropped = Arc::new(AtomicU32::new(0));
    let finished = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    // Renewed every 200 ms: the first renewal finds the key gone.
    let outer = tokio::time::timeout(
        Duration::from_secs(5),
        locks
            .lock("lost-outer")
            .ttl(Duration::from_millis(600))
            .run({
                let (locks, dropped, finished) =
                    (locks.clone(), Arc::clone(&dropped), Arc::clone(&finished));
                async move {
                    locks
                        .lock("lost-outer")
                        .run(async move {
                            let _dropped = Dropped(dropped);
                            // Someone deletes the lock while the re-entered body runs.
                            let _: () = redis::cmd("DEL")
                                .arg(&key)
                                .query_async(&mut conn.clone())
                                .await
                                .unwrap();
                            tokio::time::sleep(Duration::from_secs(3)).await;
                            finished.store(1, Ordering::SeqCst);
                        })
                        .await
                }
            }),
    )
    .await
    .expect("the outer run returned");
    let took = started.elapsed();
    assert!(
        matches!(&outer, Err(LockError::LeaseLost { keys }) if keys == &["lost-outer"]),
        "{outer:?}"
    );
    assert!(took < Duration::from_secs(1), "LeaseLost after {took:?}");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the inner body was dropped"
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0, "the inner body went on");
}
