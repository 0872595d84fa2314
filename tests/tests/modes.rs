//! Read-write locks and semaphores on one server: readers share and writers exclude, each holder
//! has a lease of its own, fair arrival order over readers and writers, permits, fencing,
//! re-entrancy, and what an operator sees and can break.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_runtime::{LockError, LockManager, LockMode, HANDOFF_CLAIM};
use distlock_tests::RedisServer;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(30);

/// The names of the keys on `server` that match `pattern`.
async fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut conn = server.client().await;
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Readers and writers inside one key, and whether the two ever met.
#[derive(Default)]
struct Room {
    readers: AtomicU32,
    writers: AtomicU32,
    most_readers: AtomicU32,
    violations: AtomicU64,
}

impl Room {
    fn read(&self) -> Guard<'_> {
        let readers = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(readers, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        Guard(self, false)
    }

    fn write(&self) -> Guard<'_> {
        let writers = self.writers.fetch_add(1, Ordering::SeqCst) + 1;
        if writers > 1 || self.readers.load(Ordering::SeqCst) > 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        Guard(self, true)
    }
}

struct Guard<'a>(&'a Room, bool);

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let count = if self.1 {
            &self.0.writers
        } else {
            &self.0.readers
        };
        count.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn readers_share_a_key_and_a_writer_excludes_them() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let first = locks.read_lock("doc").ttl(LONG).acquire().await.unwrap();
    let second = locks
        .read_lock("doc")
        .ttl(LONG)
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("a second reader enters beside the first");
    assert!(second.fencing_token() > first.fencing_token());
    let writer = locks.lock("doc").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(writer, Err(LockError::NotAcquired { ref key }) if key == "doc"),
        "{writer:?}"
    );
    first.release().await.unwrap();
    let writer = locks.lock("doc").wait(Duration::ZERO).acquire().await;
    assert!(writer.is_err(), "one reader is left");
    second.release().await.unwrap();
    let writer = locks
        .lock("doc")
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free once both readers left");
    let reader = locks.read_lock("doc").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(reader, Err(LockError::NotAcquired { .. })),
        "{reader:?}"
    );
    writer.release().await.unwrap();
    // Nothing is left behind.
    let left = keys(&server, "*").await;
    assert!(
        left.iter()
            .all(|k| !k.starts_with("distlock:lock:") && !k.starts_with("distlock:holders:")),
        "{left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_readers_and_some_writers_never_meet() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let room = Arc::new(Room::default());
    let mut tasks = Vec::new();
    for i in 0..24 {
        let locks = server.manager();
        let room = Arc::clone(&room);
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let room = Arc::clone(&room);
                if i % 6 == 0 {
                    locks
                        .lock("shelf")
                        .wait(LONG)
                        .run(async move {
                            let _inside = room.write();
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        })
                        .await
                        .unwrap();
                } else {
                    locks
                        .read_lock("shelf")
                        .wait(LONG)
                        .run(async move {
                            let _inside = room.read();
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        })
                        .await
                        .unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(room.violations.load(Ordering::SeqCst), 0);
    assert!(
        room.most_readers.load(Ordering::SeqCst) > 1,
        "readers ran together"
    );
}

/// A reader of `key` that crashes holding it: its lease, taken for `ttl`, is never renewed nor
/// released.
async fn crash_a_reader(locks: &LockManager, key: &str, ttl: Duration) {
    let crashed = locks
        .read_lock(key)
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(crashed);
}

#[tokio::test]
async fn a_crashed_readers_share_frees_at_its_own_ttl_while_another_reader_renews() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let ttl = Duration::from_millis(600);
    crash_a_reader(&locks, "doc", ttl).await;
    let live = locks.read_lock("doc").ttl(ttl).acquire().await.unwrap();
    assert_eq!(locks.inspect("doc").await.unwrap().unwrap().holders, 2);
    tokio::time::sleep(ttl * 3).await;
    let info = locks
        .inspect("doc")
        .await
        .unwrap()
        .expect("the live reader holds it");
    assert_eq!(
        info.holders, 1,
        "the crashed reader's share expired: {info:?}"
    );
    assert!(!live.is_lost());
    // A writer waits for the live reader only.
    let started = Instant::now();
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("doc").wait(LONG).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    live.release().await.unwrap();
    let writer = writer
        .await
        .unwrap()
        .expect("the writer gets in at the release");
    assert!(started.elapsed() < Duration::from_secs(2));
    writer.release().await.unwrap();
    // And the holders key expired with its last member.
    let left = keys(&server, "*holders*").await;
    assert!(left.is_empty(), "{left:?}");
}

/// A reader that renews keeps writers out for as long as it holds the key, long past its first
/// ttl: its renewal moves the lock key's `holders` on with its member, so a writer's `SET NX`
/// keeps failing; and at its release the writer gets in at once.
#[tokio::test]
async fn a_renewing_reader_keeps_writers_out_past_its_ttl_and_lets_one_in_at_its_release() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let ttl = Duration::from_millis(600);
    let reader = locks.read_lock("kept").ttl(ttl).acquire().await.unwrap();
    let until = Instant::now() + ttl * 4;
    while Instant::now() < until {
        let writer = locks.try_lock("kept").acquire().await;
        assert!(
            matches!(writer, Err(LockError::NotAcquired { .. })),
            "a writer got in beside a live reader: {writer:?}"
        );
        let value: Option<String> = redis::AsyncCommands::get(&mut conn, "distlock:lock:{kept}")
            .await
            .unwrap();
        assert_eq!(value.as_deref(), Some("holders"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!reader.is_lost());
    reader.release().await.unwrap();
    let writer = locks
        .try_lock("kept")
        .acquire()
        .await
        .expect("free at the reader's release");
    writer.release().await.unwrap();
}

/// A crashed reader's expired member no longer counts as a holder: a writer already waiting
/// behind it and a live reader is handed the key at the live reader's release, not when the
/// holders key itself expires (the live reader's 5 s ttl keeps it that long).
#[tokio::test]
async fn a_writer_waiting_behind_a_crashed_reader_is_handed_the_key_at_the_live_readers_release() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let ttl = Duration::from_millis(300);
    crash_a_reader(&locks, "doc", ttl).await;
    let crashed_at = Instant::now();
    let live = locks
        .read_lock("doc")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let writer = distlock_tests::spawn_waiter(&locks, "doc", Duration::from_secs(10));
    distlock_tests::until_queued(&server.client().await, "doc", 1).await;
    tokio::time::sleep_until(crashed_at + ttl * 2).await;
    assert!(!writer.is_finished(), "{:?}", writer.await);
    let released = Instant::now();
    live.release().await.unwrap();
    let (acquired, writer) = writer.await.unwrap();
    let writer = writer.expect("the writer gets the key");
    let waited = acquired.duration_since(released.into_std());
    println!("the writer got the key {waited:?} after the live reader's release");
    assert!(
        waited < Duration::from_secs(1),
        "the writer got the key {waited:?} after the live reader left (the crashed reader's \
         {ttl:?} had long passed)"
    );
    writer.release().await.unwrap();
}

#[tokio::test]
async fn every_key_a_shared_lease_writes_expires() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let lease = locks
        .read_lock("doc")
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let semaphore = locks
        .lock("pool")
        .permits(3)
        .ttl(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let names = keys(&server, "*").await;
    assert!(
        names.iter().any(|n| n.contains("holders:{doc}")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.contains("holders:{pool}")),
        "{names:?}"
    );
    let mut conn = server.client().await;
    for name in names {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&name)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 0 && pttl <= 5_000 + 60_000, "{name}: {pttl}");
    }
    drop((lease, semaphore));
}

#[tokio::test]
async fn fair_readers_and_writers_are_served_in_arrival_order() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first = locks.read_lock("doc").ttl(LONG).acquire().await.unwrap();
    let spawn = |name: &'static str, exclusive: bool, hold: Duration| {
        let locks = locks.clone();
        let order = Arc::clone(&order);
        tokio::spawn(async move {
            let request = if exclusive {
                locks.lock("doc")
            } else {
                locks.read_lock("doc")
            };
            request
                .wait(LONG)
                .ttl(LONG)
                .run(async move {
                    order.lock().unwrap().push(format!("{name} in"));
                    tokio::time::sleep(hold).await;
                    order.lock().unwrap().push(format!("{name} out"));
                })
                .await
        })
    };
    let mut conn = server.client().await;
    let writer = spawn("writer", true, Duration::from_millis(300));
    distlock_tests::until_queued(&conn, "doc", 1).await;
    // Readers that came after the writer wait for it, though only readers hold the key.
    let late = spawn("late reader", false, Duration::from_millis(50));
    let later = spawn("later reader", false, Duration::from_millis(50));
    distlock_tests::until_queued(&conn, "doc", 3).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        order.lock().unwrap().is_empty(),
        "{:?}",
        order.lock().unwrap()
    );
    first.release().await.unwrap();
    for task in [writer, late, later] {
        task.await.unwrap().unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(&order[..2], ["writer in", "writer out"], "{order:?}");
    // The two readers queued behind the writer were handed the key together.
    assert!(
        order[2].ends_with("in") && order[3].ends_with("in"),
        "{order:?}"
    );
    assert_eq!(distlock_tests::queued(&mut conn, "doc").await, 0);
    assert!(locks.stats().handed_over >= 3, "{:?}", locks.stats());
}

#[tokio::test]
async fn a_semaphore_admits_at_most_n_and_a_release_wakes_a_waiter() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            locks
                .lock("pool")
                .permits(3)
                .ttl(LONG)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let fourth = locks
        .lock("pool")
        .permits(3)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(fourth, Err(LockError::NotAcquired { .. })),
        "{fourth:?}"
    );
    let info = locks.inspect("pool").await.unwrap().unwrap();
    assert_eq!((info.mode, info.holders), (LockMode::Permits(3), 3));
    // Fair and unfair waiters alike are woken by a release (the leases run 30 s).
    for fair in [true, false] {
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let lease = locks
                    .lock("pool")
                    .permits(3)
                    .fair(fair)
                    .ttl(LONG)
                    .wait(LONG)
                    .acquire()
                    .await;
                (lease, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        held.remove(0).release().await.unwrap();
        let (lease, woke) = waiter.await.unwrap();
        held.push(lease.unwrap());
        let after = woke - released;
        assert!(
            after < Duration::from_millis(700),
            "fair={fair}: woken {after:?} after"
        );
    }
    assert_eq!(locks.inspect("pool").await.unwrap().unwrap().holders, 3);
    for lease in held {
        lease.release().await.unwrap();
    }
    assert!(locks.inspect("pool").await.unwrap().is_none());
}

#[tokio::test]
async fn callers_with_different_n_are_each_admitted_below_their_own_n() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            locks
                .lock("pool")
                .permits(2)
                .ttl(LONG)
                .acquire()
                .await
                .unwrap(),
        );
    }
    // A caller with 2 is out, one with 4 is in (2 held < 4)...
    let two = locks
        .lock("pool")
        .permits(2)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(two.is_err());
    held.push(
        locks
            .lock("pool")
            .permits(4)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap(),
    );
    held.push(
        locks
            .lock("pool")
            .permits(4)
            .wait(Duration::ZERO)
            .acquire()
            .await
            .unwrap(),
    );
    // ...until 4 are held: never more than the largest n.
    let five = locks
        .lock("pool")
        .permits(4)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(five.is_err());
    assert_eq!(locks.inspect("pool").await.unwrap().unwrap().holders, 4);
    // Three released: one held, so a caller with 2 is in again.
    for lease in held.drain(1..) {
        lease.release().await.unwrap();
    }
    let two = locks
        .lock("pool")
        .permits(2)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(two.is_ok(), "{two:?}");
}

#[tokio::test]
async fn fencing_tokens_rise_in_grant_order_whatever_the_mode_and_after_data_loss() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut last = 0;
    let mut check = |token: u64, what: &str| {
        assert!(token > last, "{what}: {token} after {last}");
        last = token;
    };
    let a = locks.read_lock("doc").acquire().await.unwrap();
    check(a.fencing_token(), "first reader");
    let b = locks.read_lock("doc").acquire().await.unwrap();
    check(b.fencing_token(), "second reader");
    a.release().await.unwrap();
    b.release().await.unwrap();
    let w = locks.lock("doc").acquire().await.unwrap();
    check(w.fencing_token(), "writer");
    w.release().await.unwrap();
    let p = locks.lock("doc").permits(2).acquire().await.unwrap();
    check(p.fencing_token(), "permit");
    p.release().await.unwrap();
    server.command(&["FLUSHALL"]);
    let r = locks.read_lock("doc").acquire().await.unwrap();
    check(r.fencing_token(), "reader after the data was lost");
    r.release().await.unwrap();
}

#[tokio::test]
async fn nesting_reenters_a_held_mode_and_refuses_an_upgrade_at_once() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let inner = locks.clone();
    locks
        .read_lock("doc")
        .run(async {
            // Shared in shared: the same lease, no second holder.
            inner
                .read_lock("doc")
                .wait(Duration::ZERO)
                .run(async {
                    let info = inner.inspect("doc").await.unwrap().unwrap();
                    assert_eq!(info.holders, 1);
                })
                .await
                .unwrap();
            // Exclusive in shared: refused at once, not after the wait.
            let started = Instant::now();
            let upgrade = inner.lock("doc").wait(LONG).run(async {}).await;
            assert!(
                matches!(upgrade, Err(LockError::UpgradeNotSupported { ref key }) if key == "doc"),
                "{upgrade:?}"
            );
            assert!(started.elapsed() < Duration::from_secs(1));
        })
        .await
        .unwrap();
    locks
        .lock("doc")
        .run(async {
            // A downgrade re-enters the exclusive lease.
            inner
                .read_lock("doc")
                .wait(Duration::ZERO)
                .run(async {
                    let info = inner.inspect("doc").await.unwrap().unwrap();
                    assert_eq!(info.mode, LockMode::Exclusive);
                })
                .await
                .unwrap();
        })
        .await
        .unwrap();
    locks
        .lock("pool")
        .permits(1)
        .run(async {
            inner
                .lock("pool")
                .permits(1)
                .wait(Duration::ZERO)
                .run(async {})
                .await
                .expect("a permit in its own permit re-enters");
            let exclusive = inner.lock("pool").run(async {}).await;
            assert!(matches!(
                exclusive,
                Err(LockError::UpgradeNotSupported { .. })
            ));
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn exclusive_and_shared_keys_are_taken_together_or_not_at_all() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let other = server.manager();
    // Another owner writes `b`: a request that writes `a` and reads `b` takes neither.
    let b = other.lock("b").ttl(LONG).acquire().await.unwrap();
    let both = locks
        .lock_all(["a"])
        .read_keys(["b"])
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(both, Err(LockError::NotAcquired { ref key }) if key == "b"),
        "{both:?}"
    );
    assert!(locks.inspect("a").await.unwrap().is_none(), "nothing taken");
    b.release().await.unwrap();
    // Another reader of `b` does not keep it out.
    let reader = other.read_lock("b").ttl(LONG).acquire().await.unwrap();
    let both = locks
        .lock_all(["a"])
        .read_keys(["b"])
        .acquire()
        .await
        .unwrap();
    assert_eq!(both.keys(), ["a", "b"]);
    assert_eq!(
        locks.inspect("a").await.unwrap().unwrap().mode,
        LockMode::Exclusive
    );
    let b_info = locks.inspect("b").await.unwrap().unwrap();
    assert_eq!((b_info.mode, b_info.holders), (LockMode::Shared, 2));
    // Renewal and release cover both modes.
    both.extend(Duration::from_secs(60)).await.unwrap();
    both.release().await.unwrap();
    assert!(locks.inspect("a").await.unwrap().is_none());
    assert_eq!(locks.inspect("b").await.unwrap().unwrap().holders, 1);
    reader.release().await.unwrap();
}

#[tokio::test]
async fn an_operator_sees_mode_holders_and_labels_and_can_free_every_holder() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let web = server
        .manager_builder()
        .holder_label("web-1")
        .build()
        .unwrap();
    let job = server
        .manager_builder()
        .holder_label("job-2")
        .build()
        .unwrap();
    let ttl = Duration::from_millis(900);
    let a = web.read_lock("doc").ttl(ttl).acquire().await.unwrap();
    let b = job.read_lock("doc").ttl(ttl).acquire().await.unwrap();
    let p = web
        .lock("pool")
        .permits(5)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let info = web.inspect("doc").await.unwrap().unwrap();
    assert_eq!((info.mode, info.holders), (LockMode::Shared, 2));
    let mut labels = info.holder_labels.clone();
    labels.sort();
    assert_eq!(labels, ["job-2", "web-1"]);
    assert!(info.fencing_token >= b.fencing_token());
    let held = web.held_locks("*").await.unwrap();
    let listed: Vec<(&str, LockMode, usize)> = held
        .iter()
        .map(|i| (i.key.as_str(), i.mode, i.holders))
        .collect();
    assert_eq!(
        listed,
        [
            ("doc", LockMode::Shared, 2),
            ("pool", LockMode::Permits(5), 1)
        ]
    );
    // Breaking the shared lock frees both readers, who learn it at their next renewal.
    assert!(web.force_release("doc").await.unwrap());
    assert!(web.inspect("doc").await.unwrap().is_none());
    let writer = job.lock("doc").wait(Duration::ZERO).acquire().await;
    assert!(writer.is_ok(), "{writer:?}");
    for lease in [&a, &b] {
        tokio::time::timeout(Duration::from_secs(3), lease.lost())
            .await
            .expect("the reader learns its loss at its next renewal");
    }
    assert!(web.force_release("pool").await.unwrap());
    tokio::time::timeout(Duration::from_secs(3), p.lost())
        .await
        .expect("the permit holder learns its loss");
    assert!(
        !web.force_release("pool").await.unwrap(),
        "nothing left to free"
    );
}

#[tokio::test]
async fn bad_mode_requests_are_refused_with_a_clear_error() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks: LockManager = server.manager();
    for request in [
        locks.lock("pool").permits(0),
        locks.lock_all(["a", "b"]).permits(2),
        locks.lock("pool").permits(2).read_keys(["doc"]),
    ] {
        let refused = request.acquire().await;
        match refused {
            Err(
                error @ LockError::InvalidConfig {
                    what: "permits", ..
                },
            ) => {
                assert!(error.to_string().contains("permit"), "{error}");
            }
            other => panic!("{other:?}"),
        }
    }
    let empty = locks.read_lock("").acquire().await;
    assert!(
        matches!(empty, Err(LockError::InvalidKey { .. })),
        "{empty:?}"
    );
}

#[tokio::test]
async fn an_unfair_reader_never_overtakes_a_queued_fair_writer() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let conn = server.client().await;
    let reader = locks.read_lock("doc").ttl(LONG).acquire().await.unwrap();
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("doc").wait(LONG).acquire().await })
    };
    distlock_tests::until_queued(&conn, "doc", 1).await;
    // Only a reader holds the key, but a writer is queued: an unfair reader waits too.
    let unfair = locks
        .read_lock("doc")
        .fair(false)
        .wait(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(unfair, Err(LockError::NotAcquired { .. })),
        "{unfair:?}"
    );
    let unfair = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .read_lock("doc")
                .fair(false)
                .wait(LONG)
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    reader.release().await.unwrap();
    let writer = writer.await.unwrap().unwrap();
    assert!(!unfair.is_finished(), "the writer holds the key");
    writer.release().await.unwrap();
    let unfair = tokio::time::timeout(Duration::from_secs(2), unfair)
        .await
        .expect("the unfair reader is woken by the writer's release")
        .unwrap();
    assert!(unfair.is_ok(), "{unfair:?}");
}

#[tokio::test]
async fn an_unfair_writer_is_kept_out_while_readers_keep_overlapping() {
    // What the docs say of unfair requests: a writer has no place in line, so readers that
    // always overlap keep it out until its wait runs out; a fair writer gets in after the
    // readers that came before it.
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..2u64 {
        let locks = locks.clone();
        let stop = Arc::clone(&stop);
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100 * i)).await;
            while !stop.load(Ordering::SeqCst) {
                // Each holds 200 ms, the two half a period apart: the key is never free.
                let lease = locks
                    .read_lock("doc")
                    .fair(false)
                    .wait(LONG)
                    .acquire()
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                lease.release().await.unwrap();
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let unfair = locks
        .lock("doc")
        .fair(false)
        .wait(Duration::from_millis(1500))
        .acquire()
        .await;
    assert!(
        matches!(unfair, Err(LockError::Timeout { .. })),
        "{unfair:?}"
    );
    let started = Instant::now();
    let fair = locks.lock("doc").wait(LONG).acquire().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "a fair writer waits only for the readers ahead of it: {:?}",
        started.elapsed()
    );
    stop.store(true, Ordering::SeqCst);
    fair.release().await.unwrap();
    for reader in readers {
        reader.await.unwrap();
    }
}

/// A program written against the contract's names alone (`DESIGN.md`, "Read-write locks and
/// semaphores"): the attribute's `read` and `permits`, `read_lock`, `read_keys`, `permits`,
/// `UpgradeNotSupported`, and `LockInfo::{mode, holders}` matched on every `LockMode`.
mod contract {
    use distlock_runtime::{distributed_lock, LockError, LockManager, LockMode};

    #[distributed_lock(read = "doc:{id}", manager = locks)]
    pub async fn read(locks: &LockManager, id: u64) -> Result<usize, LockError> {
        Ok(locks
            .inspect(&format!("doc:{id}"))
            .await?
            .map_or(0, |i| i.holders))
    }

    #[distributed_lock("report:{id}", read = ["doc:{id}"], manager = locks)]
    pub async fn write_report(locks: &LockManager, id: u64) -> Result<LockMode, LockError> {
        let info = locks.inspect(&format!("report:{id}")).await?;
        Ok(info.map_or(LockMode::Shared, |i| i.mode))
    }

    #[distributed_lock("pool", permits = 2, manager = locks)]
    pub async fn export(locks: &LockManager) -> Result<String, LockError> {
        let info = locks.inspect("pool").await?.expect("held");
        Ok(match info.mode {
            LockMode::Exclusive => "exclusive".to_owned(),
            LockMode::Shared => "shared".to_owned(),
            LockMode::Permits(n) => format!("{} of {n}", info.holders),
        })
    }
}

#[tokio::test]
async fn a_program_written_against_the_contract_compiles_and_passes() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    assert_eq!(contract::read(&locks, 1).await.unwrap(), 1);
    assert_eq!(
        contract::write_report(&locks, 1).await.unwrap(),
        LockMode::Exclusive
    );
    assert_eq!(contract::export(&locks).await.unwrap(), "1 of 2");
    let both = locks
        .lock_all(["a"])
        .read_keys(["b"])
        .acquire()
        .await
        .unwrap();
    let upgrade = locks
        .read_lock("c")
        .run(async { locks.lock("c").run(async {}).await })
        .await
        .unwrap();
    assert!(matches!(upgrade, Err(LockError::UpgradeNotSupported { ref key }) if key == "c"));
    both.release().await.unwrap();
    let permit = locks.lock("pool").permits(2).acquire().await.unwrap();
    permit.release().await.unwrap();
}

#[tokio::test]
async fn a_shared_or_permit_lease_takes_one_round_trip_to_acquire_and_one_to_release() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    distlock_tests::warm_up(&locks).await;
    fn shared(locks: &LockManager) -> distlock_runtime::LockRequest {
        locks.read_lock("trip")
    }
    fn permit(locks: &LockManager) -> distlock_runtime::LockRequest {
        locks.lock("trip").permits(3)
    }
    type Request = fn(&LockManager) -> distlock_runtime::LockRequest;
    for fair in [true, false] {
        for request in [shared as Request, permit] {
            // Scripts loaded first: a lock cycle is what is counted.
            let lease = request(&locks).fair(fair).acquire().await.unwrap();
            lease.release().await.unwrap();
            let before = server.requests();
            let lease = request(&locks).fair(fair).acquire().await.unwrap();
            assert_eq!(server.requests() - before, 1, "acquire, fair {fair}");
            let before = server.requests();
            lease.release().await.unwrap();
            assert_eq!(server.requests() - before, 1, "release, fair {fair}");
        }
    }
}

#[tokio::test]
async fn a_reader_handed_the_key_keeps_it_past_the_claim() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let conn = server.client().await;
    let writer = locks.lock("doc").ttl(LONG).acquire().await.unwrap();
    let reader = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .read_lock("doc")
                .ttl(Duration::from_secs(6))
                .wait(LONG)
                .run(async {
                    // Past the hand-off's claim: held still only if it was extended to the ttl.
                    tokio::time::sleep(HANDOFF_CLAIM + Duration::from_secs(1)).await;
                    locks.inspect("doc").await
                })
                .await
        })
    };
    distlock_tests::until_queued(&conn, "doc", 1).await;
    writer.release().await.unwrap();
    let info = reader
        .await
        .unwrap()
        .expect("the handed share outlives its claim")
        .unwrap()
        .expect("the reader holds the key past the claim");
    assert_eq!((info.mode, info.holders), (LockMode::Shared, 1));
    assert!(info.remaining > Duration::from_secs(1), "{info:?}");
    // The reader learns of the hand-off by its message, or, when the release came before its
    // subscription did, by the attempt it makes once subscribed (which finds the key its own):
    // `handed_over` counts only the first, so it is not asserted here.
}
