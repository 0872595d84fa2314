//! Settings Redis refuses (credentials, database, ACL rights, server version) are
//! `LockError::Misconfigured`, not outages, and `LockManager::ping` finds them at startup.

use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager, Misconfiguration};
use distlock_tests::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(500);

fn manager(url: &str) -> LockManager {
    LockManager::builder()
        .url(url)
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .pool_wait_timeout(TIMEOUT)
        .build()
        .unwrap()
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
