//! Ownership: only the owner releases or extends; a vanished holder's lock ends with its ttl;
//! bad input is refused with its own error.

use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager};
use distlock_tests::{exists, until_gone, RedisServer};
use redis::AsyncCommands;

#[tokio::test]
async fn a_non_owner_release_and_extend_change_nothing() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let key = locks.redis_key("shared");

    // A's lease runs out; B takes the lock. A still has its Lease value.
    let (stale, owner) = distlock_tests::outlived(&locks, "shared").await;
    let owner_token: String = conn.get(&key).await.unwrap();
    let pttl_before: i64 = conn.pttl(&key).await.unwrap();

    let extended = stale.extend(Duration::from_secs(60)).await;
    assert!(
        matches!(extended, Err(LockError::LeaseLost { .. })),
        "{extended:?}"
    );
    stale.release().await.unwrap();

    let token_after: String = conn.get(&key).await.unwrap();
    let pttl_after: i64 = conn.pttl(&key).await.unwrap();
    assert_eq!(token_after, owner_token, "the owner's lock must survive");
    assert!(
        pttl_after <= pttl_before && pttl_after > 4_000,
        "{pttl_before} -> {pttl_after}"
    );
    assert!(owner.fencing_token() > 0);
    owner.release().await.unwrap();
    assert!(!exists(&mut conn, &key).await);
}

#[tokio::test]
async fn a_non_owner_release_leaves_a_lock_marked_as_waited_on_held() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let key = locks.redis_key("marked");

    // A's lease runs out; B takes the lock, and a waiter (of another manager) marks B's value
    // as waited on: `~` and B's token. A still has its Lease value.
    let (stale, owner) = distlock_tests::outlived(&locks, "marked").await;
    let waiting =
        distlock_tests::spawn_unfair_waiter(&server.manager(), "marked", Duration::from_secs(10));
    let marked = distlock_tests::until_marked(&conn, &key).await;
    let pttl_before: i64 = conn.pttl(&key).await.unwrap();

    // A's release must not take a marked value for its own.
    stale.release().await.unwrap();
    let after: Option<String> = conn.get(&key).await.unwrap();
    assert_eq!(
        after.as_deref(),
        Some(marked.as_str()),
        "a non-owner's release deleted (or changed) a lock marked as waited on"
    );
    let pttl_after: i64 = conn.pttl(&key).await.unwrap();
    assert!(
        pttl_after <= pttl_before && pttl_after > 4_000,
        "{pttl_before} -> {pttl_after}"
    );
    // And the waiter was not let in beside the owner.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter got the lock while its owner held it: {:?}",
        waiting.await
    );
    owner.release().await.unwrap();
    let (_, lease) = waiting.await.unwrap();
    lease.unwrap().release().await.unwrap();
}

#[tokio::test]
async fn a_leaked_lease_frees_the_lock_within_its_ttl() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut conn = server.client().await;
    let key = locks.redis_key("leaked");
    let ttl = Duration::from_millis(500);
    let started = Instant::now();
    let lease = locks
        .lock("leaked")
        .ttl(ttl)
        .renew(false)
        .acquire()
        .await
        .unwrap();
    std::mem::forget(lease);
    assert!(exists(&mut conn, &key).await);
    until_gone(&conn, &key, ttl + Duration::from_millis(300))
        .await
        .expect("lock gone");
    assert!(
        started.elapsed() <= ttl + Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    // And it can be taken again at once.
    locks
        .try_lock("leaked")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_holder_process_killed_with_sigkill_frees_the_lock_within_its_ttl() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut child = distlock_tests::holder_process(
        env!("CARGO_BIN_EXE_lock_worker"),
        &["hold", &server.url(), "killed", "1000"],
    )
    .await;
    // Held (and renewed) by the child.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let held = locks.try_lock("killed").acquire().await;
    assert!(
        matches!(held, Err(LockError::NotAcquired { .. })),
        "{held:?}"
    );

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let killed_at = Instant::now();
    let lease = locks
        .lock("killed")
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("lock freed after the holder died");
    let freed_after = killed_at.elapsed();
    assert!(
        freed_after <= Duration::from_millis(1100),
        "freed after {freed_after:?}"
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn bad_input_gets_its_own_clear_error() {
    let server = RedisServer::start();
    let locks = server.manager();

    let empty = locks.lock("").acquire().await;
    assert!(
        matches!(empty, Err(LockError::InvalidKey { .. })),
        "{empty:?}"
    );
    let none = locks.lock_all(Vec::<String>::new()).acquire().await;
    assert!(
        matches!(none, Err(LockError::InvalidKey { .. })),
        "{none:?}"
    );

    let zero = locks.lock("k").ttl(Duration::ZERO).acquire().await;
    match zero {
        Err(LockError::InvalidConfig {
            what: "ttl",
            ref reason,
        }) => {
            assert!(reason.contains("at least"), "{reason}")
        }
        other => panic!("expected InvalidConfig for ttl, got {other:?}"),
    }
    let zero_run = locks.lock("k").ttl(Duration::ZERO).run(async {}).await;
    assert!(matches!(
        zero_run,
        Err(LockError::InvalidConfig { what: "ttl", .. })
    ));

    let scheme = LockManager::from_url("http://user:hunter2@127.0.0.1:6379").unwrap_err();
    assert!(matches!(scheme, LockError::InvalidUrl { .. }), "{scheme:?}");
    let message = scheme.to_string();
    assert!(
        message.contains("`http:`") && message.contains("redis://"),
        "{message}"
    );

    for bad in [
        "http://user:hunter2@127.0.0.1:6379",
        "redis://user:hunter2@127.0.0.1:notaport",
        "redis://:hunter2@/0",
        "not a url hunter2",
    ] {
        let err = LockManager::from_url(bad).unwrap_err();
        assert!(
            matches!(err, LockError::InvalidUrl { .. }),
            "{bad}: {err:?}"
        );
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }
    let ok = LockManager::from_url("redis://user:hunter2@127.0.0.1:6379/2").unwrap();
    assert!(!format!("{ok:?}").contains("hunter2"), "{ok:?}");

    let no_timeout = LockManager::builder()
        .url(server.url())
        .response_timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(matches!(
        no_timeout,
        LockError::InvalidConfig {
            what: "response_timeout",
            ..
        }
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn a_reseeded_thread_rng_never_gives_two_leases_one_owner_token() {
    // Anything in the process may seed the thread's fastrand generator (a test, a library, a
    // fork or a restored VM snapshot repeating its state): owner tokens must not follow it.
    let server = RedisServer::start();
    let first = server.manager();
    let second = server.manager();
    fastrand::seed(7);
    let held = first.try_lock("job").acquire().await.unwrap();
    fastrand::seed(7);
    let stolen = second.try_lock("job").acquire().await;
    assert!(
        matches!(stolen, Err(LockError::NotAcquired { .. })),
        "a second holder of a held lock: {stolen:?}"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn an_acquire_that_fails_part_way_leaves_no_lock_behind() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    // A user allowed the lock keys but nothing else the acquire touches: an acquire that writes
    // the lock and then fails must not leave it held by nobody until its ttl.
    let acl = server.command(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">app-password",
        "~distlock:lock:*",
        "+@all",
    ]);
    assert!(acl.starts_with("+OK"), "{acl}");
    let port = server.port();
    let locks = LockManager::builder()
        .url(format!("redis://app:app-password@127.0.0.1:{port}"))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let outcome = locks
        .lock("job")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await;
    // Redis ran the script and refused the counter's write part way: a missing right.
    assert!(
        matches!(
            outcome,
            Err(LockError::Misconfigured {
                problem: distlock_runtime::Misconfiguration::Permissions,
                ..
            })
        ),
        "{outcome:?}"
    );
    let conn = server.client().await;
    let gone = until_gone(&conn, "distlock:lock:{job}", Duration::from_secs(2)).await;
    assert!(
        gone.is_some(),
        "the lock key is held by nobody for its 30 s ttl after {outcome:?}"
    );
}

/// Script commands a server was sent, from `INFO commandstats`: run, failed or rejected.
fn script_commands(server: &RedisServer) -> u64 {
    server
        .command(&["INFO", "commandstats"])
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_script"))
        .flat_map(|line| {
            line.split([':', ',']).filter_map(|field| {
                let (name, value) = field.split_once('=')?;
                ["calls", "rejected_calls", "failed_calls"]
                    .contains(&name)
                    .then(|| value.parse::<u64>().ok())?
            })
        })
        .sum()
}

#[tokio::test]
async fn an_acquire_refused_before_it_ran_is_not_released_in_the_background() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    // Pointed at a read-only replica (as during a failover): Redis refuses the script before
    // it runs, so nothing was written and there is nothing to release.
    let locks = replica.manager();
    let outcome = locks.lock("job").acquire().await;
    assert!(
        matches!(
            outcome,
            Err(LockError::Misconfigured {
                problem: distlock_runtime::Misconfiguration::Replica,
                ref source,
                ..
            }) if source.to_string().contains("read only replica")
        ),
        "{outcome:?}"
    );
    let after_acquire = script_commands(&replica);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        script_commands(&replica),
        after_acquire,
        "a background release followed an acquire that never ran"
    );
}
