//! The `distlock` binary against a real Redis: inspect, list and release, as tables and JSON;
//! an election's leader; on a cluster, a Sentinel-named primary, a quorum, and under a custom
//! key prefix.

use std::process::{Command, Output};
use std::time::Duration;

use distlock_runtime::{Lease, LockManager, LockManagerBuilder};
use distlock_tests::topology::{QuorumSet, RedisCluster, SentinelGroup};
use distlock_tests::RedisServer;

mod common;

/// Runs `distlock args`, without the variables it reads (`settings.rs` tests those).
fn distlock(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    for (variable, _) in std::env::vars() {
        if variable == "REDIS_URL" || variable.starts_with("DISTLOCK_") {
            command.env_remove(variable);
        }
    }
    command.args(args).output().expect("run distlock")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_release_a_held_lock() {
    let server = RedisServer::start();
    let url = server.url();
    let locks = server
        .manager_builder()
        .holder_label("worker-7")
        .build()
        .unwrap();
    let lease = locks
        .lock("order:42")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let token = lease.fencing_token().to_string();

    let shown = distlock(&["--url", &url, "inspect", "order:42", "order:43"]);
    assert!(shown.status.success(), "{shown:?}");
    let table = stdout(&shown);
    assert!(
        table.contains("order:42") && table.contains("worker-7"),
        "{table}"
    );
    assert!(table.contains(&token), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("order:43") && l.contains("free")),
        "{table}"
    );

    let listed = distlock(&["--url", &url, "--json", "list", "order:*"]);
    assert!(listed.status.success(), "{listed:?}");
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["key"], "order:42");
    assert_eq!(rows[0]["holder"], "worker-7");
    assert_eq!(
        rows[0]["fencing_token"].as_u64(),
        Some(lease.fencing_token())
    );
    assert!(rows[0]["remaining_ms"].as_u64().unwrap() > 50_000);

    // Not without --force.
    let refused = distlock(&["--url", &url, "release", "order:42"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--force"));
    assert!(locks.inspect("order:42").await.unwrap().is_some());

    let released = distlock(&["--url", &url, "--json", "release", "order:42", "--force"]);
    assert!(released.status.success(), "{released:?}");
    let answer: serde_json::Value = serde_json::from_slice(&released.stdout).unwrap();
    assert_eq!(answer["released"], true);
    assert!(locks.inspect("order:42").await.unwrap().is_none());
    let empty = distlock(&["--url", &url, "list"]);
    assert!(stdout(&empty).contains("no locks held"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_keys_and_semaphores_show_their_mode_and_every_holder() {
    let server = RedisServer::start();
    let url = server.url();
    let (web, job) = (server.labelled("web-1"), server.labelled("job-2"));
    let ttl = Duration::from_secs(60);
    let a = web.read_lock("doc:7").ttl(ttl).acquire().await.unwrap();
    let b = job.read_lock("doc:7").ttl(ttl).acquire().await.unwrap();
    let p = web
        .lock("exports")
        .permits(4)
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();

    let shown = distlock(&["--url", &url, "inspect", "doc:7", "exports"]);
    assert!(shown.status.success(), "{shown:?}");
    let table = stdout(&shown);
    let doc = table.lines().find(|l| l.starts_with("doc:7")).unwrap();
    assert!(
        doc.contains("shared") && doc.contains("web-1") && doc.contains("job-2"),
        "{table}"
    );
    let exports = table.lines().find(|l| l.starts_with("exports")).unwrap();
    assert!(exports.contains("4 permits"), "{table}");

    let listed = distlock(&["--url", &url, "--json", "list"]);
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(rows[0]["key"], "doc:7");
    assert_eq!(rows[0]["mode"], "shared");
    assert_eq!(rows[0]["holders"], 2);
    let mut labels: Vec<String> = serde_json::from_value(rows[0]["holder_labels"].clone()).unwrap();
    labels.sort();
    assert_eq!(labels, ["job-2", "web-1"]);
    assert_eq!(rows[1]["mode"], "permits");
    assert_eq!(rows[1]["permits"], 4);
    assert_eq!(rows[1]["holders"], 1);

    // A forced release frees every reader.
    let released = distlock(&["--url", &url, "release", "doc:7", "--force"]);
    assert!(released.status.success(), "{released:?}");
    assert!(web.inspect("doc:7").await.unwrap().is_none());
    drop((a, b, p));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_shows_an_elections_leader_and_term_and_list_marks_the_election() {
    let server = RedisServer::start();
    let url = server.url();
    let ttl = Duration::from_secs(3);
    let alpha = server.labelled("alpha").election("scheduler").ttl(ttl);
    let term = alpha.campaign().await.unwrap();
    let first = term.fencing_token();
    // A second candidate queues behind the leader.
    let beta = server.labelled("beta").election("scheduler").ttl(ttl);
    let queued = beta.clone();
    let next = tokio::spawn(async move { queued.campaign().await.unwrap() });
    let candidate_queued = distlock_tests::eventually(Duration::from_secs(5), || async {
        alpha
            .leader()
            .await
            .unwrap()
            .is_some_and(|leader| leader.candidates == 1)
    })
    .await;
    assert!(candidate_queued.is_some(), "beta queues as a candidate");
    let _order = server
        .labelled("worker-7")
        .lock("order:42")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();

    let shown = distlock(&["--url", &url, "leader", "scheduler", "idle"]);
    assert!(shown.status.success(), "{shown:?}");
    let table = stdout(&shown);
    let led = table.lines().find(|l| l.starts_with("scheduler")).unwrap();
    assert!(
        led.ends_with("  alpha") && led.contains(&format!("  {first}  ")),
        "{table}"
    );
    let idle = table.lines().find(|l| l.starts_with("idle")).unwrap();
    assert!(idle.contains("no leader"), "{table}");

    let rows = distlock_json(
        &["--url".to_owned(), url.clone()],
        &["leader", "scheduler", "idle"],
    );
    assert_eq!(rows[0]["election"], "scheduler", "{rows}");
    assert_eq!(rows[0]["led"], true, "{rows}");
    assert_eq!(rows[0]["label"], "alpha", "{rows}");
    assert_eq!(rows[0]["fencing_token"].as_u64(), Some(first), "{rows}");
    assert_eq!(rows[0]["candidates"], 1, "{rows}");
    assert_eq!(
        rows[0]["token_prefix"].as_str().map(str::len),
        Some(8),
        "{rows}"
    );
    let remaining = rows[0]["remaining_ms"].as_u64().unwrap();
    assert!(remaining > 0 && remaining <= 3_000, "{rows}");
    assert_eq!(rows[1]["election"], "idle", "{rows}");
    assert_eq!(rows[1]["led"], false, "{rows}");
    assert!(
        rows[1]["label"].is_null() && rows[1]["fencing_token"].is_null(),
        "{rows}"
    );

    // `list` marks the election's key, and only it.
    let listed = distlock(&["--url", &url, "list"]);
    assert!(listed.status.success(), "{listed:?}");
    let table = stdout(&listed);
    let election = table
        .lines()
        .find(|l| l.starts_with("election:scheduler"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        election.contains("  election  ") && election.ends_with("  alpha"),
        "{table}"
    );
    let order = table.lines().find(|l| l.starts_with("order:42")).unwrap();
    assert!(
        order.contains("  exclusive  ") && !order.contains("election"),
        "{table}"
    );
    let rows = distlock_json(&["--url".to_owned(), url.clone()], &["list"]);
    let rows = rows.as_array().unwrap();
    let election = rows
        .iter()
        .find(|r| r["key"] == "election:scheduler")
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(election["election"], "scheduler", "{election}");
    assert_eq!(election["mode"], "exclusive", "{election}");
    assert_eq!(election["holder"], "alpha", "{election}");
    let order = rows.iter().find(|r| r["key"] == "order:42").unwrap();
    assert!(order["election"].is_null(), "{order}");

    // Resigning hands the lead to beta at once, in a later term.
    term.resign().await.unwrap();
    let term = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("beta leads after alpha resigned")
        .unwrap();
    assert!(term.fencing_token() > first);
    let rows = distlock_json(&["--url".to_owned(), url.clone()], &["leader", "scheduler"]);
    assert_eq!(rows[0]["label"], "beta", "{rows}");
    assert_eq!(
        rows[0]["fencing_token"].as_u64(),
        Some(term.fencing_token()),
        "{rows}"
    );
    assert_eq!(rows[0]["candidates"], 0, "{rows}");

    // Once the last candidate resigns, nobody leads.
    term.resign().await.unwrap();
    let shown = distlock(&["--url", &url, "leader", "scheduler"]);
    assert!(shown.status.success(), "{shown:?}");
    let table = stdout(&shown);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("scheduler") && l.contains("no leader")),
        "{table}"
    );
    let rows = distlock_json(&["--url".to_owned(), url.clone()], &["leader", "scheduler"]);
    assert_eq!(rows[0]["led"], false, "{rows}");
    assert!(rows[0]["label"].is_null(), "{rows}");
    assert!(beta.leader().await.unwrap().is_none());
    let listed = stdout(&distlock(&["--url", &url, "list"]));
    assert!(!listed.contains("election"), "{listed}");
}

#[test]
fn bad_arguments_and_an_unreachable_redis_fail_clearly() {
    let none = distlock(&["inspect", "k"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("pass --url"));
    let two = distlock(&[
        "--url",
        "redis://127.0.0.1:1",
        "--quorum",
        "redis://127.0.0.1:2",
        "list",
    ]);
    assert_eq!(two.status.code(), Some(2));
    // A password in the URL never shows, also when Redis cannot be reached.
    let down = distlock(&[
        "--url",
        "redis://app:cli-secret-99@127.0.0.1:1",
        "--timeout-ms",
        "300",
        "list",
    ]);
    assert_eq!(down.status.code(), Some(1));
    let all = format!("{down:?}");
    assert!(!all.contains("cli-secret-99"), "{all}");
}

#[test]
fn mutual_tls_with_certificate_files() {
    if distlock_tests::tls::skip_without_tls("mutual_tls_with_certificate_files") {
        return;
    }
    use distlock_tests::tls::{ClientCerts, TestCa, TlsServer};
    let ca = TestCa::new();
    let server = TlsServer::start(&ca, ClientCerts::Required);
    let path = |file: &str| ca.path(file).to_string_lossy().into_owned();
    let (ca_file, cert, key) = (path("ca.crt"), path("client.crt"), path("client.key"));
    let url = server.url();
    let listed = distlock(&[
        "--url",
        &url,
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "list",
    ]);
    assert!(listed.status.success(), "{listed:?}");
    assert!(stdout(&listed).contains("no locks held"));
    // Without the client certificate the server refuses it: a clear error, not a hang.
    let refused = distlock(&[
        "--url",
        &url,
        "--tls-ca",
        &ca_file,
        "--timeout-ms",
        "1000",
        "list",
    ]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
}

/// Runs `distlock` with the `topology` options and `--json`, then `args`; asserts that it
/// succeeded, and returns what it printed.
fn distlock_json(topology: &[String], args: &[&str]) -> serde_json::Value {
    let mut all: Vec<&str> = topology.iter().map(String::as_str).collect();
    all.push("--json");
    all.extend_from_slice(args);
    let output = distlock(&all);
    assert!(output.status.success(), "distlock {all:?}: {output:?}");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("distlock {all:?} printed no JSON ({e}): {output:?}"))
}

/// The keys of the rows `list` printed, sorted.
fn listed(topology: &[String]) -> Vec<String> {
    common::sorted_keys(&distlock_json(topology, &["list"]))
}

/// Holds each of `keys` through `locks` for a minute.
async fn hold(locks: &LockManager, keys: &[String]) -> Vec<Lease> {
    hold_renewed(locks, keys, true).await
}

/// [`hold`], with renewal or without (a holder that no longer renews, as if stuck, never
/// learns that its lock was broken, and never cleans up after it).
async fn hold_renewed(locks: &LockManager, keys: &[String], renew: bool) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(keys.len());
    for key in keys {
        let lease = locks
            .lock(key.as_str())
            .ttl(Duration::from_secs(60))
            .renew(renew)
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("acquire {key}: {e}"));
        leases.push(lease);
    }
    leases
}

/// Checks that `distlock` with the `topology` options sees exactly the locks `leases` hold
/// (taken by a manager with the holder label `worker-7`): `list` shows them and nothing else,
/// `inspect` shows each with its fencing token and a free key as free; then breaks the first
/// with `release --force`, which must say it was held; returns its key and the others.
fn sees_and_breaks(topology: &[String], leases: &[Lease]) -> (String, Vec<String>) {
    let mut keys: Vec<String> = leases.iter().map(|l| l.keys()[0].clone()).collect();
    keys.sort();
    assert_eq!(listed(topology), keys);

    let mut asked: Vec<&str> = vec!["inspect"];
    asked.extend(leases.iter().map(|l| l.keys()[0].as_str()));
    asked.push("cli-never-taken");
    let rows = distlock_json(topology, &asked);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), leases.len() + 1, "{rows:?}");
    for (row, lease) in rows.iter().zip(leases) {
        assert_eq!(row["key"], lease.keys()[0].as_str(), "{row}");
        assert_eq!(row["held"], true, "{row}");
        assert_eq!(row["holder"], "worker-7", "{row}");
        assert_eq!(
            row["fencing_token"].as_u64(),
            Some(lease.fencing_token()),
            "{row}"
        );
    }
    assert_eq!(rows[leases.len()]["key"], "cli-never-taken");
    assert_eq!(rows[leases.len()]["held"], false);

    let released = distlock_json(topology, &["release", &keys[0], "--force"]);
    assert_eq!(released["released"], true, "{released}");
    let broken = keys.remove(0);
    (broken, keys)
}

/// Checks that the lock on `key`, broken by [`sees_and_breaks`], is gone: for `locks` (the
/// manager that held it), on every server `held_on_a_server` asks, and for the tool, which
/// lists only `rest` (sorted).
async fn broken_everywhere(
    topology: &[String],
    locks: &LockManager,
    key: &str,
    rest: &[String],
    held_on_a_server: impl Fn(&str) -> bool,
) {
    assert!(!held_on_a_server(key), "{key} is still held on a server");
    assert!(locks.inspect(key).await.unwrap().is_none());
    assert_eq!(listed(topology), rest);
    let again = distlock_json(topology, &["release", key, "--force"]);
    assert_eq!(again["released"], false, "{again}");
}

/// A lock another application holds on the same servers, under a prefix of its own: the tool
/// (with the default prefix) must not show it.
async fn other_apps_lock(builder: LockManagerBuilder) -> Lease {
    let other = builder.prefix("other-app:").build().unwrap();
    other
        .lock("cli-other-app")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_tool_sees_the_locks_on_every_primary_from_one_seed() {
    let cluster = RedisCluster::start(3, 0);
    let seeds = cluster.seed_urls();
    let builder = || LockManager::builder().cluster(seeds.clone());
    let locks = builder().holder_label("worker-7").build().unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("cli-cluster-{i}")).collect();
    let primaries: std::collections::HashSet<usize> =
        keys.iter().map(|k| cluster.primary_of(k)).collect();
    assert_eq!(primaries.len(), 3, "the keys are served by every primary");
    let leases = hold(&locks, &keys).await;
    let _other_app = other_apps_lock(builder()).await;
    // Data in the locks' slots, beside them.
    for key in &keys {
        let data = format!("{{{key}}}:data");
        let owner = cluster.node(cluster.primary_of(key));
        assert_eq!(owner.command(&["SET", &data, "x"]), "+OK\r\n");
    }
    // One seed: the tool finds the other primaries by itself.
    let topology = ["--cluster".to_owned(), seeds[0].clone()];
    let (broken, rest) = sees_and_breaks(&topology, &leases);
    broken_everywhere(&topology, &locks, &broken, &rest, |key| {
        let lock = format!("distlock:lock:{{{key}}}");
        (0..cluster.node_count()).any(|i| cluster.node(i).command(&["EXISTS", &lock]) == ":1\r\n")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_the_tool_sees_the_locks_on_the_named_primary() {
    let group = SentinelGroup::start(1, 1);
    let builder = || LockManager::builder().sentinel(group.master_name(), group.sentinel_urls());
    let locks = builder().holder_label("worker-7").build().unwrap();
    let keys: Vec<String> = (0..3).map(|i| format!("cli-sentinel-{i}")).collect();
    let leases = hold(&locks, &keys).await;
    let _other_app = other_apps_lock(builder()).await;
    let mut topology = vec!["--sentinel".to_owned(), group.master_name().to_owned()];
    for url in group.sentinel_urls() {
        topology.extend(["--sentinel-url".to_owned(), url]);
    }
    let primary = group.server(group.primary_index());
    let (broken, rest) = sees_and_breaks(&topology, &leases);
    broken_everywhere(&topology, &locks, &broken, &rest, |key| {
        primary.command(&["EXISTS", &format!("distlock:lock:{{{key}}}")]) == ":1\r\n"
    })
    .await;
}

/// Three quorum nodes, and a manager (labelled `worker-7`) holding a lock on each of `keys` on
/// all of them without renewing it, as a stuck holder would (a renewing one, finding its lock
/// gone from a majority, releases it on the last node itself), beside [`other_apps_lock`].
struct QuorumLocks {
    nodes: QuorumSet,
    locks: LockManager,
    leases: Vec<Lease>,
    _other_app: Lease,
}

impl QuorumLocks {
    async fn start(keys: &[String]) -> Self {
        let nodes = QuorumSet::start(3);
        let builder = || LockManager::builder().quorum(nodes.urls());
        let locks = builder().holder_label("worker-7").build().unwrap();
        let leases = hold_renewed(&locks, keys, false).await;
        let other_app = other_apps_lock(builder()).await;
        let quorum = Self {
            nodes,
            locks,
            leases,
            _other_app: other_app,
        };
        // A round ends at a majority; the last node's grant follows.
        for key in keys {
            let everywhere = distlock_tests::eventually(Duration::from_secs(2), || async {
                quorum.holders(key) == 3
            })
            .await;
            assert!(everywhere.is_some(), "every node holds {key}");
        }
        quorum
    }

    /// How many nodes hold the lock on `key`.
    fn holders(&self, key: &str) -> usize {
        let lock = format!("distlock:lock:{{{key}}}");
        (0..3)
            .filter(|&i| self.nodes.server(i).command(&["EXISTS", &lock]) == ":1\r\n")
            .count()
    }

    /// The tool's options for this quorum: `--quorum URL` for each node.
    fn topology(&self) -> Vec<String> {
        self.nodes
            .urls()
            .into_iter()
            .flat_map(|url| ["--quorum".to_owned(), url])
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_quorum_the_tool_sees_the_locks_and_a_forced_release_frees_a_majority() {
    let keys: Vec<String> = (0..3).map(|i| format!("cli-quorum-{i}")).collect();
    let quorum = QuorumLocks::start(&keys).await;
    let (broken, _) = sees_and_breaks(&quorum.topology(), &quorum.leases);
    // What the release promises when it returns: a majority of nodes are free, so the lock
    // can be taken again at once. (Whether the last node is freed too is
    // `a_forced_release_on_a_quorum_frees_every_node`'s question.)
    assert!(quorum.holders(&broken) <= 1, "{broken} held on a majority");
    let lease = quorum.locks.try_lock(&broken).acquire().await.unwrap();
    lease.release().await.unwrap();
}

/// Fails today: `distlock` exits as soon as a majority of nodes answered the forced release,
/// which cancels the request to the last node (the quorum route leaves it to a spawned task,
/// which dies with the tool's runtime), so that node keeps the lock until its ttl, and
/// `inspect` (and so `list`) shows it held whenever that node answers first. Seen in several
/// releases out of twenty on every run here; the same twenty forced releases made by a
/// long-lived manager free every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_on_a_quorum_frees_every_node() {
    let keys: Vec<String> = (0..20).map(|i| format!("cli-quorum-{i:02}")).collect();
    let quorum = QuorumLocks::start(&keys).await;
    let topology = quorum.topology();
    let mut left_behind = vec![];
    for key in &keys {
        let released = distlock_json(&topology, &["release", key, "--force"]);
        assert_eq!(released["released"], true, "{released}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        if quorum.holders(key) > 0 {
            left_behind.push(key.clone());
        }
    }
    assert!(
        left_behind.is_empty(),
        "still held on a node after `release --force`: {left_behind:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_prefix_the_tool_sees_that_prefixs_locks_only() {
    let server = RedisServer::start();
    let locks = server
        .manager_builder()
        .prefix("billing:")
        .holder_label("worker-7")
        .build()
        .unwrap();
    let keys = vec!["invoice:7".to_owned(), "invoice:8".to_owned()];
    let leases = hold(&locks, &keys).await;
    // The same keys under the default prefix, held by another manager.
    let default_prefix = server.manager();
    let others = hold(&default_prefix, &keys).await;
    let topology = [
        "--url".to_owned(),
        server.url(),
        "--prefix".to_owned(),
        "billing:".to_owned(),
    ];
    let (broken, rest) = sees_and_breaks(&topology, &leases);
    broken_everywhere(&topology, &locks, &broken, &rest, |key| {
        server.command(&["EXISTS", &format!("billing:lock:{{{key}}}")]) == ":1\r\n"
    })
    .await;
    // The default prefix's locks were not touched.
    let unprefixed = ["--url".to_owned(), server.url()];
    assert_eq!(listed(&unprefixed), keys);
    for (key, other) in keys.iter().zip(&others) {
        let info = default_prefix.inspect(key).await.unwrap().unwrap();
        assert_eq!(info.fencing_token, other.fencing_token());
    }
}
