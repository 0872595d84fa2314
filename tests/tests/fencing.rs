//! Fencing tokens strictly increase per key, across clients and across expiry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_strictly_increase_over_1000_acquisitions_by_16_tasks() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shared = server.manager();
    let mut tasks = Vec::new();
    for task in 0..16 {
        // Half the tasks share a manager, half have their own: tokens order across clients too.
        let locks = if task % 2 == 0 {
            shared.clone()
        } else {
            server.manager()
        };
        let seen = seen.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..1000 / 16 + 1 {
                let lease = locks
                    .lock("fenced")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                    .unwrap();
                seen.lock().unwrap().push(lease.fencing_token());
                lease.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert!(seen.len() >= 1000);
    for pair in seen.windows(2) {
        assert!(
            pair[1] > pair[0],
            "fencing token went from {} to {}",
            pair[0],
            pair[1]
        );
    }
}

#[tokio::test]
async fn a_token_drawn_after_an_expiry_is_greater() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let first = server.manager();
    let second = server.manager();
    let expired = first
        .lock("fenced")
        .ttl(Duration::from_millis(50))
        .renew(false)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(expired.is_lost());
    let next = second
        .try_lock("fenced")
        .acquire()
        .await
        .expect("expired lock is free");
    assert!(next.fencing_token() > expired.fencing_token());
    // A different key of the same prefix also moves forward.
    let other = second.lock("other").acquire().await.unwrap();
    assert!(other.fencing_token() > next.fencing_token());
}
