//! Every Redis error distlock can meet, provoked on a real server: the `LockError` it becomes
//! (its class) and whether distlock sends the request again. One test per row of the crate
//! docs' table ("Redis errors"); `NOAUTH` / `WRONGPASS` are `configuration.rs`'s,
//! `NOSCRIPT` is `hangs.rs`'s and `cluster.rs`'s, `MOVED` under load is `faults.rs`'s
//! (`MOVED` and `CROSSSLOT` to a manager built for one server are here).

use std::io::Write;
use std::time::{Duration, Instant};

use distlock_runtime::{ErrorClass, LockError, LockManager, Misconfiguration};
use distlock_tests::topology::RedisCluster;
use distlock_tests::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(500);

fn manager(url: &str) -> LockManager {
    distlock_tests::manager_at(url, TIMEOUT).build().unwrap()
}

/// The documented least-privilege line (see the crate docs) for user `app`, with channels and
/// the route's `extra` rights, without the word `left_out`.
fn acl_line(extra: &[&str], left_out: &str) -> Vec<String> {
    let mut extra = extra.to_vec();
    extra.push("&distlock:*");
    distlock_tests::documented_acl_user("app", "app-pass", &extra, left_out)
}

/// Runs `words` (an `ACL SETUSER` command) on `server`.
fn setuser(server: &RedisServer, words: &[String]) {
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    assert_eq!(server.command(&words).trim(), "+OK", "{words:?}");
}

/// The documented least-privilege line (see the crate docs) without `left_out`.
fn user_without(server: &RedisServer, left_out: &str) -> LockManager {
    setuser(
        server,
        &acl_line(&["+publish", "+subscribe", "+unsubscribe"], left_out),
    );
    manager(&format!("redis://app:app-pass@127.0.0.1:{}", server.port()))
}

fn assert_permissions(error: &LockError, command: &str) {
    assert!(
        matches!(
            error,
            LockError::Misconfigured {
                problem: Misconfiguration::Permissions,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.class(), ErrorClass::Misconfigured);
    let message = error.to_string();
    assert!(message.contains(&command.to_uppercase()), "{message}");
    assert!(
        message.contains("ACL SETUSER <user>") && message.contains(&format!("+{command}")),
        "{message}"
    );
    assert!(!message.contains("app-pass"), "{message}");
}

/// `NOPERM` inside a script (Redis 7.0 words it `ERR The user executing the script can't run
/// this command`) is a refusal, not an outage, and names the command and the grant; `ping`
/// finds it before the first lock does.
#[tokio::test]
async fn noperm_inside_a_script_is_misconfigured_and_names_the_command() {
    refused_at_once_by_lock_and_ping("time").await;
}

/// A user with the documented line without `+command` is refused by a lock at once (not retried),
/// and by `ping`, each naming `command` and its grant.
async fn refused_at_once_by_lock_and_ping(command: &str) {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = user_without(&server, &format!("+{command}"));
    let started = Instant::now();
    let error = locks.try_lock("k").acquire().await.unwrap_err();
    assert_permissions(&error, command);
    assert!(
        started.elapsed() < TIMEOUT,
        "not retried: {:?}",
        started.elapsed()
    );
    assert_permissions(&locks.ping().await.unwrap_err(), command);
}

/// A command refused outside a script (`EVALSHA`: Redis 7.0 words it "this user has no
/// permissions to run the 'evalsha' command", Redis 7.2 and later and Valkey "User app has no
/// permissions ...") is a refusal that names the command and its grant, for a lock and `ping`.
#[tokio::test]
async fn a_command_refused_outside_a_script_is_misconfigured_and_names_it() {
    refused_at_once_by_lock_and_ping("evalsha").await;
}

/// Keys outside the user's patterns (Redis 7.0: "no permissions to access one of the keys",
/// Redis 7.2 and later and Valkey: "No permissions to access a key") are a refusal that says
/// which keys to grant, for a lock, `ping` and `inspect`.
#[tokio::test]
async fn keys_outside_the_users_patterns_are_misconfigured_and_name_the_grant() {
    let server = RedisServer::start();
    let mut words = acl_line(&["~other:*"], "~distlock:*");
    words.push("+publish".to_owned());
    setuser(&server, &words);
    let locks = manager(&format!("redis://app:app-pass@127.0.0.1:{}", server.port()));
    let errors = [
        locks.try_lock("k").acquire().await.map(drop).unwrap_err(),
        locks.inspect("k").await.map(drop).unwrap_err(),
        locks.ping().await.unwrap_err(),
    ];
    for error in errors {
        assert!(
            matches!(
                error,
                LockError::Misconfigured {
                    problem: Misconfiguration::Permissions,
                    ..
                }
            ),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains("ACL SETUSER <user> ~") && message.contains("*"),
            "{message}"
        );
        assert!(!message.contains("app-pass"), "{message}");
    }
}

/// `inspect` under a user without a right it reads with (`HLEN`, which the documented line
/// once lacked) is a refusal that names it, never a lock with 0 waiters: a wrong answer is
/// worse than an error.
#[tokio::test]
async fn inspect_without_a_right_it_reads_with_is_refused_not_answered_wrong() {
    let server = RedisServer::start();
    let locks = user_without(&server, "+hlen");
    let others = server.manager();
    let held = others.lock("q").acquire().await.unwrap();
    let waiter = distlock_tests::spawn_waiter(&others, "q", Duration::from_secs(10));
    distlock_tests::until_queued(&server.client().await, "q", 1).await;
    let error = locks.inspect("q").await.unwrap_err();
    assert_permissions(&error, "hlen");
    assert_permissions(&locks.ping().await.unwrap_err(), "hlen");
    held.release().await.unwrap();
    let (_, lease) = waiter.await.unwrap();
    lease.unwrap().release().await.unwrap();
}

/// A right only contention needs (`HSET`: a fair waiter queueing) passes an uncontended lock,
/// and fails the first contended one; `ping` finds it at once.
#[tokio::test]
async fn a_right_only_contention_needs_is_found_by_ping_before_any_lock() {
    let server = RedisServer::start();
    let locks = user_without(&server, "+hset");
    assert_permissions(&locks.ping().await.unwrap_err(), "hset");
    // What ping saw coming: the lock works until somebody waits.
    let held = locks.lock("k").acquire().await.unwrap();
    let error = locks
        .lock("k")
        .wait(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap_err();
    assert_permissions(&error, "hset");
    held.release().await.unwrap();
    // With the right, ping passes.
    let locks = user_without(&server, "none left out");
    locks.ping().await.unwrap();
}

/// `READONLY`: a URL that names a replica is refused as one, by `ping` and by a lock, after
/// one more try on a fresh connection.
#[tokio::test]
async fn a_replicas_url_is_refused_as_a_replica_by_ping_and_by_locks() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let locks = manager(&replica.url());
    for error in [
        locks.ping().await.unwrap_err(),
        locks.try_lock("k").acquire().await.unwrap_err(),
    ] {
        assert!(
            matches!(
                error,
                LockError::Misconfigured {
                    problem: Misconfiguration::Replica,
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(error.is_misconfigured(), "{error:?}");
        assert!(error.to_string().contains("replica"), "{error}");
    }
    manager(&primary.url()).ping().await.unwrap();
}

/// `MOVED` and `CROSSSLOT` to a manager built for one server: its URL names a Redis Cluster
/// node, which only serves its own slots. That is a misconfiguration (built with `.url`, not
/// `.cluster`), said at once with the node's URL and the builder call to use, never an outage
/// waited out; a URL's database, which a cluster node refuses to `SELECT`, is told the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_nodes_url_on_a_one_server_manager_is_misconfigured_not_unavailable() {
    let cluster = RedisCluster::start(3, 0);
    let node = cluster.node(0);
    let locks = distlock_tests::manager_at(&node.url(), TIMEOUT)
        .default_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let served_by = |owner: bool| {
        (0..)
            .map(|i| format!("moved-{i}"))
            .find(|key| (cluster.primary_of(&locks.redis_key(key)) == 0) == owner)
            .unwrap()
    };
    let (elsewhere, here) = (served_by(false), served_by(true));
    let assert_cluster_node = |error: &LockError| {
        assert!(
            matches!(
                error,
                LockError::Misconfigured {
                    problem: Misconfiguration::ClusterNode,
                    ..
                }
            ),
            "{error:?}"
        );
        assert_eq!(error.class(), ErrorClass::Misconfigured, "{error:?}");
        let message = error.to_string();
        for said in [
            "Redis Cluster node",
            node.url().as_str(),
            "LockManagerBuilder::cluster",
            "--cluster",
        ] {
            assert!(message.contains(said), "{said:?} not in: {message}");
        }
    };
    // MOVED: a key of another node's slot, by a lock that would wait 5 s for a busy key.
    let started = Instant::now();
    let error = locks.lock(elsewhere.as_str()).acquire().await.unwrap_err();
    assert_cluster_node(&error);
    assert!(
        started.elapsed() < TIMEOUT,
        "not retried: {:?}",
        started.elapsed()
    );
    assert_cluster_node(&locks.inspect(&elsewhere).await.unwrap_err());
    assert_cluster_node(&locks.force_release(&elsewhere).await.unwrap_err());
    // CROSSSLOT: keys of several slots in one call (the node's own among them).
    let error = locks
        .lock_all([here.as_str(), elsewhere.as_str()])
        .acquire()
        .await
        .unwrap_err();
    assert_cluster_node(&error);
    // The node's own slots still serve: the URL reached Redis, it is the topology that is wrong.
    let lease = locks.try_lock(here.as_str()).acquire().await.unwrap();
    lease.release().await.unwrap();
    // A database in the URL: the node refuses `SELECT 1`.
    let with_db = manager(&format!("{}/1", node.url()));
    assert_cluster_node(&with_db.try_lock("k").acquire().await.unwrap_err());
}

/// `WRONGTYPE`: a key of distlock's that another program wrote is named, with what it holds,
/// and is no outage: the lock key (any request), and a fair queue (a waiter queueing).
#[tokio::test]
async fn a_key_another_program_wrote_is_named_and_not_an_outage() {
    let server = RedisServer::start();
    let locks = server.manager();
    server.command(&["RPUSH", "distlock:lock:{list}", "someone else's"]);
    let error = locks.try_lock("list").acquire().await.unwrap_err();
    match &error {
        LockError::WrongType { key, found, .. } => {
            assert_eq!(key, "distlock:lock:{list}");
            assert_eq!(found, "a list");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(error.class(), ErrorClass::Misconfigured);
    assert!(error.to_string().contains("another program"), "{error}");
    // A fair queue that is a string: a fair request finds it in its way, an unfair one never
    // touches it.
    server.command(&["SET", "distlock:queue:{queued}", "not a list"]);
    let error = locks.lock("queued").acquire().await.unwrap_err();
    match &error {
        LockError::WrongType { key, found, .. } => {
            assert_eq!(key, "distlock:queue:{queued}");
            assert_eq!(found, "a string");
        }
        other => panic!("{other:?}"),
    }
    let lease = locks.lock("queued").fair(false).acquire().await.unwrap();
    lease.release().await.unwrap();
}

/// `OOM`: a server over its maxmemory refuses new locks, at once, as an outage that names
/// maxmemory; a lease held before still releases (the release may run out of memory).
#[tokio::test]
async fn a_server_over_maxmemory_is_unavailable_and_still_releases() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = manager(&server.url());
    let held = locks.lock("kept").acquire().await.unwrap();
    server.command(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.command(&["CONFIG", "SET", "maxmemory", "1"]);
    let started = Instant::now();
    let error = locks.try_lock("new").acquire().await.unwrap_err();
    assert!(
        started.elapsed() < TIMEOUT,
        "not retried: {:?}",
        started.elapsed()
    );
    assert!(matches!(error, LockError::Redis { .. }), "{error:?}");
    assert_eq!(error.class(), ErrorClass::Unavailable);
    assert!(error.to_string().contains("maxmemory"), "{error}");
    held.release().await.unwrap();
    assert_eq!(
        server.command(&["EXISTS", "distlock:lock:{kept}"]).trim(),
        ":0"
    );
}

/// `LOADING`: a server loading its data after a restart is asked again, 20 ms apart, within the
/// response timeout: a short timeout ends in an outage that says so, a long one in a lease.
#[tokio::test]
async fn a_server_loading_its_data_is_asked_again_within_the_response_timeout() {
    let _load = distlock_tests::timed().await;
    // Loading 20,000 keys at 100 µs each takes 2 s, and the server answers (LOADING) meanwhile.
    let mut server = RedisServer::start_with(&[
        "--key-load-delay",
        "100",
        "--loading-process-events-interval-bytes",
        "1024",
    ]);
    let fill = "for i = 1, 20000 do redis.call('SET', 'fill:' .. i, i) end";
    server.command(&["EVAL", fill, "0"]);
    server.command(&["SAVE"]);
    server.restart();
    assert!(server.command(&["GET", "fill:1"]).starts_with("-LOADING"));
    let short = manager(&server.url());
    let started = Instant::now();
    let error = short.try_lock("k").acquire().await.unwrap_err();
    assert!(
        started.elapsed() >= TIMEOUT - Duration::from_millis(50),
        "asked again: {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() < 2 * TIMEOUT, "{:?}", started.elapsed());
    assert_eq!(error.class(), ErrorClass::Unavailable, "{error:?}");
    assert!(error.to_string().contains("loading its data"), "{error}");
    let patient = distlock_tests::manager_at(&server.url(), Duration::from_secs(10))
        .build()
        .unwrap();
    let lease = patient.try_lock("k").acquire().await.unwrap();
    assert_eq!(server.command(&["EXISTS", "fill:20000"]).trim(), ":1");
    lease.release().await.unwrap();
}

/// Starts a script that never ends on `server`, from a connection of its own (kept open).
fn start_endless_script(server: &RedisServer) -> std::net::TcpStream {
    server.command(&["CONFIG", "SET", "busy-reply-threshold", "50"]);
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    let script = "while true do end";
    write!(
        stream,
        "*3\r\n$4\r\nEVAL\r\n${}\r\n{script}\r\n$1\r\n0\r\n",
        script.len()
    )
    .unwrap();
    // Past the threshold: others get BUSY.
    std::thread::sleep(Duration::from_millis(150));
    stream
}

/// `BUSY`: a server stuck in a script is asked again within the response timeout: an outage
/// that says what to do once it passes, a lease once the script is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_busy_with_a_script_is_asked_again_within_the_response_timeout() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = manager(&server.url());
    let _busy = start_endless_script(&server);
    let started = Instant::now();
    let error = locks.try_lock("k").acquire().await.unwrap_err();
    assert!(
        started.elapsed() >= TIMEOUT - Duration::from_millis(50),
        "asked again: {:?}",
        started.elapsed()
    );
    assert_eq!(error.class(), ErrorClass::Unavailable, "{error:?}");
    assert!(error.to_string().contains("SCRIPT KILL"), "{error}");
    let patient = distlock_tests::manager_at(&server.url(), Duration::from_secs(5))
        .build()
        .unwrap();
    let acquiring = tokio::spawn(async move { patient.try_lock("k").acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.command(&["SCRIPT", "KILL"]).starts_with("+OK"));
    acquiring.await.unwrap().unwrap().release().await.unwrap();
}

/// `MASTERDOWN`: a replica cut off from its primary (`replica-serve-stale-data no`) refuses even
/// a read; asked again within the response timeout, then an outage that says why. (A write
/// there is `READONLY` first: a replica's URL.)
#[tokio::test]
async fn a_replica_cut_off_from_its_primary_is_unavailable_masterdown() {
    let _load = distlock_tests::timed().await;
    let dead = distlock_tests::free_port().to_string();
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &dead,
        "--replica-serve-stale-data",
        "no",
    ]);
    let locks = manager(&replica.url());
    let started = Instant::now();
    let error = locks.inspect("k").await.unwrap_err();
    assert!(
        started.elapsed() >= TIMEOUT - Duration::from_millis(50),
        "asked again: {:?}",
        started.elapsed()
    );
    assert_eq!(error.class(), ErrorClass::Unavailable, "{error:?}");
    assert!(error.to_string().contains("lost its primary"), "{error}");
    let error = locks.try_lock("k").acquire().await.unwrap_err();
    assert!(
        matches!(
            error,
            LockError::Misconfigured {
                problem: Misconfiguration::Replica,
                ..
            }
        ),
        "{error:?}"
    );
}

/// `CLUSTERDOWN`: a cluster missing a primary refuses every key (full coverage required): sent
/// again within the response timeout, then an outage that says so; served again once the
/// primary is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_a_primary_is_clusterdown_then_serves_again() {
    let _load = distlock_tests::heavy().await;
    let mut cluster = RedisCluster::start(3, 0);
    let locks = LockManager::builder()
        .cluster(cluster.seed_urls())
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .build()
        .unwrap();
    locks.ping().await.unwrap();
    // A key on a primary that stays up.
    let dead = cluster.primary_of("distlock:lock:{gone}");
    let key = (0..100)
        .map(|i| format!("live-{i}"))
        .find(|k| cluster.primary_of(&format!("distlock:lock:{{{k}}}")) != dead)
        .unwrap();
    cluster.node_mut(dead).kill();
    // The others mark it failed after the node timeout (500 ms), and refuse every key then.
    let deadline = Instant::now() + Duration::from_secs(10);
    let error = loop {
        match locks.try_lock(key.as_str()).acquire().await {
            // The cluster may go down between the acquire and the release.
            Ok(lease) => drop(lease.release().await),
            Err(error) => break error,
        }
        assert!(Instant::now() < deadline, "the cluster never went down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(error.class(), ErrorClass::Unavailable, "{error:?}");
    assert!(error.to_string().contains("cluster is down"), "{error}");
    cluster.node_mut(dead).restart();
    let back = Instant::now();
    loop {
        if let Ok(lease) = locks.try_lock(key.as_str()).acquire().await {
            lease.release().await.unwrap();
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "never served again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `ASK`, `TRYAGAIN` and `MOVED` while a slot migrates: an extension and an acquire that find
/// the lock's keys split (the lock key moved, its fencing counter not yet) are refused with
/// `TRYAGAIN` and sent again; once both keys moved, the extension is sent to the importing node
/// after `ASKING`, and after the migration ends the acquire follows `MOVED` to the new owner
/// (where the key is held: contention, not an error); the release follows it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_is_followed_through_ask_tryagain_and_moved() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    let builder = || {
        LockManager::builder()
            .cluster(cluster.seed_urls())
            .connect_timeout(Duration::from_secs(3))
            .response_timeout(Duration::from_secs(3))
    };
    let (holder, rival) = (builder().build().unwrap(), builder().build().unwrap());
    let lock_key = holder.redis_key("mig");
    let fence_key = lock_key.replace(":lock:", ":fence:");
    let slot = cluster.slot_of(&lock_key).to_string();
    let source = cluster.primary_of(&lock_key);
    let target = (0..3).find(|&i| i != source).unwrap();
    let id = |i: usize| {
        let reply = cluster.node(i).command(&["CLUSTER", "MYID"]);
        reply.lines().nth(1).unwrap().to_owned()
    };
    let (source_id, target_id) = (id(source), id(target));
    let lease = holder
        .lock("mig")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let (src, dst) = (cluster.node(source), cluster.node(target));
    assert!(dst
        .command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id])
        .starts_with("+OK"));
    assert!(src
        .command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id])
        .starts_with("+OK"));
    let port = dst.port().to_string();
    let migrate = |key: &str| {
        let answer = src.command(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
        assert!(answer.starts_with("+OK"), "{answer}");
    };
    migrate(&lock_key);
    // The lock key is on the target now, the counter still on the source: split keys, TRYAGAIN
    // (sent again) for the extension, which keeps the counter with the lease, and the acquire.
    let extending = tokio::spawn(async move {
        let extended = lease.extend(Duration::from_secs(30)).await;
        (lease, extended)
    });
    let acquiring = tokio::spawn(async move { rival.try_lock("mig").acquire().await.map(drop) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!extending.is_finished(), "TRYAGAIN is sent again");
    assert!(!acquiring.is_finished(), "TRYAGAIN is sent again");
    migrate(&fence_key);
    // Both keys on the target: ASK, then ASKING there.
    let (lease, extended) = extending.await.unwrap();
    extended.expect("ASK followed");
    let pttl = dst.commands(&[&["ASKING"], &["PTTL", &lock_key]]).remove(1);
    let pttl: i64 = pttl.trim().trim_start_matches(':').parse().unwrap();
    assert!(pttl > 20_000, "extended on the importing node: {pttl}");
    for i in 0..3 {
        let answer = cluster
            .node(i)
            .command(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
        assert!(answer.starts_with("+OK"), "{answer}");
    }
    let error = acquiring.await.unwrap().unwrap_err();
    assert!(matches!(error, LockError::NotAcquired { .. }), "{error:?}");
    lease.release().await.unwrap();
    assert_eq!(dst.command(&["EXISTS", &lock_key]).trim(), ":0");
}

/// With `min_replicas`, a write and its `WAIT` go in one pipeline: a `MOVED` answered to the
/// write is still followed (the slot migrated since the manager learned the map).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrated_slot_is_followed_by_writes_that_wait_for_replicas() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 1);
    let locks = LockManager::builder()
        .cluster(cluster.seed_urls())
        .min_replicas(1)
        .replica_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // The manager learns the map.
    let lease = locks.lock("moving").acquire().await.unwrap();
    lease.release().await.unwrap();
    let slot = cluster.slot_of(&locks.redis_key("moving"));
    let from = cluster.primary_of_slot(slot);
    let to = (0..cluster.node_count())
        .find(|&i| i != from && cluster.replica_of(i).is_some())
        .unwrap();
    cluster.migrate_slot(slot, to);
    let lease = locks
        .lock("moving")
        .acquire()
        .await
        .expect("MOVED followed");
    lease.extend(Duration::from_secs(30)).await.unwrap();
    lease.release().await.unwrap();
}

/// The documented least-privilege user of a cluster (`+cluster|slots +asking` and the sharded
/// pub/sub commands) follows a migrating slot; without `+asking`, `ping` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_user_follows_a_migrating_slot() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    let line = |without: &str| {
        let words = acl_line(
            &[
                "+cluster|slots",
                "+asking",
                "+spublish",
                "+ssubscribe",
                "+sunsubscribe",
            ],
            without,
        );
        for i in 0..cluster.node_count() {
            setuser(cluster.node(i), &words);
        }
    };
    let manager = || {
        let seeds: Vec<String> = cluster
            .seed_urls()
            .iter()
            .map(|url| url.replacen("redis://", "redis://app:app-pass@", 1))
            .collect();
        LockManager::builder()
            .cluster(seeds)
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .build()
            .unwrap()
    };
    line("+asking");
    let error = manager().ping().await.unwrap_err();
    assert!(error.is_misconfigured(), "{error:?}");
    assert!(error.to_string().contains("+asking"), "{error}");
    line("nothing left out");
    let locks = manager();
    locks.ping().await.unwrap();
    let lease = locks
        .lock("mig-acl")
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let lock_key = locks.redis_key("mig-acl");
    let slot = cluster.slot_of(&lock_key).to_string();
    let source = cluster.primary_of(&lock_key);
    let target = (0..3).find(|&i| i != source).unwrap();
    let (src, dst) = (cluster.node(source), cluster.node(target));
    let (source_id, target_id) = (cluster.node_id(source), cluster.node_id(target));
    assert!(dst
        .command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id])
        .starts_with("+OK"));
    assert!(src
        .command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id])
        .starts_with("+OK"));
    let port = dst.port().to_string();
    // The lock key and its fencing counter (which an extension keeps with the lease).
    let fence_key = lock_key.replace(":lock:", ":fence:");
    let answer = src.command(&[
        "MIGRATE",
        "127.0.0.1",
        &port,
        "",
        "0",
        "5000",
        "KEYS",
        &lock_key,
        &fence_key,
    ]);
    assert!(answer.starts_with("+OK"), "{answer}");
    // The keys are on the importing node: ASK, then ASKING there, as the ACL user.
    lease
        .extend(Duration::from_secs(30))
        .await
        .expect("ASK followed");
    cluster.migrate_slot(cluster.slot_of(&lock_key), target);
    lease.release().await.unwrap();
}

/// A cluster endpoint that refuses every `CLUSTER` subcommand (a proxy in front of a cluster,
/// as some managed services present one; here an ACL rule) is a misconfiguration that names
/// `CLUSTER SLOTS` and says to build the manager with `.url` behind a proxy: from `ping` and
/// from the first lock, at once, never an outage waited out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_endpoint_that_refuses_every_cluster_command_is_misconfigured_not_unavailable() {
    let _load = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    // The documented cluster user, without `+cluster|slots`.
    let words = acl_line(
        &["+asking", "+spublish", "+ssubscribe", "+sunsubscribe"],
        "",
    );
    for i in 0..cluster.node_count() {
        setuser(cluster.node(i), &words);
    }
    let seeds: Vec<String> = cluster
        .seed_urls()
        .iter()
        .map(|url| url.replacen("redis://", "redis://app:app-pass@", 1))
        .collect();
    let locks = LockManager::builder()
        .cluster(seeds)
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .default_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let assert_refused = |error: LockError| {
        assert!(
            matches!(
                error,
                LockError::Misconfigured {
                    problem: Misconfiguration::Permissions,
                    ..
                }
            ),
            "{error:?}"
        );
        let message = error.to_string();
        for said in [
            "CLUSTER SLOTS",
            "+cluster|slots",
            "proxy",
            "LockManagerBuilder::url",
        ] {
            assert!(message.contains(said), "{said:?} not in: {message}");
        }
        assert!(!message.contains("app-pass"), "{message}");
    };
    let started = Instant::now();
    assert_refused(locks.ping().await.unwrap_err());
    assert_refused(locks.lock("k").acquire().await.map(drop).unwrap_err());
    assert!(
        started.elapsed() < 2 * TIMEOUT,
        "not waited out: {:?}",
        started.elapsed()
    );
}

/// Checks that `ping` and a try-lock of `locks` (a manager with `min_replicas` whose `WAIT`
/// `primary` or a proxy refuses) are both refused at once with `problem`, saying `said`, and
/// that the acquire was undone by the call itself (no background release follows).
async fn refused_at_once(
    primary: &RedisServer,
    locks: LockManager,
    problem: Misconfiguration,
    said: &str,
) {
    let started = Instant::now();
    for error in [
        locks.ping().await.unwrap_err(),
        locks.try_lock("k").acquire().await.map(drop).unwrap_err(),
    ] {
        assert!(
            matches!(&error, LockError::Misconfigured { problem: p, .. } if *p == problem),
            "{error:?}"
        );
        let message = error.to_string();
        for said in [said, "WAIT", "without min_replicas"] {
            assert!(message.contains(said), "{said:?} not in: {message}");
        }
    }
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    let calls = primary.script_calls();
    assert_eq!(
        primary.command(&["EXISTS", "distlock:lock:{k}"]).trim(),
        ":0",
        "the acquire is undone"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        primary.script_calls(),
        calls,
        "undone by the call, not by a background release"
    );
}

/// A server that refuses `WAIT` (serverless services and some proxies; here an ACL rule, a
/// server that does not offer it at all, and a proxy that does not while the server behind it
/// does) gives `ping` and the first lock of a manager with `min_replicas` a misconfiguration
/// that names `WAIT` and says to build without `min_replicas`, at once; the acquire that ran
/// before its `WAIT` was refused is undone by the call itself, not left to a background
/// release. With `WAIT` granted, the same manager locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_wait_fails_min_replicas_as_misconfigured_and_leaves_no_lock() {
    let _load = distlock_tests::timed().await;
    let manager_for = |url: &str| {
        distlock_tests::manager_at(url, TIMEOUT)
            .min_replicas(1)
            .replica_timeout(TIMEOUT)
            .build()
            .unwrap()
    };
    // An ACL rule: the documented line, without `+wait`.
    let primary = RedisServer::start();
    let _replica = RedisServer::start_replica_of(&primary);
    setuser(
        &primary,
        &acl_line(&["+publish", "+subscribe", "+unsubscribe"], ""),
    );
    let url = format!("redis://app:app-pass@127.0.0.1:{}", primary.port());
    let locks = manager_for(&url);
    let grant = "+wait";
    refused_at_once(
        &primary,
        locks.clone(),
        Misconfiguration::Permissions,
        grant,
    )
    .await;
    primary.command(&["ACL", "SETUSER", "app", "+wait"]);
    locks.ping().await.unwrap();
    let lease = locks.try_lock("k").acquire().await.unwrap();
    lease.release().await.unwrap();
    // A server without `WAIT` at all (renamed away): `ERR unknown command`.
    let renamed = RedisServer::start_with(&["--rename-command", "WAIT", ""]);
    let _replica = RedisServer::start_replica_of(&renamed);
    let offered = "does not offer WAIT";
    let locks = manager_for(&renamed.url());
    refused_at_once(&renamed, locks, Misconfiguration::Unsupported, offered).await;
    // A proxy that does not offer `WAIT` in front of a server that does: only `ping`'s own
    // `WAIT` finds it (the server's ACL check says `WAIT` is allowed).
    let proxy = distlock_tests::Proxy::start(&primary).await;
    proxy.set_mode(distlock_tests::ProxyMode::RenameWait);
    let locks = manager_for(&proxy.url());
    refused_at_once(&primary, locks, Misconfiguration::Unsupported, offered).await;
    manager_for(&primary.url()).ping().await.unwrap();
}
