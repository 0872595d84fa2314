//! Mutual exclusion: non-atomic read-modify-write under one lock ends exact.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_tests::RedisServer;
use redis::AsyncCommands;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_tasks_increment_exactly_under_one_lock() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let locks = locks.clone();
        let mut conn = server.client().await;
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let mut conn = conn.clone();
                locks
                    .lock("counter-lock")
                    .wait(Duration::from_secs(60))
                    .run(async move {
                        let value: i64 = conn
                            .get::<_, Option<i64>>("counter")
                            .await
                            .unwrap()
                            .unwrap_or(0);
                        tokio::task::yield_now().await;
                        conn.set::<_, _, ()>("counter", value + 1).await.unwrap();
                    })
                    .await
                    .expect("locked increment");
            }
            let _: Option<i64> = conn.get("counter").await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut conn = server.client().await;
    let total: i64 = conn.get("counter").await.unwrap();
    assert_eq!(total, 32 * 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_increment_exactly_under_one_lock() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let url = server.url();
    distlock_tests::run_processes(
        env!("CARGO_BIN_EXE_lock_worker"),
        &["count", &url, "xproc-lock", "xproc-counter", "100"],
        3,
    )
    .await;
    let mut conn = server.client().await;
    let done: i64 = conn.get("xproc-counter:done").await.unwrap();
    assert_eq!(done, 3);
    let total: i64 = conn.get("xproc-counter").await.unwrap();
    assert_eq!(total, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_of_two_serves_a_hundred_concurrently_locked_bodies() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let locks = server.manager_builder().pool_size(2).build().unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let all_inside = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let (pool_user, inside, all_inside, release) = (
            locks.clone(),
            inside.clone(),
            all_inside.clone(),
            release.clone(),
        );
        let pool = pool_user
            .pool()
            .expect("a standalone manager has a pool")
            .clone();
        tasks.push(tokio::spawn(async move {
            pool_user
                .lock(format!("body-{i}"))
                .run(async move {
                    if inside.fetch_add(1, Ordering::SeqCst) + 1 == 100 {
                        all_inside.notify_one();
                    }
                    // Stay inside until all 100 bodies run at once.
                    release.acquire().await.unwrap().forget();
                    // distlock holds none of the pool's two connections: each body can borrow
                    // one (the pool waits at most its 1 s wait timeout for a free one).
                    let mut conn = pool.get().await.expect("a pooled connection");
                    let pong: String = redis::cmd("PING").query_async(&mut *conn).await.unwrap();
                    assert_eq!(pong, "PONG");
                })
                .await
        }));
    }
    tokio::time::timeout(Duration::from_secs(10), all_inside.notified())
        .await
        .expect("all 100 bodies held their locks at the same time");
    release.add_permits(100);
    for task in tasks {
        task.await.unwrap().expect("body ran under its lock");
    }
}
