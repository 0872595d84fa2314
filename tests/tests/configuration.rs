//! Settings Redis refuses (credentials, database, ACL rights, server version) are
//! `LockError::Misconfigured`, not outages, and `LockManager::ping` finds them at startup.

use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager, Misconfiguration, ServerProduct};
use distlock_tests::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(500);

fn manager(url: &str) -> LockManager {
    distlock_tests::manager_at(url, TIMEOUT).build().unwrap()
}

/// Checks that `locks` fails both `ping` and an acquire at once with `problem`, and that the
/// message never shows `secret`.
async fn refused(locks: &LockManager, problem: Misconfiguration, secret: &str) {
    let started = Instant::now();
    let pinged = locks.ping().await;
    let acquired = locks.lock("k").wait(Duration::ZERO).acquire().await;
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    for outcome in [pinged.map(drop), acquired.map(drop)] {
        let error = outcome.unwrap_err();
        assert!(
            matches!(&error, LockError::Misconfigured { problem: p, .. } if *p == problem),
            "{error:?}"
        );
        assert!(error.is_misconfigured() && !error.is_unavailable());
        assert!(!error.is_contention());
        let message = error.to_string();
        assert!(!message.contains(secret), "{message}");
        assert!(!format!("{error:?}").contains(secret), "{error:?}");
    }
}

#[tokio::test]
async fn a_wrong_or_missing_password_is_a_configuration_error() {
    let server = RedisServer::start();
    server.command(&["CONFIG", "SET", "requirepass", "right-horse-battery"]);
    let port = server.port();
    let wrong = manager(&format!("redis://:wrong-staple-9@127.0.0.1:{port}"));
    refused(&wrong, Misconfiguration::Credentials, "wrong-staple-9").await;
    let message = wrong.ping().await.unwrap_err().to_string();
    assert!(message.contains("check the user and password"), "{message}");
    let missing = manager(&format!("redis://127.0.0.1:{port}"));
    refused(
        &missing,
        Misconfiguration::Credentials,
        "right-horse-battery",
    )
    .await;
    let right = manager(&format!("redis://:right-horse-battery@127.0.0.1:{port}"));
    right.ping().await.unwrap();
}

#[tokio::test]
async fn a_database_the_server_does_not_have_is_a_configuration_error() {
    let server = RedisServer::start();
    let locks = manager(&format!("{}/99", server.url()));
    refused(&locks, Misconfiguration::Database, "no secret").await;
    let message = locks.ping().await.unwrap_err().to_string();
    assert!(message.contains("database index"), "{message}");
    manager(&format!("{}/15", server.url()))
        .ping()
        .await
        .unwrap();
}

#[tokio::test]
async fn an_acl_user_without_rights_on_the_keys_is_a_configuration_error() {
    let server = RedisServer::start();
    server.command(&[
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">app-pass-7",
        "~other:*",
        "+@all",
    ]);
    let locks = manager(&format!(
        "redis://app:app-pass-7@127.0.0.1:{}",
        server.port()
    ));
    refused(&locks, Misconfiguration::Permissions, "app-pass-7").await;
}

/// Under the documented line alone (no notifications), `inspect` counts and lists every
/// queued fair waiter: the line grants each command the inspection reads with (`HLEN` was once
/// missing, and the count read 0).
#[tokio::test]
async fn under_the_documented_line_inspect_counts_every_queued_waiter() {
    let server = RedisServer::start();
    let lines = distlock_tests::documented_acl_lines();
    setuser(&server, &lines[0], "lp-pass-44");
    let url = format!("redis://distlock:lp-pass-44@127.0.0.1:{}", server.port());
    let locks = manager(&url);
    locks.ping().await.unwrap();
    let others = server.manager();
    let held = others.lock("q").acquire().await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| distlock_tests::spawn_waiter(&others, "q", Duration::from_secs(10)))
        .collect();
    let conn = server.client().await;
    distlock_tests::until_queued(&conn, "q", 3).await;
    let info = locks.inspect("q").await.unwrap().expect("held");
    assert_eq!(info.waiters, 3, "{info:?}");
    assert_eq!(info.queued.len(), 3, "{info:?}");
    held.release().await.unwrap();
    for waiter in waiters {
        let (_, lease) = waiter.await.unwrap();
        lease.unwrap().release().await.unwrap();
    }
}

/// `servers` says which server software and version hold the locks, as the server's own `INFO`
/// does (Valkey reports `valkey_version` beside the `redis_version` it is compatible with), and
/// `ping` logs the same, once while it stays the same; an ACL user that may run scripts and
/// nothing else is told too.
#[tokio::test]
async fn servers_and_ping_say_which_server_and_version_answered() {
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let redis_version = server.info_field("redis_version").expect("redis_version");
    let (product, version) = match server.info_field("valkey_version") {
        Some(valkey) => (ServerProduct::Valkey, valkey),
        None => (ServerProduct::Redis, redis_version.clone()),
    };
    let locks = server.manager();
    let servers = locks.servers().await.unwrap();
    assert_eq!(servers.len(), 1, "{servers:?}");
    let answered = &servers[0];
    assert_eq!(
        (answered.product, &answered.version, &answered.redis_version),
        (product, &version, &redis_version)
    );
    assert!(
        answered.address.ends_with(&format!(":{}", server.port())),
        "{answered:?}"
    );
    let shown = format!("{product} {version} at {}", answered.address);
    assert_eq!(answered.to_string(), shown);
    locks.ping().await.unwrap();
    locks.ping().await.unwrap();
    assert_eq!(logs.count(&shown), 1, "{}", logs.text());
    // A user that may only run scripts (and `SELECT`): `ping` refuses it, `servers` answers.
    server.command(&[
        "ACL", "SETUSER", "scripts", "on", ">sc-pass", "~*", "-@all", "+evalsha", "+eval",
        "+select",
    ]);
    let limited = manager(&format!(
        "redis://scripts:sc-pass@127.0.0.1:{}",
        server.port()
    ));
    assert!(limited.ping().await.unwrap_err().is_misconfigured());
    assert_eq!(limited.servers().await.unwrap()[0].version, version);
}

#[tokio::test]
async fn ping_succeeds_with_good_settings_and_writes_nothing() {
    let server = RedisServer::start();
    let locks = server.manager();
    locks.ping().await.unwrap();
    assert_eq!(server.command(&["DBSIZE"]).trim(), ":0");
}

#[tokio::test]
async fn ping_of_a_dead_redis_is_an_outage_within_the_timeouts() {
    let mut server = RedisServer::start();
    let locks = manager(&server.url());
    server.kill();
    let started = Instant::now();
    let error = locks.ping().await.unwrap_err();
    assert!(
        error.is_unavailable() && !error.is_misconfigured(),
        "{error:?}"
    );
    assert!(started.elapsed() <= 2 * TIMEOUT, "{:?}", started.elapsed());
}

/// Runs one documented `ACL SETUSER` line on `server`, with `password`.
fn setuser(server: &RedisServer, line: &str, password: &str) {
    let line = line.replace("CHANGE-ME", password);
    let args: Vec<&str> = line.split_whitespace().collect();
    let answer = server.command(&args);
    assert_eq!(answer.trim(), "+OK", "{line}: {answer}");
}

#[tokio::test]
async fn a_least_privilege_user_without_channel_rights_locks_releases_and_hands_off() {
    let lines = distlock_tests::documented_acl_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    // One home: the crate docs. The README and docs/operations.md point there.
    let readme = include_str!("../../README.md");
    let operations = include_str!("../../docs/operations.md");
    for line in &lines {
        assert!(
            !readme.contains(line.as_str()) && !operations.contains(line.as_str()),
            "{line}"
        );
    }
    assert!(operations.contains("Least-privilege ACL user"));
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    setuser(&server, &lines[0], "lp-pass-31");
    let url = format!("redis://distlock:lp-pass-31@127.0.0.1:{}/3", server.port());
    let locks = manager(&url);
    let other = manager(&url);
    locks.ping().await.unwrap();

    // Lock, renew, extend and release, on one key and several.
    let lease = locks
        .lock_all(["a", "b", "c"])
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!lease.is_lost(), "renewal works");
    lease.extend(Duration::from_secs(5)).await.unwrap();
    lease
        .release()
        .await
        .expect("release succeeds without PUBLISH rights");

    let mut conn = server.client().await;
    redis::cmd("SELECT")
        .arg(3)
        .exec_async(&mut conn)
        .await
        .unwrap();

    // An unfair waiter polls: it takes a released key at once, not at the holder's expiry.
    // (One key is fair by default: `fair(false)` makes this waiter take the key by its own
    // attempt rather than be handed it.)
    let held = other
        .lock("k")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let lease = locks
                .lock("k")
                .fair(false)
                .wait(Duration::from_secs(10))
                .acquire()
                .await;
            (lease, Instant::now())
        }
    });
    // It waits (it marked the holder as waited on), and is not queued.
    distlock_tests::until_marked(&conn, "distlock:lock:{k}").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(distlock_tests::queued(&mut conn, "k").await, 0);
    let released = Instant::now();
    held.release().await.unwrap();
    let (lease, taken) = waiter.await.unwrap();
    assert!(
        taken - released < Duration::from_millis(500),
        "taken {:?} after the release",
        taken - released
    );
    lease.unwrap().release().await.unwrap();
    assert_eq!(locks.stats().handed_over, 0);

    // A fair hand-off to a waiter of another manager still happens, unannounced.
    let held = other.lock("f").fair(true).acquire().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("f")
                .fair(true)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    distlock_tests::until_queued(&conn, "f", 1).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    lease.release().await.unwrap();

    // Every mode: a reader and the writer it hands the key to, permits, a mixed request,
    // inspection and a forced release, and a shared lease's renewal.
    let reader = other
        .read_lock("m")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let writer = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("m")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    distlock_tests::until_queued(&conn, "m", 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!reader.is_lost(), "a shared lease renews");
    reader.release().await.unwrap();
    writer.await.unwrap().unwrap().release().await.unwrap();
    let permit = locks.lock("p").permits(2).acquire().await.unwrap();
    let mixed = other.lock("x").read_keys(["m"]).acquire().await.unwrap();
    for (key, holders) in [("p", 1), ("x", 1), ("m", 1)] {
        let info = locks.inspect(key).await.unwrap().unwrap();
        assert_eq!(info.holders, holders, "{info:?}");
    }
    assert!(locks.force_release("p").await.unwrap());
    mixed.release().await.unwrap();
    drop(permit);

    // One warning says why waiters poll, and one per manager (each subscribes to hear of
    // forced releases while it holds a lease) why its holders hear of them late; nothing else
    // is reported.
    let text = logs.text();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    let says = |what: &str| warnings.iter().filter(|w| w.contains(what)).count();
    assert_eq!(
        says("may not subscribe to release notifications"),
        1,
        "{text}"
    );
    assert!(
        says("may not subscribe to forced-release notices") <= 2,
        "{text}"
    );
    assert!(
        warnings.iter().all(|w| w.contains("may not subscribe")),
        "{text}"
    );
    assert!(!text.contains("lp-pass-31"), "{text}");
}

#[tokio::test]
async fn a_least_privilege_user_with_channel_rights_is_woken_by_notifications() {
    let lines = distlock_tests::documented_acl_lines();
    let server = RedisServer::start();
    setuser(&server, &lines[0], "lp-pass-32");
    setuser(&server, &lines[1], "lp-pass-32");
    let url = format!("redis://distlock:lp-pass-32@127.0.0.1:{}", server.port());
    let locks = manager(&url);
    let held = locks.lock("k").acquire().await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock("k")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        }
    });
    // Subscribed: the key's channel shows up on the server.
    let conn = server.client().await;
    let subscribed = distlock_tests::eventually(Duration::from_secs(2), || {
        let mut conn = conn.clone();
        async move {
            !distlock_tests::channels(&mut conn, "distlock:lock:{k}")
                .await
                .is_empty()
        }
    })
    .await;
    assert!(subscribed.is_some(), "the waiter subscribed");
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

#[test]
fn a_manager_takes_exactly_one_topology() {
    let two = LockManager::builder()
        .url("redis://127.0.0.1:1")
        .cluster(["redis://127.0.0.1:2"])
        .build()
        .unwrap_err();
    assert!(
        matches!(
            two,
            LockError::InvalidConfig {
                what: "topology",
                ..
            }
        ),
        "{two:?}"
    );
    let message = two.to_string();
    assert!(
        message.contains(".url(..)") && message.contains(".cluster(..)"),
        "{message}"
    );
    let none = LockManager::builder().build().unwrap_err();
    assert!(
        matches!(
            none,
            LockError::InvalidConfig {
                what: "topology",
                ..
            }
        ),
        "{none:?}"
    );
    let sentinel_and_quorum = LockManager::builder()
        .sentinel("main", ["redis://127.0.0.1:26379"])
        .quorum([
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ])
        .build()
        .unwrap_err();
    assert!(sentinel_and_quorum.to_string().contains(".sentinel(..)"));
    let too_small = LockManager::builder()
        .quorum(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
        .build()
        .unwrap_err();
    assert!(too_small.to_string().contains("at least 3"), "{too_small}");
    let no_seeds = LockManager::builder()
        .cluster(Vec::<String>::new())
        .build()
        .unwrap_err();
    assert!(matches!(
        no_seeds,
        LockError::InvalidConfig {
            what: "cluster",
            ..
        }
    ));
    // A URL given after another URL (or a pool) replaces it: one topology.
    LockManager::builder()
        .url("redis://127.0.0.1:1")
        .url("redis://127.0.0.1:2")
        .build()
        .unwrap();
    // No network I/O in build, whatever the topology.
    for built in [
        LockManager::builder()
            .cluster(["redis://127.0.0.1:1"])
            .build(),
        LockManager::builder()
            .sentinel("main", ["redis://127.0.0.1:1"])
            .build(),
        LockManager::builder()
            .quorum([
                "redis://127.0.0.1:1",
                "redis://127.0.0.1:2",
                "redis://127.0.0.1:3",
            ])
            .build(),
    ] {
        built.unwrap();
    }
}

#[tokio::test]
async fn passwords_in_topology_urls_never_show() {
    let secret = "quorum-horse-77";
    let locks = LockManager::builder()
        .quorum((1..=3).map(|p| format!("redis://app:{secret}@127.0.0.1:{p}")))
        .build()
        .unwrap();
    assert!(!format!("{locks:?}").contains(secret), "{locks:?}");
    let locks = LockManager::builder()
        .cluster([format!("redis://app:{secret}@127.0.0.1:1")])
        .build()
        .unwrap();
    assert!(!format!("{locks:?}").contains(secret), "{locks:?}");
    let locks = LockManager::builder()
        .sentinel("main", [format!("redis://app:{secret}@127.0.0.1:1")])
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .build()
        .unwrap();
    assert!(!format!("{locks:?}").contains(secret), "{locks:?}");
    let error = locks.ping().await.unwrap_err();
    assert!(!error.to_string().contains(secret), "{error}");
    assert!(!format!("{error:?}").contains(secret), "{error:?}");
}
