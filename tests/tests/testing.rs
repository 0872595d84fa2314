//! The runtime's `testing` feature as a user meets it: `TestRedis` and the topology builders
//! through their public API (the rest of the suite uses them through the harness), their
//! processes gone when dropped, and the errors of a missing or too old `redis-server`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_runtime::testing::{
    TestCluster, TestQuorum, TestRedis, TestRedisError, TestSentinel, PROGRAM_ENV,
};
use distlock_runtime::{LockError, LockManager};

/// The child test that starts a server with whatever `PATH` and `DISTLOCK_REDIS_SERVER` its
/// parent gave it: it runs only when this variable is set.
const CHILD: &str = "DISTLOCK_TESTING_CHILD";

/// Whether a process `pid` exists (`kill -0`).
fn process_exists(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run kill -0")
        .success()
}

/// Whether anything accepts connections on loopback port `port`.
fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The port of a `redis://127.0.0.1:PORT` URL.
fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// Takes `key` with `holder`, checks that `other` cannot take it meanwhile (a try-lock), and
/// releases it.
async fn excludes(holder: &LockManager, other: &LockManager, key: &str) {
    let lease = holder.lock(key).acquire().await.expect("the first lease");
    let second = other.lock(key).wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(second, Err(LockError::NotAcquired { .. })),
        "a second holder of {key}: {second:?}"
    );
    lease.release().await.expect("release");
    other
        .lock(key)
        .wait(Duration::ZERO)
        .acquire()
        .await
        .expect("free again after the release")
        .release()
        .await
        .expect("release");
}

#[tokio::test]
async fn a_test_server_runs_without_persistence_and_its_manager_excludes_a_second_holder() {
    let redis = TestRedis::start().await.expect("a test server");
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}", redis.port()));
    assert!(redis.pid().is_some_and(process_exists));
    // Persistence off: nothing survives it, nothing is left on disk by it.
    let save = redis.command(&["CONFIG", "GET", "save"]).unwrap();
    assert!(save.ends_with("$4\r\nsave\r\n$0\r\n\r\n"), "{save:?}");
    let aof = redis.command(&["CONFIG", "GET", "appendonly"]).unwrap();
    assert!(aof.ends_with("$2\r\nno\r\n"), "{aof:?}");
    excludes(&redis.manager(), &redis.manager(), "testing-one").await;
    // The lock lives in this server.
    let lease = redis.manager().lock("testing-two").acquire().await.unwrap();
    assert_eq!(
        redis
            .command(&["EXISTS", "distlock:lock:{testing-two}"])
            .unwrap(),
        ":1\r\n"
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn starting_a_server_leaves_the_runtime_thread_free() {
    // On this current-thread runtime, a start that blocked the thread would finish within its
    // first poll, before the other branch of the join ran.
    let order = Arc::new(Mutex::new(vec![]));
    let started = async {
        let redis = TestRedis::start().await.expect("a test server");
        order.lock().unwrap().push("started");
        redis
    };
    let other = async {
        order.lock().unwrap().push("other task");
    };
    let (_redis, ()) = tokio::join!(started, other);
    assert_eq!(*order.lock().unwrap(), ["other task", "started"]);
}

#[test]
fn dropping_a_test_server_stops_its_process_and_frees_its_port() {
    let redis = TestRedis::start_blocking().expect("a test server");
    let (pid, port) = (redis.pid().unwrap(), redis.port());
    assert!(process_exists(pid) && listening(port));
    drop(redis);
    assert!(!process_exists(pid), "redis-server {pid} still runs");
    assert!(!listening(port), "port {port} still answers");
}

#[test]
fn pause_resume_kill_and_restart_act_on_the_server() {
    let mut redis = TestRedis::start_blocking().expect("a test server");
    let (pid, port) = (redis.pid().unwrap(), redis.port());
    let state = |pid: u32| {
        let out = std::process::Command::new("ps")
            .args(["-o", "stat=", "-p", &pid.to_string()])
            .output()
            .expect("run ps");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    redis.pause().unwrap();
    assert!(state(pid).starts_with('T'), "paused: {}", state(pid));
    redis.resume().unwrap();
    assert!(!state(pid).starts_with('T'), "resumed: {}", state(pid));
    assert_eq!(redis.command(&["SET", "k", "v"]).unwrap(), "+OK\r\n");

    redis.kill();
    assert_eq!(redis.pid(), None);
    assert!(!process_exists(pid) && !listening(port));
    assert!(matches!(
        redis.command(&["PING"]),
        Err(TestRedisError::Unreachable { .. })
    ));

    redis.restart().unwrap();
    let new_pid = redis.pid().unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(redis.port(), port, "restarted on its port");
    assert_eq!(redis.command(&["EXISTS", "k"]).unwrap(), ":0\r\n", "empty");
    // Dropped while paused: still stopped.
    redis.pause().unwrap();
    drop(redis);
    assert!(
        !process_exists(new_pid),
        "a paused server outlived its drop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_gives_a_manager_that_locks_in_every_slot_and_stops_every_node() {
    let cluster = TestCluster::start(3, 0).await.expect("a test cluster");
    assert_eq!(cluster.node_count(), 3);
    let (a, b) = (cluster.manager(), cluster.manager());
    // A key on each primary.
    let mut keys: Vec<(usize, String)> = vec![];
    for n in 0.. {
        let key = format!("testing-{n}");
        let primary = cluster.primary_of(&key).unwrap();
        if keys.iter().all(|(other, _)| *other != primary) {
            keys.push((primary, key));
        }
        if keys.len() == 3 {
            break;
        }
    }
    for (_, key) in &keys {
        excludes(&a, &b, key).await;
    }
    let pids: Vec<u32> = (0..3).map(|i| cluster.node(i).pid().unwrap()).collect();
    let ports: Vec<u16> = cluster.seed_urls().iter().map(|u| port_of(u)).collect();
    drop(cluster);
    for (pid, port) in pids.into_iter().zip(ports) {
        assert!(
            !process_exists(pid) && !listening(port),
            "node {pid} on {port}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_group_gives_a_manager_for_its_primary_and_stops_every_process() {
    let group = TestSentinel::start(1, 2)
        .await
        .expect("a test sentinel group");
    let (a, b) = (group.manager(), group.manager());
    excludes(&a, &b, "testing-s").await;
    let lease = a.lock("testing-s").acquire().await.unwrap();
    let primary = group.server(group.primary_index().unwrap());
    assert_eq!(
        primary
            .command(&["EXISTS", "distlock:lock:{testing-s}"])
            .unwrap(),
        ":1\r\n"
    );
    lease.release().await.unwrap();
    let mut ports: Vec<u16> = group.sentinel_urls().iter().map(|u| port_of(u)).collect();
    ports.extend((0..group.server_count()).map(|i| group.server(i).port()));
    drop(group);
    for port in ports {
        assert!(!listening(port), "port {port} still answers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_gives_a_manager_that_outlives_a_minority_and_stops_every_server() {
    let mut quorum = TestQuorum::start(3).await.expect("a test quorum");
    assert_eq!(quorum.urls().len(), 3);
    let (a, b) = (quorum.manager(), quorum.manager());
    quorum.server_mut(0).kill();
    excludes(&a, &b, "testing-q").await;
    let pids: Vec<u32> = (1..3).map(|i| quorum.server(i).pid().unwrap()).collect();
    drop(quorum);
    assert!(pids.into_iter().all(|pid| !process_exists(pid)));
}

#[tokio::test]
async fn a_server_that_cannot_start_on_its_port_says_why_and_how_to_see_more() {
    let redis = TestRedis::start().await.expect("a test server");
    // Its port is taken: the second server exits at once.
    let error = TestRedis::builder()
        .port(redis.port())
        .start()
        .await
        .expect_err("the port is taken");
    let message = error.to_string();
    assert!(
        matches!(error, TestRedisError::Startup { .. })
            && message.contains(&format!(
                "exited at once (exit status: 1) on port {}",
                redis.port()
            ))
            && message.contains(&format!("--port {} --bind 127.0.0.1", redis.port()))
            && message.contains("run it by hand"),
        "{message}"
    );
    // The first server is untouched.
    assert_eq!(redis.command(&["PING"]).unwrap(), "+PONG\r\n");
}

#[tokio::test]
async fn a_redis_server_that_is_not_installed_is_named_with_how_to_install_it() {
    let missing = "distlock-no-such-redis-server";
    let error = TestRedis::builder()
        .program(missing)
        .start()
        .await
        .expect_err("no such program");
    assert!(
        matches!(&error, TestRedisError::NotInstalled { program } if program == missing),
        "{error:?}"
    );
    let message = error.to_string();
    for advice in [
        missing,
        "apt-get install redis-server",
        "brew install redis",
        "apt-get install valkey-server",
        "brew install valkey",
        "PATH",
        PROGRAM_ENV,
    ] {
        assert!(message.contains(advice), "{advice:?} not in: {message}");
    }
}

/// Runs the child test below in a process of its own with `env` (so this process's `PATH`,
/// which the other tests use, stays as it is), and returns what it printed.
fn child_output(env: &[(&str, &std::ffi::OsStr)]) -> String {
    let exe = std::env::current_exe().expect("this test binary");
    let mut child = std::process::Command::new(exe);
    child
        .args([
            "--exact",
            "a_start_with_the_path_its_parent_gave_prints_what_it_started",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env_remove(PROGRAM_ENV);
    for (name, value) in env {
        child.env(name, value);
    }
    let output = child.output().expect("run the child test");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "the child test failed: {stdout}");
    stdout
}

#[test]
#[ignore = "run only as the child of the tests below, with PATH changed"]
fn a_start_with_the_path_its_parent_gave_prints_what_it_started() {
    if std::env::var_os(CHILD).is_none() {
        return; // An `--ignored` run without the parent: nothing to check.
    }
    for _ in 0..50 {
        match TestRedis::start_blocking() {
            Ok(redis) => {
                let info = redis.command(&["INFO", "server"]).unwrap();
                let name = info
                    .lines()
                    .find_map(|line| line.strip_prefix("server_name:"))
                    .unwrap_or("redis");
                println!("child started: {} ({name})", redis.program().display());
                return;
            }
            // The wrapper script, just written: busy while a process another test forked
            // meanwhile still holds it open.
            Err(TestRedisError::Io { source, .. }) if source.raw_os_error() == Some(26) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(error) => {
                println!("child error: {error}");
                return;
            }
        }
    }
}

#[test]
fn without_redis_server_on_path_or_where_the_variable_says_the_start_says_how_to_install_it() {
    let empty = std::env::temp_dir().join(format!("distlock-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = child_output(&[("PATH", empty.as_os_str())]);
    std::fs::remove_dir(&empty).unwrap();
    for said in [
        "child error: `redis-server` was not found",
        "apt-get install redis-server",
        "apt-get install valkey-server",
        "valkey-server",
    ] {
        assert!(out.contains(said), "{said:?} not in: {out}");
    }
    // The variable names the program instead.
    let elsewhere = std::ffi::OsStr::new("/nonexistent/distlock/redis-server");
    let out = child_output(&[(PROGRAM_ENV, elsewhere)]);
    assert!(
        out.contains("child error: `/nonexistent/distlock/redis-server` was not found"),
        "{out}"
    );
}

/// Where `name` is on this process's `PATH`.
fn on_path(name: &std::path::Path) -> Option<std::path::PathBuf> {
    if name.is_absolute() {
        return Some(name.to_owned());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// With `valkey-server` on `PATH` and no `redis-server`, as on a machine with only Valkey
/// installed, the server started is `valkey-server` (here a script that runs this run's server,
/// so the test needs no Valkey of its own; the Valkey pass of CI runs it on Valkey itself).
#[test]
fn without_redis_server_on_path_valkey_server_is_started() {
    use std::os::unix::fs::PermissionsExt;
    let real = {
        let server = TestRedis::start_blocking().unwrap();
        on_path(server.program()).expect("this run's server on PATH")
    };
    let dir = std::env::temp_dir().join(format!("distlock-valkey-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wrapper = dir.join("valkey-server");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nexec '{}' \"$@\"\n", real.display()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = child_output(&[("PATH", dir.as_os_str())]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.contains("child started: valkey-server ("), "{out}");
}

#[tokio::test]
async fn a_redis_server_older_than_7_is_refused_with_the_minimum_version() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("distlock-old-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("redis-server");
    std::fs::write(
        &program,
        "#!/bin/sh\necho 'Redis server v=6.2.14 sha=00000000:0 malloc=jemalloc-5.2.1 bits=64'\n",
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut error = None;
    for _ in 0..50 {
        let refused = TestRedis::builder().program(&program).start().await;
        match refused.expect_err("too old") {
            // A process another test forked while the script was open for writing holds it
            // open until it execs: the script is busy for that moment.
            TestRedisError::Io { source, .. } if source.raw_os_error() == Some(26) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => {
                error = Some(other);
                break;
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let error = error.expect("the script ran");
    assert!(
        matches!(&error, TestRedisError::TooOld { version, .. } if version == "6.2.14"),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("Redis 6.2.14") && message.contains("older than Redis 7.0"),
        "{message}"
    );
}
