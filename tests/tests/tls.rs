//! TLS (`rediss://`) against real `redis-server`s serving TLS with certificates each test makes
//! (`distlock_tests::tls`): a lock cycle and a woken waiter, untrusted, wrongly named and expired
//! server certificates, plaintext against the TLS port, mutual TLS, unusable PEM, and a quorum,
//! a cluster and a Sentinel-named primary over TLS.

use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager, Misconfiguration};
use distlock_tests::manager_at;
use distlock_tests::tls::{ClientCerts, ServerCert, TestCa, TlsCluster, TlsSentinel, TlsServer};

/// Connect, response and pool-wait timeout of the managers that are to fail.
const TIMEOUT: Duration = Duration::from_secs(1);

/// Scheduling slack on top of a timeout.
const SLACK: Duration = Duration::from_millis(500);

/// Asserts that `error` is a refused certificate of the kind `problem`, with a message that says
/// what to do.
fn assert_refused(error: &LockError, problem: Misconfiguration, advice: &str) {
    assert!(
        matches!(error, LockError::Misconfigured { problem: p, .. } if *p == problem),
        "{error:?}"
    );
    assert!(error.is_misconfigured() && !error.is_unavailable());
    let message = error.to_string();
    assert!(
        message.contains("could not open a TLS connection"),
        "{message}"
    );
    assert!(message.contains(advice), "{message}");
}

/// Takes `key`, has a second manager wait for it, and checks that the waiter subscribed (on one
/// of the servers behind `plain`, by their plain ports) and got the lock soon after the release.
async fn lock_and_hand_over(
    locks: &LockManager,
    waiter: &LockManager,
    plain: &[&TlsServer],
    key: &str,
) {
    let held = locks.lock(key).acquire().await.unwrap();
    let waiting = distlock_tests::spawn_waiter(waiter, key, Duration::from_secs(10));
    let mut conns = Vec::with_capacity(plain.len());
    for server in plain {
        conns.push(server.server().client().await);
    }
    distlock_tests::until_subscribed_on_any(&conns, key).await;
    let first = held.fencing_token();
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = waiting.await.unwrap();
    let lease = lease.unwrap();
    assert!(acquired - released < Duration::from_secs(1));
    assert!(lease.fencing_token() > first);
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_cycle_over_rediss_works_and_a_waiter_is_woken_over_tls() {
    if distlock_tests::tls::skip_without_tls(
        "a_lock_cycle_over_rediss_works_and_a_waiter_is_woken_over_tls",
    ) {
        return;
    }
    let ca = TestCa::new();
    let other = TestCa::new();
    let server = TlsServer::start(&ca, ClientCerts::No);
    let locks = server.manager_builder(&ca).build().unwrap();
    // CAs given one after the other are all trusted.
    let waiter = manager_at(&server.url(), TIMEOUT)
        .tls_ca_pem(other.ca_pem())
        .tls_ca_pem(ca.ca_pem())
        .build()
        .unwrap();
    locks.ping().await.unwrap();
    waiter.ping().await.unwrap();
    let counted = locks.lock("tls-cycle").run(async { "ran" }).await.unwrap();
    assert_eq!(counted, "ran");
    lock_and_hand_over(&locks, &waiter, &[&server], "tls-handed").await;
}

#[tokio::test]
async fn a_server_certificate_the_client_does_not_trust_is_refused_at_once() {
    if distlock_tests::tls::skip_without_tls(
        "a_server_certificate_the_client_does_not_trust_is_refused_at_once",
    ) {
        return;
    }
    let ca = TestCa::new();
    let other = TestCa::new();
    let server = TlsServer::start(&ca, ClientCerts::No);
    // Another CA's certificate given, and none (the system's roots, which know no test CA).
    let managers = [
        manager_at(&server.url(), TIMEOUT)
            .tls_ca_pem(other.ca_pem())
            .build()
            .unwrap(),
        manager_at(&server.url(), TIMEOUT).build().unwrap(),
    ];
    for locks in managers {
        let started = Instant::now();
        let error = locks.ping().await.unwrap_err();
        assert_refused(&error, Misconfiguration::ServerCertificate, "tls_ca_pem");
        assert!(error.to_string().contains("UnknownIssuer"), "{error}");
        // A lock with a long wait is not retried until its wait ends: retrying cannot help.
        let error = locks
            .lock("tls-untrusted")
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap_err();
        assert_refused(&error, Misconfiguration::ServerCertificate, "tls_ca_pem");
        assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    }
    assert_eq!(server.server().command(&["DBSIZE"]), ":0\r\n");
}

#[tokio::test]
async fn a_server_certificate_for_another_host_or_expired_is_refused_at_once() {
    if distlock_tests::tls::skip_without_tls(
        "a_server_certificate_for_another_host_or_expired_is_refused_at_once",
    ) {
        return;
    }
    let ca = TestCa::new();
    // Signed by the CA the client trusts: only the name, or only the dates, are wrong.
    let cases = [
        (ServerCert::WrongName, "not valid for name"),
        (ServerCert::Expired, "certificate expired"),
    ];
    for (cert, says) in cases {
        let server = TlsServer::start_presenting(&ca, cert, ClientCerts::No, &[]);
        // By IP address (checked against the certificate's IP names) and by host name (its DNS
        // names).
        let urls = [
            server.url(),
            format!("rediss://localhost:{}", server.tls_port()),
        ];
        for url in urls {
            let locks = manager_at(&url, TIMEOUT)
                .tls_ca_pem(ca.ca_pem())
                .build()
                .unwrap();
            let started = Instant::now();
            let error = locks.ping().await.unwrap_err();
            assert_refused(&error, Misconfiguration::ServerCertificate, "tls_ca_pem");
            assert!(
                error.to_string().contains(says),
                "{cert:?} at {url}: {error}"
            );
            // Not retried until the wait ends: retrying cannot help.
            let error = locks
                .lock("tls-refused")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap_err();
            assert_refused(&error, Misconfiguration::ServerCertificate, "tls_ca_pem");
            assert!(
                started.elapsed() < TIMEOUT,
                "{cert:?} at {url}: {:?}",
                started.elapsed()
            );
        }
        assert_eq!(server.server().command(&["DBSIZE"]), ":0\r\n");
    }
}

#[tokio::test]
async fn a_plaintext_url_against_the_tls_port_fails_within_the_timeouts() {
    if distlock_tests::tls::skip_without_tls(
        "a_plaintext_url_against_the_tls_port_fails_within_the_timeouts",
    ) {
        return;
    }
    let ca = TestCa::new();
    let server = TlsServer::start(&ca, ClientCerts::No);
    let plain_to_tls = format!("redis://127.0.0.1:{}", server.tls_port());
    let locks = manager_at(&plain_to_tls, TIMEOUT).build().unwrap();
    let started = Instant::now();
    let error = locks.ping().await.unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
    assert!(error.to_string().contains("rediss://"), "{error}");
    let error = locks
        .lock("tls-plain")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
    assert!(
        started.elapsed() < TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );

    // And the other way round: a TLS handshake sent to the plain port is never answered.
    let tls_to_plain = format!("rediss://127.0.0.1:{}", server.server().port());
    let locks = manager_at(&tls_to_plain, TIMEOUT)
        .tls_ca_pem(ca.ca_pem())
        .build()
        .unwrap();
    let started = Instant::now();
    let error = locks.ping().await.unwrap_err();
    assert!(
        matches!(error, LockError::RedisTimeout { after, .. } if after == TIMEOUT),
        "{error:?}"
    );
    assert!(
        started.elapsed() < TIMEOUT + SLACK,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.server().command(&["DBSIZE"]), ":0\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_works_with_a_client_certificate_and_is_refused_without_one() {
    if distlock_tests::tls::skip_without_tls(
        "mutual_tls_works_with_a_client_certificate_and_is_refused_without_one",
    ) {
        return;
    }
    let ca = TestCa::new();
    let other = TestCa::new();
    let server = TlsServer::start(&ca, ClientCerts::Required);
    let with_certificate = || {
        server
            .manager_builder(&ca)
            .tls_client_cert_pem(ca.client_cert_pem(), ca.client_key_pem())
            .build()
            .unwrap()
    };
    let (locks, waiter) = (with_certificate(), with_certificate());
    locks.ping().await.unwrap();
    lock_and_hand_over(&locks, &waiter, &[&server], "mtls").await;

    let without = server.manager_builder(&ca).build().unwrap();
    let started = Instant::now();
    let error = without.ping().await.unwrap_err();
    assert_refused(
        &error,
        Misconfiguration::ClientCertificate,
        "tls_client_cert_pem",
    );
    assert!(error.to_string().contains("CertificateRequired"), "{error}");
    let error = without.lock("mtls").acquire().await.unwrap_err();
    assert_refused(
        &error,
        Misconfiguration::ClientCertificate,
        "tls_client_cert_pem",
    );
    // A certificate the server's CA did not sign.
    let stranger = server
        .manager_builder(&ca)
        .tls_client_cert_pem(other.client_cert_pem(), other.client_key_pem())
        .build()
        .unwrap();
    let error = stranger.ping().await.unwrap_err();
    assert_refused(
        &error,
        Misconfiguration::ClientCertificate,
        "tls_client_cert_pem",
    );
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
}

#[test]
fn unusable_certificates_fail_build_with_a_clear_error() {
    let ca = TestCa::new();
    let url = "rediss://127.0.0.1:6390";
    let key = ca.client_key_pem();
    let key_text = String::from_utf8(key.clone()).unwrap();
    let key_body = key_text.lines().nth(1).unwrap().to_owned();
    let build = |builder: distlock_runtime::LockManagerBuilder| builder.build().unwrap_err();
    let cases = [
        (
            build(
                LockManager::builder()
                    .url(url)
                    .tls_ca_pem("not a certificate"),
            ),
            "tls_ca_pem",
            "no certificate found",
        ),
        (
            // A key where the CA belongs.
            build(LockManager::builder().url(url).tls_ca_pem(key.clone())),
            "tls_ca_pem",
            "no certificate found",
        ),
        (
            build(
                LockManager::builder()
                    .url(url)
                    .tls_ca_pem(ca.ca_pem().split_at(200).0.to_vec()),
            ),
            "tls_ca_pem",
            "not valid PEM",
        ),
        (
            // The certificate and key swapped.
            build(
                LockManager::builder()
                    .url(url)
                    .tls_client_cert_pem(key.clone(), ca.client_cert_pem()),
            ),
            "tls_client_cert_pem",
            "no certificate found",
        ),
        (
            build(
                LockManager::builder()
                    .url(url)
                    .tls_client_cert_pem(ca.client_cert_pem(), ca.client_cert_pem()),
            ),
            "tls_client_cert_pem",
            "no PEM private key",
        ),
        (
            // Another certificate's key.
            build(
                LockManager::builder()
                    .url(url)
                    .tls_client_cert_pem(ca.client_cert_pem(), ca.server_key_pem()),
            ),
            "tls_client_cert_pem",
            "cannot be used together",
        ),
        (
            // Certificates for connections that would not be encrypted.
            build(
                LockManager::builder()
                    .url("redis://127.0.0.1:6390")
                    .tls_ca_pem(ca.ca_pem()),
            ),
            "tls",
            "none of the manager's URLs is a rediss:// one",
        ),
        (
            build(
                LockManager::builder()
                    .quorum((1..=3).map(|p| format!("redis://127.0.0.1:{p}")))
                    .tls_client_cert_pem(ca.client_cert_pem(), key.clone()),
            ),
            "tls",
            "none of the manager's URLs is a rediss:// one",
        ),
    ];
    // Certificate checks cannot be turned off.
    let error = LockManager::from_url(&format!("{url}/#insecure")).unwrap_err();
    assert!(matches!(error, LockError::InvalidUrl { .. }), "{error:?}");
    assert!(error.to_string().contains("tls_ca_pem"), "{error}");
    for (error, setting, says) in cases {
        assert!(
            matches!(&error, LockError::InvalidConfig { what, .. } if *what == setting),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(message.contains(says), "{message}");
        assert!(!message.contains(&key_body), "the key shows in {message}");
        assert!(!format!("{error:?}").contains(&key_body));
    }
    // Good certificates build, on every topology.
    let good = |builder: distlock_runtime::LockManagerBuilder| {
        builder
            .tls_ca_pem(ca.ca_pem())
            .tls_client_cert_pem(ca.client_cert_pem(), ca.client_key_pem())
            .build()
            .unwrap()
    };
    let urls = || (1..=3).map(|p| format!("rediss://127.0.0.1:{p}"));
    let managers = [
        good(LockManager::builder().url(url)),
        good(LockManager::builder().cluster(urls())),
        good(LockManager::builder().sentinel("main", urls())),
        good(LockManager::builder().quorum(urls())),
    ];
    for locks in managers {
        assert!(!format!("{locks:?}").contains(&key_body));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_three_servers_over_mutual_tls_with_an_acl_user_locks_and_wakes_waiters() {
    if distlock_tests::tls::skip_without_tls(
        "a_quorum_of_three_servers_over_mutual_tls_with_an_acl_user_locks_and_wakes_waiters",
    ) {
        return;
    }
    let ca = TestCa::new();
    let servers: Vec<TlsServer> = (0..3)
        .map(|_| TlsServer::start(&ca, ClientCerts::Required))
        .collect();
    for server in &servers {
        let reply = server.server().command(&[
            "ACL",
            "SETUSER",
            "locker",
            "on",
            ">quorum-pass",
            "~*",
            "&*",
            "+@all",
        ]);
        assert_eq!(reply, "+OK\r\n");
    }
    let manager = || {
        LockManager::builder()
            .quorum(servers.iter().map(|s| s.url_as("locker", "quorum-pass")))
            .tls_ca_pem(ca.ca_pem())
            .tls_client_cert_pem(ca.client_cert_pem(), ca.client_key_pem())
            .build()
            .unwrap()
    };
    let (locks, waiter) = (manager(), manager());
    locks.ping().await.unwrap();
    let lease = locks.lock("tls-quorum").acquire().await.unwrap();
    for server in &servers {
        // A round ends at a majority; the last node's grant follows.
        let held = distlock_tests::eventually(Duration::from_secs(2), || async {
            server
                .server()
                .command(&["EXISTS", "distlock:lock:{tls-quorum}"])
                == ":1\r\n"
        })
        .await;
        assert!(held.is_some(), "every node holds the lock");
        let clients = server.server().command(&["CLIENT", "LIST"]);
        assert!(clients.contains("user=locker"), "{clients}");
    }
    lease.release().await.unwrap();
    // The waiter subscribes on the first node that answers.
    let all: Vec<&TlsServer> = servers.iter().collect();
    lock_and_hand_over(&locks, &waiter, &all, "tls-quorum-wake").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_locks_in_every_slot_lists_its_locks_and_wakes_waiters() {
    if distlock_tests::tls::skip_without_tls(
        "a_cluster_over_tls_locks_in_every_slot_lists_its_locks_and_wakes_waiters",
    ) {
        return;
    }
    let _load = distlock_tests::heavy().await;
    let ca = TestCa::new();
    let cluster = TlsCluster::start(&ca, 3);
    let manager = || {
        LockManager::builder()
            .cluster(cluster.seed_urls())
            .tls_ca_pem(ca.ca_pem())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    let (locks, waiter) = (manager(), manager());
    locks.ping().await.unwrap();
    // Keys in slots of all three primaries, taken together and one by one.
    let keys: Vec<String> = (0..12).map(|i| format!("tls-cluster-{i}")).collect();
    let lease = locks.lock_all(keys.clone()).acquire().await.unwrap();
    // Listing asks every primary straight, over TLS, on the ports it names to a TLS client.
    let mut listed: Vec<String> = locks
        .held_locks("tls-cluster-*")
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.key)
        .collect();
    listed.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(listed, expected);
    lease.release().await.unwrap();
    for key in &keys {
        distlock_tests::lock_once(&locks, key).await;
    }
    // Every node served some of them.
    for i in 0..cluster.node_count() {
        let stats = cluster.node(i).server().command(&["INFO", "commandstats"]);
        assert!(stats.contains("cmdstat_evalsha"), "node {i}: {stats}");
    }

    // A waiter is woken by the sharded release notification, over TLS.
    let held = locks.lock("tls-cluster-wake").acquire().await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let lease = waiter
                .lock("tls-cluster-wake")
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            (Instant::now(), lease)
        })
    };
    let subscribed = distlock_tests::eventually(Duration::from_secs(5), || async {
        (0..cluster.node_count()).any(|i| {
            let reply = cluster.node(i).server().command(&[
                "PUBSUB",
                "SHARDNUMSUB",
                "distlock:lock:{tls-cluster-wake}",
            ]);
            reply.ends_with(":1\r\n")
        })
    })
    .await;
    assert!(subscribed.is_some(), "the waiter subscribed over TLS");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (acquired, lease) = waiting.await.unwrap();
    assert!(acquired - released < Duration::from_secs(1));
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_over_tls_names_a_primary_that_is_reached_over_tls() {
    if distlock_tests::tls::skip_without_tls(
        "a_sentinel_over_tls_names_a_primary_that_is_reached_over_tls",
    ) {
        return;
    }
    let ca = TestCa::new();
    let primary = TlsServer::start(&ca, ClientCerts::Required);
    let sentinel = TlsSentinel::start(&ca, &primary);
    let manager = || {
        LockManager::builder()
            .sentinel(TlsSentinel::MASTER_NAME, [sentinel.url()])
            .tls_ca_pem(ca.ca_pem())
            .tls_client_cert_pem(ca.client_cert_pem(), ca.client_key_pem())
            .build()
            .unwrap()
    };
    let (locks, waiter) = (manager(), manager());
    locks.ping().await.unwrap();
    lock_and_hand_over(&locks, &waiter, &[&primary], "tls-sentinel").await;
}
