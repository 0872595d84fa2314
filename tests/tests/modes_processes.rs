//! Read-write locks and semaphores across OS processes: readers in several processes share and
//! writers exclude them, and a reader or permit holder killed with SIGKILL gives its share back
//! within its own ttl while the other holders keep theirs.

use std::time::Duration;

use distlock_runtime::{LockError, LockManager};
use distlock_tests::RedisServer;
use tokio::process::Child;
use tokio::time::Instant;

/// A `lock_worker` process started with `args`, once it printed `acquired`.
async fn holder(args: &[&str]) -> Child {
    distlock_tests::holder_process(env!("CARGO_BIN_EXE_lock_worker"), args).await
}

async fn kill(mut child: Child) -> Instant {
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    Instant::now()
}

async fn count(server: &RedisServer, name: &str) -> i64 {
    let mut conn = server.client().await;
    redis::cmd("GET")
        .arg(name)
        .query_async::<Option<i64>>(&mut conn)
        .await
        .unwrap()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_in_three_processes_share_and_their_writers_exclude_them() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let url = server.url();
    // Each process: 60 stays, every 6th a write.
    distlock_tests::run_processes(
        env!("CARGO_BIN_EXE_lock_worker"),
        &["rw", &url, "shelf", "60", "6"],
        3,
    )
    .await;
    assert_eq!(count(&server, "room:{shelf}:violations").await, 0);
    assert!(
        count(&server, "room:{shelf}:shared").await > 0,
        "readers of different processes were inside together"
    );
}

#[tokio::test]
async fn a_killed_reader_process_gives_its_share_back_within_its_ttl() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let child = holder(&["hold-read", &server.url(), "doc", "1000"]).await;
    let live = locks
        .read_lock("doc")
        .ttl(Duration::from_millis(1000))
        .acquire()
        .await
        .unwrap();
    // Both held, and renewed, past their ttl.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(locks.inspect("doc").await.unwrap().unwrap().holders, 2);
    let killed = kill(child).await;
    // The live reader keeps renewing; the killed one's share expires on its own.
    let freed = distlock_tests::eventually(Duration::from_secs(3), || async {
        locks.inspect("doc").await.unwrap().unwrap().holders == 1
    })
    .await
    .expect("the killed reader's share expired");
    assert!(killed.elapsed() <= Duration::from_millis(1300), "{freed:?}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!live.is_lost(), "the live reader kept its lease");
    let writer = locks.lock("doc").wait(Duration::ZERO).acquire().await;
    assert!(
        matches!(writer, Err(LockError::NotAcquired { .. })),
        "{writer:?}"
    );
    live.release().await.unwrap();
    let writer = locks.lock("doc").wait(Duration::ZERO).acquire().await;
    assert!(writer.is_ok(), "{writer:?}");
}

#[tokio::test]
async fn a_killed_permit_holder_gives_its_permit_back_to_a_waiter_within_its_ttl() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks: LockManager = server.manager();
    let url = server.url();
    let first = holder(&["hold-permit", &url, "pool", "2", "1000"]).await;
    let _second = holder(&["hold-permit", &url, "pool", "2", "1000"]).await;
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .lock("pool")
                .permits(2)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!waiter.is_finished(), "both permits held and renewed");
    let killed = kill(first).await;
    let lease = waiter.await.unwrap().expect("a permit came back");
    assert!(
        killed.elapsed() <= Duration::from_millis(1300),
        "{:?}",
        killed.elapsed()
    );
    assert_eq!(locks.inspect("pool").await.unwrap().unwrap().holders, 2);
    lease.release().await.unwrap();
}
