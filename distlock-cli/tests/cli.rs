//! The `distlock` binary against a real Redis: inspect, list and release, as tables and JSON.

use std::process::{Command, Output};
use std::time::Duration;

use distlock_tests::RedisServer;

fn distlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(args)
        .output()
        .expect("run distlock")
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

#[test]
fn bad_arguments_and_an_unreachable_redis_fail_clearly() {
    let none = distlock(&["inspect", "k"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("exactly one of --url"));
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
