//! The demos keep to themselves: with no `REDIS_URL` they start a throwaway `redis-server` and
//! say so, and never write into a server nobody gave them (such as whatever answers on
//! 127.0.0.1:6379, which may be someone's development database); instances started one by one
//! refuse to run without a Redis they can share.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use distlock_tests::RedisServer;

mod common;

/// Runs the seckill example with `args`, `REDIS_URL` set to `redis_url` or removed; killed if
/// it has not finished within a minute (a server instance that should have refused runs on).
fn seckill(args: &[&str], redis_url: Option<&str>) -> Output {
    let mut command = Command::new(common::example_binary("seckill"));
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match redis_url {
        Some(url) => command.env("REDIS_URL", url),
        None => command.env_remove("REDIS_URL"),
    };
    let mut child = command.spawn().expect("run the seckill example");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait for the example").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("the example's output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn without_redis_url_the_seckill_demo_starts_its_own_server_and_says_so() {
    let output = seckill(&["demo", "--buyers", "40", "--stock", "10"], None);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "demo failed:\n{stderr}\n{stdout}");
    let redis_line = stderr
        .lines()
        .find(|line| line.starts_with("Redis: "))
        .unwrap_or_else(|| panic!("the demo says which Redis it uses:\n{stderr}"));
    assert!(
        redis_line.contains("a throwaway redis-server on port"),
        "{redis_line}"
    );
    assert!(!redis_line.contains(":6379"), "{redis_line}");
    // It did the demo's work on that server: the lock strategy sold exactly the stock.
    assert!(
        stdout
            .lines()
            .any(|line| line.contains("lock") && line.contains("sold=10")),
        "{stdout}"
    );
}

#[test]
fn with_redis_url_the_seckill_demo_uses_that_server_only() {
    let server = RedisServer::start();
    let before = server.requests();
    let output = seckill(
        &["demo", "--buyers", "20", "--stock", "5"],
        Some(&server.url()),
    );
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "demo failed:\n{stderr}");
    assert!(
        stderr.contains(&format!("127.0.0.1:{} (REDIS_URL)", server.port())),
        "{stderr}"
    );
    assert!(!stderr.contains("throwaway"), "{stderr}");
    assert!(
        server.requests() > before + 20,
        "the demo's requests went elsewhere"
    );
}

#[test]
fn an_instance_started_by_hand_without_redis_url_refuses_and_says_how() {
    let output = seckill(&["serve", "--addr", "127.0.0.1:0"], None);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("set REDIS_URL"), "{stderr}");
    assert!(stderr.contains("run the demo"), "{stderr}");
}
