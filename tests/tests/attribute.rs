//! `#[distributed_lock]` end to end against real redis-server processes, through the attribute
//! only. Every fn takes its manager explicitly (`manager = ...`) except the one test of the
//! default manager, so tests in this binary never share a server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_runtime::{current_lease, distributed_lock, LockError, LockManager, LockMode};
use distlock_tests::{exists, until_exists, until_gone, RedisServer};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

#[distributed_lock("counter", wait = 60, manager = locks)]
async fn increment(locks: &LockManager, mut conn: MultiplexedConnection) -> Result<(), AppError> {
    let value: i64 = conn.get::<_, Option<i64>>("counter").await?.unwrap_or(0);
    tokio::task::yield_now().await;
    conn.set::<_, _, ()>("counter", value + 1).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn annotated_increments_across_tasks_end_exact() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let conn = server.client().await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (locks, conn) = (locks.clone(), conn.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                increment(&locks, conn.clone()).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total: i64 = conn.clone().get("counter").await.unwrap();
    assert_eq!(total, 16 * 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_increments_across_three_processes_end_exact() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let url = server.url();
    distlock_tests::run_processes(
        env!("CARGO_BIN_EXE_lock_worker"),
        &["count-attr", &url, "attr-lock", "attr-counter", "100"],
        3,
    )
    .await;
    let mut conn = server.client().await;
    let done: i64 = conn.get("attr-counter:done").await.unwrap();
    assert_eq!(done, 3);
    let total: i64 = conn.get("attr-counter").await.unwrap();
    assert_eq!(total, 300);
}

#[distributed_lock("job:{id}", wait = 0, manager = locks)]
async fn try_job(locks: &LockManager, id: u32, ran: &AtomicU64) -> Result<u32, LockError> {
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn wait_zero_is_a_try_lock_and_the_body_does_not_run() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let ran = AtomicU64::new(0);
    let held = locks.lock("job:7").acquire().await.unwrap();
    let started = Instant::now();
    let outcome = try_job(&locks, 7, &ran).await;
    assert!(
        matches!(outcome, Err(LockError::NotAcquired { ref key }) if key == "job:7"),
        "{outcome:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the body ran without the lock"
    );
    held.release().await.unwrap();
    assert_eq!(try_job(&locks, 7, &ran).await.unwrap(), 7);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[distributed_lock("forever:{id}", ttl = "900ms", manager = locks)]
async fn forever(
    locks: &LockManager,
    id: u32,
    guard: distlock_tests::DropGuard,
) -> Result<(), LockError> {
    let _ = (id, guard);
    std::future::pending().await
}

#[tokio::test]
async fn a_deleted_lease_stops_the_annotated_body_and_returns_lease_lost() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let key = locks.redis_key("forever:1");
    let dropped = distlock_tests::DropClock::default();
    let call = tokio::spawn({
        let (locks, guard) = (locks.clone(), dropped.guard());
        async move { forever(&locks, 1, guard).await }
    });
    let mut conn = server.client().await;
    until_exists(&conn, &key, Duration::from_secs(2))
        .await
        .expect("acquired");
    let _: () = conn.del(&key).await.unwrap();
    let deleted_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert!(
        deleted_at.elapsed() <= Duration::from_millis(400),
        "{:?}",
        deleted_at.elapsed()
    );
    // The body itself was stopped, within one renewal interval (300 ms) of the DEL.
    let stopped = dropped.at().expect("the body was dropped");
    assert!(
        stopped - deleted_at <= Duration::from_millis(400),
        "body dropped {:?} after the DEL",
        stopped - deleted_at
    );
}

#[distributed_lock("overrun", ttl = "300ms", renew = false, manager = locks)]
async fn overrun(locks: &LockManager, finished: &AtomicU64) -> Result<(), LockError> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    finished.store(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn renew_false_stops_an_overrunning_annotated_body() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let finished = AtomicU64::new(0);
    let started = Instant::now();
    let outcome = overrun(&locks, &finished).await;
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() <= Duration::from_millis(350),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(finished.load(Ordering::SeqCst), 0);
}

#[distributed_lock("account:{id}", wait = 0, manager = locks)]
async fn outer(locks: &LockManager, id: u32) -> Result<(u64, u64), LockError> {
    let outer_token = current_lease().unwrap().fencing_token();
    let inner_token = inner(locks, id).await?;
    Ok((outer_token, inner_token))
}

#[distributed_lock("account:{id}", wait = 0, manager = locks)]
async fn inner(locks: &LockManager, id: u32) -> Result<u64, LockError> {
    let _ = id;
    Ok(current_lease().unwrap().fencing_token())
}

#[tokio::test]
async fn nested_annotated_calls_on_one_key_are_reentrant() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let started = Instant::now();
    let (outer_token, inner_token) = outer(&locks, 9)
        .await
        .expect("inner call did not wait for itself");
    assert_eq!(
        outer_token, inner_token,
        "the inner call ran under the outer lease"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

struct Order {
    id: u64,
    buyer: Buyer,
}

struct Buyer {
    name: String,
}

#[distributed_lock(["order:{order.id}", "buyer:{order.buyer.name}", "order:{order.id}"], manager = locks)]
async fn place(locks: &LockManager, order: &Order) -> Result<Vec<String>, LockError> {
    Ok(current_lease().unwrap().keys().to_vec())
}

#[tokio::test]
async fn a_key_list_with_field_paths_is_locked_together() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let order = Order {
        id: 12,
        buyer: Buyer { name: "ann".into() },
    };
    let keys = place(&locks, &order).await.unwrap();
    assert_eq!(keys, ["buyer:ann", "order:12"], "sorted and de-duplicated");

    let held = locks.lock("buyer:ann").acquire().await.unwrap();
    let mut conn = server.client().await;
    let outcome = tokio::time::timeout(Duration::from_secs(1), place(&locks, &order)).await;
    assert!(
        outcome.is_err(),
        "must still be waiting (for 10 s) while one of its keys is held: {outcome:?}"
    );
    assert!(
        !exists(&mut conn, &locks.redis_key("order:12")).await,
        "all or nothing"
    );
    held.release().await.unwrap();
}

struct Inventory {
    locks: LockManager,
    name: &'static str,
}

impl Inventory {
    #[distributed_lock("inventory:{self.name}:{sku}", manager = &self.locks)]
    async fn reserve(&self, sku: u32) -> Result<String, LockError> {
        Ok(current_lease().unwrap().keys()[0].clone())
    }
}

struct AppState {
    locks: LockManager,
}

#[distributed_lock("state:{id}", manager = state.locks.clone())]
async fn with_state(state: Arc<AppState>, id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[tokio::test]
async fn managers_from_self_and_from_state() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let inventory = Inventory {
        locks: server.manager(),
        name: "main",
    };
    assert_eq!(inventory.reserve(3).await.unwrap(), "inventory:main:3");
    let state = Arc::new(AppState {
        locks: server.manager(),
    });
    let held = state.locks.lock("state:4").acquire().await.unwrap();
    let outcome =
        tokio::time::timeout(Duration::from_millis(300), with_state(state.clone(), 4)).await;
    assert!(outcome.is_err(), "the state's manager is the one used");
    held.release().await.unwrap();
    assert_eq!(with_state(state, 4).await.unwrap(), 4);
}

#[distributed_lock("defaulted:{id}")]
async fn defaulted(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[tokio::test]
async fn without_manager_the_default_manager_is_used() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    distlock_runtime::set_default_manager(locks.clone());
    let held = locks.lock("defaulted:1").acquire().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_millis(300), defaulted(1)).await;
    assert!(
        outcome.is_err(),
        "the default manager's lock is the one taken"
    );
    held.release().await.unwrap();
    assert_eq!(defaulted(1).await.unwrap(), 1);
}

#[distributed_lock("slow:{id}", ttl = 30, manager = locks)]
async fn slow(locks: &LockManager, id: u32) -> Result<(), LockError> {
    let _ = id;
    tokio::time::sleep(Duration::from_secs(60)).await;
    Ok(())
}

#[tokio::test]
async fn dropping_an_annotated_call_releases_within_100_ms() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let key = locks.redis_key("slow:1");
    let mut conn = server.client().await;
    let call = tokio::spawn({
        let locks = locks.clone();
        async move { slow(&locks, 1).await }
    });
    until_exists(&conn, &key, Duration::from_secs(2))
        .await
        .expect("acquired");
    call.abort();
    let released = until_gone(&conn, &key, Duration::from_millis(100)).await;
    assert!(
        released.is_some(),
        "still held 100 ms after the call was dropped"
    );
    assert!(!exists(&mut conn, &key).await);
}

#[distributed_lock("pair:{a}:{b}", manager = locks)]
async fn pair(locks: &LockManager, a: &str, b: &str) -> Result<String, LockError> {
    Ok(current_lease().unwrap().keys()[0].clone())
}

#[tokio::test]
async fn user_input_renders_escaped_and_never_collides() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    assert_eq!(pair(&locks, "x:y", "z").await.unwrap(), "pair:x%3Ay:z");
    assert_eq!(pair(&locks, "x", "y:z").await.unwrap(), "pair:x:y%3Az");
    assert_eq!(
        pair(&locks, "{slot}", "100%").await.unwrap(),
        "pair:%7Bslot%7D:100%25"
    );
    assert_eq!(pair(&locks, "plain", "42").await.unwrap(), "pair:plain:42");

    // While ("x:y", "z") is held, ("x", "y:z") is a different lock and does not wait.
    let held = locks.lock("pair:x%3Ay:z").acquire().await.unwrap();
    let other = tokio::time::timeout(Duration::from_millis(200), pair(&locks, "x", "y:z")).await;
    assert!(
        other.is_ok_and(|r| r.is_ok()),
        "different arguments collided"
    );
    let same = tokio::time::timeout(Duration::from_millis(200), pair(&locks, "x:y", "z")).await;
    assert!(same.is_err(), "the same arguments must contend");
    held.release().await.unwrap();
}

const SHORT_TTL: u64 = 1;

#[distributed_lock("expr:{id}", ttl = ttl_secs, wait = SHORT_TTL, manager = locks)]
async fn ttl_from_argument(
    locks: &LockManager,
    id: u64,
    ttl_secs: i64,
) -> Result<Option<u64>, LockError> {
    Ok(distlock_runtime::current_fencing_token(&format!(
        "expr:{id}"
    )))
}

#[tokio::test]
async fn ttl_and_wait_from_expressions_are_checked_at_each_call() {
    let server = RedisServer::start();
    let locks = server.manager();
    assert!(ttl_from_argument(&locks, 1, 5).await.unwrap().is_some());
    let negative = ttl_from_argument(&locks, 1, -5).await.unwrap_err();
    assert!(
        matches!(negative, LockError::InvalidConfig { what: "ttl", .. }),
        "{negative:?}"
    );
    assert!(negative.to_string().contains("negative"), "{negative}");
    let zero = ttl_from_argument(&locks, 1, 0).await.unwrap_err();
    assert!(matches!(zero, LockError::InvalidConfig { .. }), "{zero:?}");
}

#[distributed_lock(read = "doc:{id}", wait = 0, manager = locks)]
async fn view(locks: &LockManager, id: u32, other: &LockManager) -> Result<LockMode, LockError> {
    // Another reader is let in beside this one; a writer is not.
    other
        .read_lock(format!("doc:{id}"))
        .wait(Duration::ZERO)
        .acquire()
        .await?
        .release()
        .await?;
    let writer = other
        .lock(format!("doc:{id}"))
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(writer, Err(LockError::NotAcquired { .. })),
        "{writer:?}"
    );
    Ok(other
        .inspect(&format!("doc:{id}"))
        .await?
        .map_or(LockMode::Exclusive, |info| info.mode))
}

#[distributed_lock("doc:{id}", wait = 0, manager = locks)]
async fn edit(locks: &LockManager, id: u32) -> Result<(), LockError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("report:{id}", read = ["doc:{id}", "stock:{id}"], wait = 0, manager = locks)]
async fn build_report(locks: &LockManager, id: u32, other: &LockManager) -> Result<(), LockError> {
    let report = other
        .lock(format!("report:{id}"))
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(report, Err(LockError::NotAcquired { .. })),
        "{report:?}"
    );
    for shared in [format!("doc:{id}"), format!("stock:{id}")] {
        other
            .read_lock(shared.as_str())
            .wait(Duration::ZERO)
            .acquire()
            .await?
            .release()
            .await?;
        let writer = other.lock(shared).wait(Duration::ZERO).acquire().await;
        assert!(
            matches!(writer, Err(LockError::NotAcquired { .. })),
            "{writer:?}"
        );
    }
    Ok(())
}

#[distributed_lock(read = "doc:{id}", manager = locks)]
async fn view_then_edit(locks: &LockManager, id: u32) -> Result<(), LockError> {
    edit(locks, id).await
}

#[tokio::test]
async fn annotated_read_keys_are_shared_taken_with_the_exclusive_keys_and_never_upgraded() {
    let server = RedisServer::start();
    let (locks, other) = (server.manager(), server.manager());
    assert_eq!(view(&locks, 1, &other).await.unwrap(), LockMode::Shared);
    // Beside a reader that holds on, the annotated reader still gets in; the writer does not.
    let reader = other.read_lock("doc:1").acquire().await.unwrap();
    assert_eq!(view(&locks, 1, &other).await.unwrap(), LockMode::Shared);
    let writer = edit(&locks, 1).await;
    assert!(
        matches!(writer, Err(LockError::NotAcquired { .. })),
        "{writer:?}"
    );
    // Exclusive and shared keys together: the shared one is held by `reader` too.
    build_report(&locks, 1, &other).await.unwrap();
    reader.release().await.unwrap();
    // A writer waits for nothing once the readers are gone.
    edit(&locks, 1).await.unwrap();
    let upgrade = view_then_edit(&locks, 1).await;
    assert!(
        matches!(upgrade, Err(LockError::UpgradeNotSupported { ref key }) if key == "doc:1"),
        "{upgrade:?}"
    );
}

#[distributed_lock("exports", permits = 2, wait = 0, manager = locks)]
async fn export(locks: &LockManager, other: &LockManager) -> Result<LockMode, LockError> {
    Ok(other
        .inspect("exports")
        .await?
        .map_or(LockMode::Exclusive, |info| info.mode))
}

#[distributed_lock("exports", permits = n, wait = 0, manager = locks)]
async fn export_up_to(locks: &LockManager, n: i64, ran: &AtomicU64) -> Result<(), LockError> {
    let _ = n;
    ran.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn annotated_permits_admit_that_many_holders_and_refuse_a_bad_count_at_the_call() {
    let server = RedisServer::start();
    let (locks, other) = (server.manager(), server.manager());
    let first = other.lock("exports").permits(2).acquire().await.unwrap();
    assert_eq!(export(&locks, &other).await.unwrap(), LockMode::Permits(2));
    let second = other.lock("exports").permits(2).acquire().await.unwrap();
    let full = export(&locks, &other).await;
    assert!(
        matches!(full, Err(LockError::NotAcquired { .. })),
        "{full:?}"
    );
    // A count from an argument, converted at each call.
    let ran = AtomicU64::new(0);
    export_up_to(&locks, 3, &ran).await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    for bad in [0, -1, i64::from(u32::MAX) + 1] {
        let refused = export_up_to(&locks, bad, &ran).await;
        assert!(
            matches!(
                refused,
                Err(LockError::InvalidConfig {
                    what: "permits",
                    ..
                })
            ),
            "{bad}: {refused:?}"
        );
    }
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the body ran with a bad count"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
}

/// `lease = lease`: the token Redis holds for the key, with the keys it covers.
#[distributed_lock("account:{id}", manager = locks, lease = lease)]
async fn fenced(locks: &LockManager, id: u32) -> Result<(u64, Vec<String>, u64), LockError> {
    let held = locks
        .inspect(&format!("account:{id}"))
        .await?
        .expect("held");
    Ok((
        lease.fencing_token(),
        lease.keys().to_vec(),
        held.fencing_token,
    ))
}

/// Holds `a:{id}`, then `b:{id}` inside, then `a:{id}` again (re-entered) inside that: the
/// innermost body's lease is the one holding `a`, not the `b` lease between them.
#[distributed_lock("a:{id}", manager = locks, lease = lease)]
async fn a_then_b(locks: &LockManager, id: u32) -> Result<(u64, u64, u64), LockError> {
    let (b, again) = b_then_a(locks, id).await?;
    Ok((lease.fencing_token(), b, again))
}

#[distributed_lock("b:{id}", manager = locks, lease = lease)]
async fn b_then_a(locks: &LockManager, id: u32) -> Result<(u64, u64), LockError> {
    Ok((lease.fencing_token(), a_again(locks, id).await?))
}

#[distributed_lock("a:{id}", manager = locks, lease = lease)]
async fn a_again(locks: &LockManager, id: u32) -> Result<u64, LockError> {
    let _ = id;
    assert_eq!(current_lease().as_ref(), Some(&lease));
    Ok(lease.fencing_token())
}

/// Holds `a:{id}`, then asks for `a:{id}` and `c:{id}`: the new lease covers `c` alone.
#[distributed_lock("a:{id}", manager = locks)]
async fn a_then_a_and_c(locks: &LockManager, id: u32) -> Result<Vec<String>, LockError> {
    a_and_c(locks, id).await
}

#[distributed_lock(["a:{id}", "c:{id}"], manager = locks, lease = lease)]
async fn a_and_c(locks: &LockManager, id: u32) -> Result<Vec<String>, LockError> {
    let _ = id;
    Ok(lease.keys().to_vec())
}

#[tokio::test]
async fn the_lease_binding_is_the_lease_holding_the_bodys_keys() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let (token, keys, in_redis) = fenced(&locks, 7).await.unwrap();
    assert_eq!(keys, ["account:7"]);
    assert_eq!(
        token, in_redis,
        "the binding's token is the one Redis holds for the key"
    );
    let (later, _, _) = fenced(&locks, 7).await.unwrap();
    assert!(
        later > token,
        "a later holder's token {later} is above {token}"
    );

    let (a, b, again) = a_then_b(&locks, 1).await.unwrap();
    assert_ne!(a, b);
    assert_eq!(again, a, "re-entering a:1 under b:1 runs under a:1's lease");

    assert_eq!(a_then_a_and_c(&locks, 1).await.unwrap(), ["c:1"]);
}
