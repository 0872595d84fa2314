//! Where the `distlock` binary finds its Redis: `REDIS_URL` and the `DISTLOCK_` variables
//! (flags beat them), and a URL's topology found by asking its server: a cluster node is used
//! as a seed of its cluster, a Sentinel that monitors one primary as that primary's Sentinel.

use std::process::{Command, Output};
use std::time::Duration;

use distlock_runtime::{Lease, LockManager};
use distlock_tests::topology::{RedisCluster, SentinelGroup};
use distlock_tests::RedisServer;

mod common;

/// Every variable the tool reads: none leaks in from the environment the tests run in.
const VARIABLES: [&str; 10] = [
    "REDIS_URL",
    "DISTLOCK_CLUSTER",
    "DISTLOCK_SENTINEL",
    "DISTLOCK_SENTINEL_URLS",
    "DISTLOCK_QUORUM",
    "DISTLOCK_PREFIX",
    "DISTLOCK_TLS_CA",
    "DISTLOCK_TLS_CERT",
    "DISTLOCK_TLS_KEY",
    "DISTLOCK_TIMEOUT_MS",
];

/// Runs `distlock args` with the variables `env` set, and no other of [`VARIABLES`].
fn distlock(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    for variable in VARIABLES {
        command.env_remove(variable);
    }
    command
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("run distlock")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The keys `distlock ... --json list` printed, sorted; asserts it succeeded.
fn listed(env: &[(&str, &str)], args: &[&str]) -> Vec<String> {
    let mut all = args.to_vec();
    all.extend(["--json", "list"]);
    let output = distlock(env, &all);
    assert!(output.status.success(), "distlock {all:?}: {output:?}");
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no JSON on stdout ({e}): {output:?}"));
    common::sorted_keys(&rows)
}

async fn hold(locks: &LockManager, keys: &[String]) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(keys.len());
    for key in keys {
        let lease = locks
            .lock(key.as_str())
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("acquire {key}: {e}"));
        leases.push(lease);
    }
    leases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_alone_is_used_and_flags_beat_the_environment() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let (on_a, on_b) = (vec!["env-a".to_owned()], vec!["env-b".to_owned()]);
    let _held = (
        hold(&a.manager(), &on_a).await,
        hold(&b.manager(), &on_b).await,
    );
    let billing = a.manager_builder().prefix("billing:").build().unwrap();
    let on_billing = vec!["invoice-7".to_owned()];
    let _billed = hold(&billing, &on_billing).await;
    let (url_a, url_b) = (a.url(), b.url());

    assert_eq!(listed(&[("REDIS_URL", &url_a)], &[]), on_a);
    // A flag beats REDIS_URL, wherever it stands on the line.
    assert_eq!(listed(&[("REDIS_URL", &url_a)], &["--url", &url_b]), on_b);
    let after = distlock(
        &[("REDIS_URL", &url_a)],
        &["--json", "list", "--url", &url_b],
    );
    assert!(
        String::from_utf8_lossy(&after.stdout).contains("env-b"),
        "{after:?}"
    );
    // Also a topology flag of another kind: REDIS_URL is then not read at all.
    let quorum = distlock(
        &[("REDIS_URL", &url_a)],
        &["--quorum", &url_b, "--json", "list"],
    );
    assert_eq!(quorum.status.code(), Some(2), "{quorum:?}");
    assert!(
        stderr(&quorum).contains("3 independent primaries"),
        "{quorum:?}"
    );
    // A DISTLOCK_ topology beats REDIS_URL.
    let node_list = format!("{url_b},{url_b},{url_b}");
    let from_env = distlock(
        &[("REDIS_URL", &url_a), ("DISTLOCK_QUORUM", &node_list)],
        &["--json", "list"],
    );
    assert!(from_env.status.success(), "{from_env:?}");
    assert!(
        String::from_utf8_lossy(&from_env.stdout).contains("env-b"),
        "{from_env:?}"
    );
    // The other settings: DISTLOCK_PREFIX, and --prefix over it.
    let env = [
        ("REDIS_URL", url_a.as_str()),
        ("DISTLOCK_PREFIX", "billing:"),
    ];
    assert_eq!(listed(&env, &[]), on_billing);
    assert_eq!(listed(&env, &["--prefix", "distlock:"]), on_a);
    // Nothing printed on stderr for one server: nothing was found other than asked.
    let quiet = distlock(&[("REDIS_URL", &url_a)], &["list"]);
    assert_eq!(stderr(&quiet), "", "{quiet:?}");
}

#[test]
fn with_nothing_given_the_error_names_redis_url_and_never_a_password() {
    let none = distlock(&[], &["list"]);
    assert_eq!(none.status.code(), Some(2), "{none:?}");
    let said = stderr(&none);
    assert!(
        said.contains("REDIS_URL") && said.contains("--url"),
        "{said}"
    );
    // A password in REDIS_URL shows neither in the error nor in --help.
    let env = [
        ("REDIS_URL", "redis://app:env-secret-42@127.0.0.1:1"),
        ("DISTLOCK_TIMEOUT_MS", "300"),
    ];
    let down = distlock(&env, &["list"]);
    assert_eq!(down.status.code(), Some(1), "{down:?}");
    let help = distlock(&env, &["--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("REDIS_URL"));
    for output in [&down, &help] {
        assert!(
            !format!("{output:?}").contains("env-secret-42"),
            "{output:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_to_one_cluster_node_reaches_the_locks_on_every_primary() {
    let cluster = RedisCluster::start(3, 0);
    let locks = LockManager::builder()
        .cluster(cluster.seed_urls())
        .build()
        .unwrap();
    let mut keys: Vec<String> = (0..12).map(|i| format!("cli-node-{i}")).collect();
    keys.sort();
    let owners: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| cluster.primary_of(&locks.redis_key(k)))
        .collect();
    assert_eq!(owners.len(), 3, "the keys are served by every primary");
    let leases = hold(&locks, &keys).await;
    let node = cluster.node(0).url();

    // `list` sees every primary's locks; one line on stderr says why, stdout stays JSON.
    let output = distlock(&[], &["--url", &node, "--json", "list"]);
    assert!(output.status.success(), "{output:?}");
    let said = stderr(&output);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("Redis Cluster node"), "{said}");
    assert_eq!(listed(&[], &["--url", &node]), keys);
    assert_eq!(listed(&[("REDIS_URL", &node)], &[]), keys);

    // `inspect` and `release` reach a key another node serves.
    let (i, elsewhere) = keys
        .iter()
        .enumerate()
        .find(|(_, k)| cluster.primary_of(&locks.redis_key(k)) != 0)
        .unwrap();
    let shown = distlock(&[], &["--url", &node, "--json", "inspect", elsewhere]);
    assert!(shown.status.success(), "{shown:?}");
    let rows: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(rows[0]["held"], true, "{rows}");
    assert_eq!(
        rows[0]["fencing_token"].as_u64(),
        Some(leases[i].fencing_token())
    );
    let released = distlock(
        &[("REDIS_URL", &node)],
        &["--json", "release", elsewhere, "--force"],
    );
    assert!(released.status.success(), "{released:?}");
    let answer: serde_json::Value = serde_json::from_slice(&released.stdout).unwrap();
    assert_eq!(answer["released"], true, "{answer}");
    assert!(locks.inspect(elsewhere).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_to_a_sentinel_uses_its_one_primary_and_names_the_flags_for_several() {
    let group = SentinelGroup::start(0, 1);
    let sentinel = group.sentinel_urls().remove(0);
    let locks = LockManager::builder()
        .sentinel(group.master_name(), [sentinel.as_str()])
        .build()
        .unwrap();
    let keys = vec!["cli-sentinel-url".to_owned()];
    let _held = hold(&locks, &keys).await;

    let output = distlock(&[], &["--url", &sentinel, "--json", "list"]);
    assert!(output.status.success(), "{output:?}");
    let said = stderr(&output);
    assert!(
        said.contains("Sentinel") && said.contains(group.master_name()),
        "{said}"
    );
    assert_eq!(listed(&[("REDIS_URL", &sentinel)], &[]), keys);

    // A second primary monitored: which one is meant cannot be guessed.
    let other = RedisServer::start();
    let port = sentinel.rsplit(':').next().unwrap();
    let monitor = Command::new("redis-cli")
        .args(["-p", port, "SENTINEL", "MONITOR", "cli-other", "127.0.0.1"])
        .arg(other.port().to_string())
        .arg("1")
        .output()
        .expect("run redis-cli");
    assert!(
        String::from_utf8_lossy(&monitor.stdout).contains("OK"),
        "{monitor:?}"
    );
    let refused = distlock(&[], &["--url", &sentinel, "list"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let said = stderr(&refused);
    for named in [
        group.master_name(),
        "cli-other",
        "--sentinel NAME --sentinel-url URL",
    ] {
        assert!(said.contains(named), "{named:?} not in: {said}");
    }
    assert!(refused.stdout.is_empty(), "{refused:?}");
}

/// The documented least-privilege ACL user may not run `HELLO`: its server is taken for one
/// server, and the tool works as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_user_that_may_not_ask_is_served_as_one_server() {
    let server = RedisServer::start();
    let line = distlock_tests::documented_acl_user("app", "app-pass", &[], "");
    let words: Vec<&str> = line.iter().map(String::as_str).collect();
    assert_eq!(server.command(&words).trim(), "+OK");
    let keys = vec!["cli-acl".to_owned()];
    let leases = hold(&server.manager(), &keys).await;
    let url = format!("redis://app:app-pass@127.0.0.1:{}", server.port());
    let shown = distlock(&[("REDIS_URL", &url)], &["--json", "inspect", "cli-acl"]);
    assert!(shown.status.success(), "{shown:?}");
    assert_eq!(stderr(&shown), "", "{shown:?}");
    let rows: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(
        rows[0]["fencing_token"].as_u64(),
        Some(leases[0].fencing_token())
    );
}
