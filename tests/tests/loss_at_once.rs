//! Loss at once: a forced release in one process stops the holder's body in another within
//! 100 ms of its return, not at the holder's next renewal (10 s at the ttl of 30 s the holders
//! here take), on one server, a cluster and Sentinel, in every mode and for an election's term.
//! A holder whose manager cannot hear it (no subscriber connection) still learns at its next
//! renewal.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock_runtime::{LockError, LockManager};
use distlock_tests::topology::{RedisCluster, SentinelGroup};
use distlock_tests::{eventually, RedisServer};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// How soon after the forced release returns the holder's lock call must have returned.
const AT_ONCE: Duration = Duration::from_millis(100);

/// A `lock_worker body` process holding `key` in `mode` on `topology`, once its body runs.
struct Holder {
    _child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Holder {
    async fn start(topology: &str, key: &str, mode: &str) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
            .args(["body", topology, key, mode])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start lock_worker");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("the holder's body started in time")
            .unwrap();
        assert_eq!(first.as_deref(), Some("acquired"), "{first:?}");
        Self {
            _child: child,
            lines,
        }
    }

    /// When (wall clock, ms) its lock call returned `LeaseLost`; panics on any other outcome, or
    /// none within `within`.
    async fn lost(&mut self, within: Duration) -> u128 {
        let line = tokio::time::timeout(within, self.lines.next_line())
            .await
            .expect("the holder's lock call returned in time")
            .unwrap()
            .unwrap_or_default();
        let at = line
            .strip_prefix("lost ")
            .unwrap_or_else(|| panic!("{line}"));
        at.parse().unwrap()
    }
}

fn wall_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// How many connections of the servers at `urls` are subscribed to the forced-release channel
/// of the default prefix.
async fn listening(urls: &[String]) -> i64 {
    let mut total = 0;
    for url in urls {
        let Ok(client) = redis::Client::open(url.as_str()) else {
            continue;
        };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            continue;
        };
        let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("distlock:forced")
            .query_async(&mut conn)
            .await
            .unwrap_or_default();
        total += counts.iter().map(|(_, n)| n).sum::<i64>();
    }
    total
}

/// Waits until `n` managers listen for forced releases on the servers at `urls`.
async fn until_listening(urls: &[String], n: i64) {
    let found = eventually(Duration::from_secs(5), || async {
        listening(urls).await >= n
    })
    .await;
    assert!(
        found.is_some(),
        "the holders never subscribed to distlock:forced"
    );
}

/// Force-releases `key` from `operator` (this process) and checks that every holder's lock
/// call returned within [`AT_ONCE`] of that.
async fn force_and_check(operator: &LockManager, key: &str, holders: &mut [Holder]) {
    assert!(operator.force_release(key).await.unwrap());
    let returned = wall_ms();
    for holder in holders {
        let lost = holder.lost(Duration::from_secs(5)).await;
        let late = lost.saturating_sub(returned);
        println!("{key}: the holder's lock call returned {late} ms after the forced release");
        assert!(
            late <= AT_ONCE.as_millis(),
            "the holder stopped {late} ms after the forced release returned"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_stops_the_holders_body_in_another_process_at_once() {
    // Alone in this binary: a 100 ms bound on a loaded 2-core machine.
    let _alone = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let topology = format!("url={}", server.url());
    let urls = [server.url()];
    let operator = server.manager();
    // An annotated fn's body; then `run`'s.
    for (key, mode) in [("forced-attr", "attr"), ("forced-run", "x")] {
        let mut holder = [Holder::start(&topology, key, mode).await];
        until_listening(&urls, 1).await;
        force_and_check(&operator, key, &mut holder).await;
        until_listening(&urls, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_stops_every_reader_and_permit_holder_and_a_leader_at_once() {
    // Alone in this binary: a 100 ms bound on a loaded 2-core machine.
    let _alone = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let topology = format!("url={}", server.url());
    let urls = [server.url()];
    let operator = server.manager();
    for (key, mode) in [("forced-r", "r"), ("forced-p", "p3")] {
        let mut holders = [
            Holder::start(&topology, key, mode).await,
            Holder::start(&topology, key, mode).await,
        ];
        until_listening(&urls, 2).await;
        force_and_check(&operator, key, &mut holders).await;
        until_listening(&urls, 0).await;
    }
    let mut leader = [Holder::start(&topology, "forced", "election").await];
    until_listening(&urls, 1).await;
    force_and_check(&operator, "election:forced", &mut leader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_on_a_cluster_stops_the_holder_at_once() {
    // Alone in this binary: a 100 ms bound on a loaded 2-core machine.
    let _alone = distlock_tests::heavy().await;
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.seed_urls();
    let topology = format!("cluster={}", urls.join(","));
    let operator = LockManager::builder()
        .cluster(urls.clone())
        .build()
        .unwrap();
    // The notice is PUBLISHed on the key's node, and heard on whichever node the holder's
    // manager subscribed on: keys on each of the three primaries.
    let mut keys: Vec<String> = Vec::new();
    for i in 0.. {
        let key = format!("forced-{i}");
        let primary = cluster.primary_of(&format!("distlock:lock:{{{key}}}"));
        if !keys
            .iter()
            .any(|k| cluster.primary_of(&format!("distlock:lock:{{{k}}}")) == primary)
        {
            keys.push(key);
        }
        if keys.len() == 3 {
            break;
        }
    }
    for key in &keys {
        let mut holder = [Holder::start(&topology, key, "x").await];
        until_listening(&urls, 1).await;
        force_and_check(&operator, key, &mut holder).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_on_sentinel_stops_the_holder_at_once() {
    // Alone in this binary: a 100 ms bound on a loaded 2-core machine.
    let _alone = distlock_tests::heavy().await;
    let group = SentinelGroup::start(1, 1);
    let topology = format!(
        "sentinel={}@{}",
        group.master_name(),
        group.sentinel_urls().join(",")
    );
    let primary = group.server(group.primary_index()).url();
    let operator = LockManager::builder()
        .sentinel(group.master_name(), group.sentinel_urls())
        .build()
        .unwrap();
    let mut holder = [Holder::start(&topology, "forced-s", "x").await];
    until_listening(&[primary], 1).await;
    force_and_check(&operator, "forced-s", &mut holder).await;
}

#[tokio::test]
async fn a_holder_that_cannot_hear_the_notice_learns_at_its_next_renewal() {
    let server = RedisServer::start();
    // On a caller's pool, the manager has no subscriber connection.
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let holder = LockManager::builder().pool(pool).build().unwrap();
    let operator = server.manager();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let body = tokio::spawn(async move {
        holder
            .lock("deaf")
            .ttl(Duration::from_millis(1500))
            .run(async move {
                let _ = started_tx.send(());
                tokio::time::sleep(Duration::from_secs(30)).await;
            })
            .await
    });
    started_rx.await.unwrap();
    let forced = tokio::time::Instant::now();
    assert!(operator.force_release("deaf").await.unwrap());
    let lost = tokio::time::timeout(Duration::from_secs(3), body)
        .await
        .expect("the holder learns of the loss at its next renewal (ttl/3)")
        .unwrap();
    assert!(matches!(lost, Err(LockError::LeaseLost { .. })), "{lost:?}");
    // Not at once: at its renewal, half a second on.
    assert!(
        forced.elapsed() > Duration::from_millis(250),
        "{:?}",
        forced.elapsed()
    );
}

#[tokio::test]
async fn forced_releases_names_each_key_and_the_holders_it_freed() {
    let server = RedisServer::start();
    let operator = server.manager();
    let mut forced = operator.forced_releases().unwrap();
    until_listening(&[server.url()], 1).await;
    let (web, job) = (server.labelled("web-1"), server.labelled("job-7"));
    let a = web.read_lock("report 7").acquire().await.unwrap();
    let b = job.read_lock("report 7").acquire().await.unwrap();
    // The holders' managers subscribed too (from their first lease).
    until_listening(&[server.url()], 3).await;
    assert!(operator.force_release("report 7").await.unwrap());
    let heard = tokio::time::timeout(Duration::from_secs(2), forced.next())
        .await
        .expect("the forced release was heard")
        .unwrap();
    assert_eq!(heard.key, "report 7");
    let mut holders = heard.holders.clone();
    holders.sort();
    assert_eq!(holders, ["job-7", "web-1"]);
    let both = eventually(Duration::from_secs(1), || async {
        a.is_lost() && b.is_lost()
    });
    assert!(both.await.is_some(), "the readers' leases were not ended");
    // A free key's forced release frees nobody, and tells nobody.
    assert!(!operator.force_release("report 8").await.unwrap());
    let nothing = tokio::time::timeout(Duration::from_millis(300), forced.next()).await;
    assert!(nothing.is_err(), "{nothing:?}");

    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let on_pool = LockManager::builder().pool(pool).build().unwrap();
    assert!(matches!(
        on_pool.forced_releases(),
        Err(LockError::InvalidConfig { what: "pool", .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_on_a_quorum_stops_each_permit_holder_at_once() {
    // Alone in this binary: a 100 ms bound on a loaded 2-core machine.
    let _alone = distlock_tests::heavy().await;
    let quorum = distlock_tests::topology::QuorumSet::start(3);
    let urls = quorum.urls();
    let topology = format!("quorum={}", urls.join(","));
    let operator = LockManager::builder().quorum(urls.clone()).build().unwrap();
    // Every node publishes the holders it freed; each manager hears the node it subscribed on.
    let mut holders = [
        Holder::start(&topology, "forced-q", "p2").await,
        Holder::start(&topology, "forced-q", "p2").await,
    ];
    until_listening(&urls, 2).await;
    force_and_check(&operator, "forced-q", &mut holders).await;
}

/// A user whose channel rights cover the locks' channels but not `distlock:forced` (on a
/// cluster: the sharded commands without the plain ones) keeps its waiters' notifications
/// while it holds leases: only the forced-release channel is refused, and said so once.
#[tokio::test]
async fn a_refused_forced_release_channel_refuses_nothing_else() {
    let (logs, _capture) = distlock_tests::Logs::capture();
    let server = RedisServer::start();
    let commands = &distlock_tests::documented_acl_lines()[0];
    for line in [
        commands.replace("CHANGE-ME", "narrow-41"),
        "ACL SETUSER distlock &distlock:lock:* +publish +subscribe +unsubscribe".to_owned(),
    ] {
        let args: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(server.command(&args).trim(), "+OK", "{line}");
    }
    let url = format!("redis://distlock:narrow-41@127.0.0.1:{}", server.port());
    let locks = LockManager::builder().url(url).build().unwrap();
    // Holding a lease, the manager asks for the forced-release channel, and is refused.
    let held = locks.lock("narrow-held").acquire().await.unwrap();
    let refused = eventually(Duration::from_secs(5), || async {
        logs.count("may not subscribe to forced-release notices") == 1
    });
    assert!(refused.await.is_some(), "{}", logs.text());
    // A waiter still subscribes to its key's channel, and is woken by the release.
    let holder = server.manager();
    let other = holder.lock("narrow-busy").acquire().await.unwrap();
    let waiting = distlock_tests::spawn_waiter(&locks, "narrow-busy", Duration::from_secs(10));
    let conn = server.client().await;
    distlock_tests::until_subscribed(&conn, "narrow-busy").await;
    other.release().await.unwrap();
    waiting.await.unwrap().1.unwrap().release().await.unwrap();
    held.release().await.unwrap();
    assert_eq!(
        logs.count("may not subscribe to release notifications"),
        0,
        "{}",
        logs.text()
    );
}
