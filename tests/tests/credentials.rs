//! ACL users (`redis://user:password@...`) on a cluster and through sentinels that check them
//! too, and passwords that never show: in logs, `Debug` or `Display` of the builder, the manager
//! and every error, whatever fails. (One server and a quorum: `configuration.rs`, `tls.rs`.)

use std::time::Duration;

use distlock_runtime::{LockError, LockManager, Misconfiguration};
use distlock_tests::tls::{ClientCerts, TestCa, TlsServer};
use distlock_tests::topology::{RedisCluster, SentinelGroup};
use distlock_tests::{manager_at, Logs};

const TIMEOUT: Duration = Duration::from_secs(1);

/// The ACL rule of the tests' user: everything (least privilege is `configuration.rs`'s).
const ALL: [&str; 4] = ["~*", "&*", "+@all", "on"];

/// `redis://user:password@` in front of a `redis://` URL's host.
fn with_user(url: &str, user: &str, password: &str) -> String {
    url.replacen("redis://", &format!("redis://{user}:{password}@"), 1)
}

/// Runs `ACL SETUSER user >password` (with [`ALL`]) on the server at `url`.
async fn add_user(url: &str, user: &str, password: &str) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg(format!(">{password}"))
        .arg(&ALL[..]);
    cmd.exec_async(&mut conn).await.unwrap();
}

fn assert_wrong_credentials(error: &LockError, password: &str) {
    assert!(
        matches!(
            error,
            LockError::Misconfigured {
                problem: Misconfiguration::Credentials,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(!error.to_string().contains(password), "{error}");
    assert!(!format!("{error:?}").contains(password), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_locks_on_a_cluster_and_a_wrong_password_is_refused() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    // ACL users are each node's own: the user is made on every one.
    for url in cluster.seed_urls() {
        add_user(&url, "locker", "cluster-pass-41").await;
    }
    let seeds = |password: &str| {
        let seeds: Vec<String> = cluster
            .seed_urls()
            .iter()
            .map(|url| with_user(url, "locker", password))
            .collect();
        LockManager::builder()
            .cluster(seeds)
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .unwrap()
    };
    let locks = seeds("cluster-pass-41");
    locks.ping().await.unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("acl-cluster-{i}")).collect();
    let lease = locks.lock_all(keys.clone()).acquire().await.unwrap();
    // Listed by asking every primary straight, as the user.
    let listed = locks.held_locks("acl-cluster-*").await.unwrap();
    assert_eq!(listed.len(), keys.len());
    lease.release().await.unwrap();
    for key in &keys {
        distlock_tests::lock_once(&locks, key).await;
    }
    for i in 0..cluster.node_count() {
        let clients = cluster.node(i).command(&["CLIENT", "LIST"]);
        assert!(clients.contains("user=locker"), "node {i}: {clients}");
    }

    let wrong = seeds("cluster-wrong-52");
    assert_wrong_credentials(&wrong.ping().await.unwrap_err(), "cluster-wrong-52");
    let error = wrong.lock("acl-cluster-0").acquire().await.unwrap_err();
    assert_wrong_credentials(&error, "cluster-wrong-52");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_want_credentials_get_the_urls_user_and_so_does_the_primary() {
    let group = SentinelGroup::start(0, 1);
    let sentinel = group.sentinel_urls().remove(0);
    let primary = group.server(0);
    add_user(&sentinel, "locker", "sentinel-pass-63").await;
    add_user(&primary.url(), "locker", "sentinel-pass-63").await;
    // From now on the sentinel answers nobody but `locker` (it still watches the primary as
    // the primary's default user).
    let mut conn = redis::Client::open(sentinel.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("off")
        .exec_async(&mut conn)
        .await
        .unwrap();
    let manager = |url: String| {
        LockManager::builder()
            .sentinel(group.master_name(), [url])
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .build()
            .unwrap()
    };

    let locks = manager(with_user(&sentinel, "locker", "sentinel-pass-63"));
    locks.ping().await.unwrap();
    distlock_tests::lock_once(&locks, "acl-sentinel").await;
    let clients = primary.command(&["CLIENT", "LIST"]);
    assert!(clients.contains("user=locker"), "{clients}");

    // Without credentials the sentinel refuses to say where the primary is.
    let error = manager(sentinel.clone()).ping().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Misconfigured {
                problem: Misconfiguration::Credentials,
                ..
            }
        ),
        "{error:?}"
    );
    let wrong = manager(with_user(&sentinel, "locker", "sentinel-wrong-74"));
    assert_wrong_credentials(&wrong.ping().await.unwrap_err(), "sentinel-wrong-74");
}

/// Every way `error` shows: `Display`, `Debug` (both forms), and each source's `Display`.
fn shown(error: &LockError) -> Vec<String> {
    let mut shown = vec![
        error.to_string(),
        format!("{error:?}"),
        format!("{error:#?}"),
    ];
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        shown.push(cause.to_string());
        shown.push(format!("{cause:?}"));
        source = cause.source();
    }
    shown
}

#[tokio::test]
async fn passwords_never_show_in_logs_debug_or_errors() {
    if distlock_tests::tls::skip_without_tls("passwords_never_show_in_logs_debug_or_errors") {
        return;
    }
    let secret = "Wombat-Quasar-8127";
    let wrong = "Narwhal-Zephyr-3390";
    let ca = TestCa::new();
    let other = TestCa::new();
    let mut server = TlsServer::start(&ca, ClientCerts::No);
    let reply = server.server().command(&[
        "ACL",
        "SETUSER",
        "locker",
        &format!(">{secret}"),
        "~*",
        "&*",
        "+@all",
        "on",
    ]);
    assert_eq!(reply, "+OK\r\n");
    let (logs, _capture) = Logs::capture();
    let mut output: Vec<String> = vec![];

    // A manager that works: its builder, itself, a lock cycle, a waiter.
    let builder = manager_at(&server.url_as("locker", secret), TIMEOUT).tls_ca_pem(ca.ca_pem());
    output.push(format!("{builder:?} {builder:#?}"));
    let locks = builder.build().unwrap();
    output.push(format!("{locks:?} {locks:#?}"));
    locks.ping().await.unwrap();
    distlock_tests::lock_once(&locks, "secret-cycle").await;

    // Then everything that can fail.
    let unreachable_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let dead = |scheme: &str, password: &str| {
        format!("{scheme}://locker:{password}@127.0.0.1:{unreachable_port}")
    };
    let failing = [
        // A wrong password.
        manager_at(&server.url_as("locker", wrong), TIMEOUT).tls_ca_pem(ca.ca_pem()),
        // A server that is not there.
        manager_at(&dead("rediss", secret), TIMEOUT).tls_ca_pem(ca.ca_pem()),
        // A certificate from another CA.
        manager_at(&server.url_as("locker", secret), TIMEOUT).tls_ca_pem(other.ca_pem()),
        // Plaintext to the TLS port.
        manager_at(
            &format!("redis://locker:{secret}@127.0.0.1:{}", server.tls_port()),
            TIMEOUT,
        ),
        // Every other topology, at nothing.
        LockManager::builder()
            .cluster([dead("redis", secret)])
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT),
        LockManager::builder()
            .sentinel("main", [dead("rediss", secret)])
            .tls_ca_pem(ca.ca_pem())
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT),
        LockManager::builder()
            .quorum([
                dead("redis", secret),
                dead("redis", wrong),
                dead("redis", secret),
            ])
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT),
    ];
    let mut errors = 0;
    for builder in failing {
        output.push(format!("{builder:?}"));
        let failing = builder.build().unwrap();
        output.push(format!("{failing:?}"));
        let error = failing.ping().await.unwrap_err();
        output.extend(shown(&error));
        let error = failing.lock("secret-fails").acquire().await.unwrap_err();
        output.extend(shown(&error));
        errors += 2;
    }
    // A URL that does not parse.
    let error =
        LockManager::from_url(&format!("rediss://locker:{secret}@127.0.0.1:99999")).unwrap_err();
    output.extend(shown(&error));

    // A lease whose server dies while it is held: renewal fails, and says so in the logs.
    let held = locks
        .lock("secret-held")
        .ttl(Duration::from_secs(1))
        .renew(true)
        .acquire()
        .await
        .unwrap();
    server.server_mut().kill();
    held.lost().await;
    if let Err(error) = held.release().await {
        output.extend(shown(&error));
    }

    let logged = logs.text();
    assert!(logged.contains("distlock"), "nothing was logged: {logged}");
    output.push(logged);
    assert!(errors >= 14 && output.len() > errors);
    for text in &output {
        assert!(!text.contains(secret), "the password shows in: {text}");
        assert!(!text.contains(wrong), "the wrong password shows in: {text}");
    }
}
