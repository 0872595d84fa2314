//! Redis down, hung, restarted or flushed: errors within the configured timeouts, never a hang.

use std::time::{Duration, Instant};

use distlock_runtime::LockError;
use distlock_tests::{exists, lock_once, until_gone, warm_up, RedisServer};

/// Connect, response and pool-wait timeouts of the managers in these tests.
const TIMEOUT: Duration = Duration::from_millis(500);

/// A manager for `server` with [`TIMEOUT`] everywhere.
fn fast_manager(server: &RedisServer) -> distlock_runtime::LockManager {
    server.manager_with_timeouts(TIMEOUT).build().unwrap()
}

#[tokio::test]
async fn redis_down_is_an_error_within_the_connect_timeout() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    server.kill();
    let started = Instant::now();
    let outcome = locks.lock("down").acquire().await;
    let took = started.elapsed();
    assert!(
        outcome.as_ref().is_err_and(LockError::is_unavailable),
        "{outcome:?}"
    );
    assert!(
        took <= TIMEOUT + Duration::from_millis(250),
        "failed after {took:?}"
    );
    let message = outcome.unwrap_err().to_string();
    assert!(message.contains("Redis"), "{message}");
}

#[tokio::test]
async fn redis_paused_is_an_error_within_the_response_timeout() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    warm_up(&locks).await;
    server.pause();

    // On the open connection: the response timeout.
    let started = Instant::now();
    let outcome = locks.lock("paused").acquire().await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::RedisTimeout { .. })),
        "{outcome:?}"
    );
    assert!(
        took <= TIMEOUT + Duration::from_millis(250),
        "failed after {took:?}"
    );

    // A manager that must connect first: bounded by pool wait + connect timeouts.
    let fresh = fast_manager(&server);
    let started = Instant::now();
    let outcome = fresh.lock("paused").acquire().await;
    let took = started.elapsed();
    assert!(
        outcome.as_ref().is_err_and(LockError::is_unavailable),
        "{outcome:?}"
    );
    assert!(
        took <= 2 * TIMEOUT + Duration::from_millis(250),
        "failed after {took:?}"
    );

    server.resume();
    // The acquires that timed out reached Redis once it resumed: they count as "maybe
    // acquired", and their token-checked release (retried in the background) removes them.
    let mut conn = server.client().await;
    let key = locks.redis_key("paused");
    let cleaned = until_gone(&conn, &key, Duration::from_secs(2)).await;
    assert!(cleaned.is_some(), "the in-doubt acquire was not cleaned up");
    // It did land: the acquire script that ran on resume drew a fencing token, whose counter
    // stays (a release leaves it), so the lock key was set and then released.
    assert!(
        exists(&mut conn, "distlock:fence:{paused}").await,
        "the timed-out acquire never ran: nothing was cleaned up"
    );
    // And the manager recovers.
    let lease = locks
        .lock("paused")
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("recovered after resume");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn redis_restarted_mid_lease_gives_the_holder_lease_lost() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    let started = Instant::now();
    let (outcome, ()) = tokio::join!(
        locks
            .lock("restarted")
            .ttl(Duration::from_millis(900))
            .run(tokio::time::sleep(Duration::from_secs(10))),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            server.restart();
        }
    );
    assert!(
        matches!(outcome, Err(LockError::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The manager reconnects to the new server.
    lock_once(&locks, "restarted").await;
}

#[tokio::test]
async fn script_flush_mid_run_does_not_break_calls() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = fast_manager(&server);
    let key = locks.redis_key("flushed");
    locks
        .lock("flushed")
        .ttl(Duration::from_millis(300))
        .run(async {
            server.command(&["SCRIPT", "FLUSH"]);
            // Long enough for renewals (every 100 ms) to run the flushed script again.
            tokio::time::sleep(Duration::from_millis(500)).await;
        })
        .await
        .expect("renewal reloaded its script");
    let mut conn = server.client().await;
    assert!(
        !exists(&mut conn, &key).await,
        "release reloaded its script"
    );
    server.command(&["SCRIPT", "FLUSH"]);
    let lease = locks
        .lock("flushed")
        .acquire()
        .await
        .expect("acquire reloads its script");
    server.command(&["SCRIPT", "FLUSH"]);
    lease
        .extend(Duration::from_secs(5))
        .await
        .expect("extend reloads its script");
    lease.release().await.unwrap();
    server.command(&["SCRIPT", "FLUSH"]);
    let all = locks
        .lock_all(["flushed-a", "flushed-b"])
        .acquire()
        .await
        .expect("the multi-key acquire reloads its script");
    all.release().await.unwrap();
}

#[tokio::test]
async fn the_first_lock_after_a_restart_succeeds_on_a_fresh_connection() {
    let _load = distlock_tests::timed().await;
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    lock_once(&locks, "idle").await;
    // The manager's connection dies while idle.
    server.restart();
    let lease = locks
        .lock("idle")
        .acquire()
        .await
        .expect("no error from a stale connection");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_server_that_accepts_but_never_answers_is_an_error_within_the_timeouts() {
    let _load = distlock_tests::timed().await;
    // The kernel completes TCP handshakes into the backlog; nothing ever reads or answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let locks = distlock_tests::manager_at(&url, TIMEOUT).build().unwrap();
    let started = Instant::now();
    let outcome = locks.lock("silent").acquire().await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::RedisTimeout { .. })),
        "{outcome:?}"
    );
    assert!(
        took <= 2 * TIMEOUT + Duration::from_millis(250),
        "failed after {took:?}"
    );
}

#[tokio::test]
async fn a_callers_pool_switched_to_another_database_does_not_move_the_locks() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let locks = distlock_runtime::LockManager::builder()
        .pool(pool.clone())
        .build()
        .unwrap();
    {
        // The application uses the shared pool and leaves a connection on database 1.
        let mut conn = pool.get().await.unwrap();
        redis::cmd("SELECT")
            .arg(1)
            .exec_async(&mut conn)
            .await
            .unwrap();
    }
    let lease = locks.lock("db").acquire().await.unwrap();
    let other = fast_manager(&server); // database 0, its own connections
    let held = other.try_lock("db").acquire().await;
    assert!(
        matches!(held, Err(LockError::NotAcquired { .. })),
        "{held:?}"
    );
    {
        let mut conn = pool.get().await.unwrap();
        redis::cmd("SELECT")
            .arg(1)
            .exec_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("MULTI").query_async(&mut conn).await.unwrap();
        // Left inside MULTI: the manager's commands must not be queued into it.
        lease.release().await.unwrap();
        let _: () = redis::cmd("DISCARD").query_async(&mut conn).await.unwrap();
    }
    other
        .try_lock("db")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// A stand-in for a Redis older than 7.0: it cannot compile a script that starts with a `#!lua`
/// line (as Redis 6.2 answers) and answers everything else plainly.
fn old_redis() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        loop {
            // One RESP array per command: "*N", then "$len" and the bytes for each argument.
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let count: usize = line.trim_start_matches('*').trim().parse().unwrap_or(0);
            let mut args = Vec::new();
            for _ in 0..count {
                let mut len = String::new();
                reader.read_line(&mut len).unwrap();
                let len: usize = len.trim_start_matches('$').trim().parse().unwrap_or(0);
                // Scripts span lines: read the argument by its length, then its CRLF.
                let mut arg = vec![0; len + 2];
                reader.read_exact(&mut arg).unwrap();
                args.push(String::from_utf8_lossy(&arg[..len]).to_ascii_uppercase());
            }
            let reply: &[u8] = match args.first().map(String::as_str) {
                Some("EVALSHA") => b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
                Some("EVAL" | "SCRIPT") => {
                    b"-ERR Error compiling script (new function): user_script:1: \
                    unexpected symbol near '#'\r\n"
                }
                _ => b"+OK\r\n",
            };
            if writer.write_all(reply).is_err() {
                return;
            }
        }
    });
    (addr, server)
}

#[tokio::test]
async fn a_redis_older_than_7_is_named_in_the_error() {
    let (addr, _server) = old_redis();
    let locks = distlock_runtime::LockManager::builder()
        .url(format!("redis://{addr}"))
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .build()
        .unwrap();
    let outcome = locks.lock("k").acquire().await;
    let error = outcome.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Misconfigured {
                problem: distlock_runtime::Misconfiguration::ServerVersion,
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("Redis 7.0 or newer"), "{message}");
}

#[tokio::test]
async fn a_background_release_refused_during_a_failover_is_retried() {
    let (logs, _capture) = distlock_tests::Logs::capture();
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let locks = fast_manager(&primary);
    let lease = locks
        .lock("k")
        .ttl(Duration::from_secs(30))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    let conn = primary.client().await;
    let key = locks.redis_key("k");
    // The key reached the replica; then the roles swap: the manager's server is now a replica
    // (it refuses writes with READONLY) of one that has the same data.
    let mut replica_conn = replica.client().await;
    let replicated = distlock_tests::eventually(Duration::from_secs(5), || {
        let mut conn = replica_conn.clone();
        let key = key.clone();
        async move { exists(&mut conn, &key).await }
    })
    .await;
    assert!(replicated.is_some());
    replica.command(&["REPLICAOF", "NO", "ONE"]);
    let port = replica.port().to_string();
    primary.command(&["REPLICAOF", "127.0.0.1", &port]);
    // Dropped while its server refuses writes: the background release keeps trying.
    drop(lease);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        exists(&mut replica_conn, &key).await,
        "nothing could release it yet"
    );
    // The manager's server is promoted back: the release gets through, long before the ttl.
    primary.command(&["REPLICAOF", "NO", "ONE"]);
    let released = until_gone(&conn, &key, Duration::from_secs(5)).await;
    assert!(released.is_some(), "{}", logs.text());
}

/// When a server comes back, the many calls that find no connection share one dial: the
/// restarted server gets one command connection per manager, not one per waiting call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_a_restart_share_one_new_connection() {
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    locks
        .lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.restart();
    let calls = (0..50).map(|i| {
        let locks = locks.clone();
        async move {
            let lease = locks.try_lock(format!("k{i}")).acquire().await.unwrap();
            lease.release().await.unwrap();
        }
    });
    futures_util::future::join_all(calls).await;
    let stats = server.command(&["INFO", "stats"]);
    let connections: u64 = stats
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    // The harness's own INFO connection, and the manager's one.
    assert!(connections <= 3, "{connections} connections for 50 calls");
}

/// An acquire whose answer comes after the lease it granted has expired holds nothing: it is
/// `AnsweredTooLate` (Redis did answer, so not a timeout), an outage for `class()`, the body
/// never runs, and the lock it took is released, not left to a later holder's surprise.
#[tokio::test]
async fn an_answer_after_its_lease_expired_is_answered_too_late_and_runs_nothing() {
    let mut server = RedisServer::start();
    let locks = fast_manager(&server);
    lock_once(&locks, "warm").await;
    server.pause();
    let ttl = Duration::from_millis(60);
    let asking = locks.clone();
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let body_ran = std::sync::Arc::clone(&ran);
    let call = tokio::spawn(async move {
        asking
            .lock("late-answer")
            .ttl(ttl)
            .renew(false)
            .run(async move { body_ran.store(true, std::sync::atomic::Ordering::SeqCst) })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.resume();
    let outcome = call.await.unwrap();
    match &outcome {
        Err(LockError::AnsweredTooLate {
            keys,
            after,
            ttl: told,
        }) => {
            assert_eq!(keys, &["late-answer".to_owned()]);
            assert!(*after >= Duration::from_millis(150), "{after:?}");
            assert_eq!(*told, ttl);
        }
        other => panic!("expected AnsweredTooLate, got {other:?}"),
    }
    assert!(outcome.as_ref().is_err_and(LockError::is_unavailable));
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    let message = outcome.unwrap_err().to_string();
    assert!(message.contains("ttl"), "{message}");
}
