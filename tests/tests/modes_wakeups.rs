//! Read-write locks and semaphores: who is woken, and when. Every waiter that could enter is told
//! so at once (a notification or a hand-off), whatever let it in: a writer that left, a release
//! that handed the key to fair readers, a waiter ahead of it that gave up. And what an operator
//! reads of a shared lease (its log line, its token) is true.

use std::time::Duration;

use distlock_runtime::{Lease, LockError, LockManager};
use distlock_tests::RedisServer;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(30);
/// How long a waiter may take to notice a key it can enter (a notification and one attempt).
const PROMPT: Duration = Duration::from_millis(1500);

/// How many members `server` holds in `key`'s holders.
fn members(server: &RedisServer, key: &str) -> usize {
    let reply = server.command(&["ZCARD", &format!("distlock:holders:{{{key}}}")]);
    reply.trim().trim_start_matches(':').parse().unwrap_or(0)
}

fn spawn_reader(
    locks: &LockManager,
    key: &'static str,
    fair: bool,
    wait: Duration,
    started: Instant,
) -> tokio::task::JoinHandle<(Result<Lease, LockError>, Duration)> {
    let locks = locks.clone();
    tokio::spawn(async move {
        let lease = locks
            .read_lock(key)
            .fair(fair)
            .ttl(LONG)
            .wait(wait)
            .acquire()
            .await;
        (lease, started.elapsed())
    })
}

/// Unfair readers of one manager wait behind a writer; the writer's release publishes one
/// notification, which the manager gives to one local waiter. A waiter that takes the key
/// shared passes the notification on, so the other readers enter beside it at once (they used
/// to sleep until the writer's old expiry or their own deadline).
#[tokio::test]
async fn unfair_readers_of_one_manager_all_enter_when_the_writer_leaves() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let writer = locks.lock("rv-doc").ttl(LONG).acquire().await.unwrap();
    let started = Instant::now();
    let readers: Vec<_> = (0..3)
        .map(|_| spawn_reader(&locks, "rv-doc", false, Duration::from_secs(5), started))
        .collect();
    let conn = server.client().await;
    distlock_tests::until_subscribed(&conn, "rv-doc").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = started.elapsed();
    writer.release().await.unwrap();
    let mut leases = Vec::new();
    for reader in readers {
        let (lease, at) = reader.await.unwrap();
        leases.push(lease.expect("the reader enters in the end"));
        assert!(
            at < released_at + PROMPT,
            "a reader entered {:?} after the writer left",
            at - released_at
        );
    }
}

/// A writer's release that hands the key to a queued fair reader also announces the release, so
/// an unfair reader that waits for the same writer learns that the key is readable now (it used
/// to sleep until the writer's old expiry or its own deadline).
#[tokio::test]
async fn an_unfair_reader_enters_when_the_release_hands_the_key_to_a_fair_reader() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let (locks, others) = (server.manager(), server.manager());
    let conn = server.client().await;
    let writer = locks.lock("rv-served").ttl(LONG).acquire().await.unwrap();
    let started = Instant::now();
    let fair = spawn_reader(&locks, "rv-served", true, Duration::from_secs(5), started);
    distlock_tests::until_queued(&conn, "rv-served", 1).await;
    let unfair = spawn_reader(&others, "rv-served", false, Duration::from_secs(5), started);
    distlock_tests::until_subscribed(&conn, "rv-served").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = started.elapsed();
    writer.release().await.unwrap();
    let (fair_lease, fair_at) = fair.await.unwrap();
    let _fair_lease = fair_lease.expect("the fair reader is handed the key");
    assert!(fair_at < released_at + PROMPT, "{fair_at:?}");
    let (unfair_lease, unfair_at) = unfair.await.unwrap();
    let _unfair_lease = unfair_lease.expect("the unfair reader enters in the end");
    assert!(
        unfair_at < released_at + PROMPT,
        "the unfair reader entered {:?} after the writer left, the fair one {:?}",
        unfair_at - released_at,
        fair_at - released_at
    );
}

/// A fair writer queued behind a reader leaves (its call is cancelled: a request timeout, a
/// client gone); its release takes it out of the queue and serves the queue behind it, so a fair
/// reader queued behind it, which fits beside the reader that holds the key, enters at once (it
/// used to sleep until that reader's expiry or its own deadline).
#[tokio::test]
async fn readers_queued_behind_a_writer_that_leaves_enter_at_once() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let (locks, writers, readers) = (server.manager(), server.manager(), server.manager());
    let conn = server.client().await;
    let holder = locks
        .read_lock("rv-left")
        .ttl(LONG)
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let writer = {
        let writers = writers.clone();
        tokio::spawn(async move { writers.lock("rv-left").ttl(LONG).wait(LONG).acquire().await })
    };
    distlock_tests::until_queued(&conn, "rv-left", 1).await;
    let reader = spawn_reader(&readers, "rv-left", true, Duration::from_secs(5), started);
    distlock_tests::until_queued(&conn, "rv-left", 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer.abort();
    assert!(writer.await.is_err(), "the writer was cancelled");
    let left_at = started.elapsed();
    // Its release took it out of the queue (and served the reader behind it).
    let mut queue = conn.clone();
    let out = distlock_tests::eventually(Duration::from_secs(5), || {
        let mut queue = queue.clone();
        async move { distlock_tests::queued(&mut queue, "rv-left").await < 2 }
    })
    .await;
    assert!(out.is_some(), "the writer left the queue");
    let _ = &mut queue;
    let (lease, at) = reader.await.unwrap();
    let _lease = lease.expect("the reader enters in the end");
    assert!(
        at < left_at + PROMPT,
        "the reader entered {:?} after the writer ahead of it left",
        at - left_at
    );
    drop(holder);
}

/// A fair waiter that gives up after it was handed a share releases that share (its release knows its mode), so the share is not left held by nobody
/// and a writer queued behind it gets the key.
#[tokio::test]
async fn a_leaving_waiter_gives_back_a_share_handed_to_it() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let conn = server.client().await;
    let writer = locks.lock("rv-share").ttl(LONG).acquire().await.unwrap();
    // The reader gives up right as the writer leaves: cancelled, with its share possibly handed.
    let reader = {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .read_lock("rv-share")
                .ttl(LONG)
                .wait(LONG)
                .acquire()
                .await
        })
    };
    distlock_tests::until_queued(&conn, "rv-share", 1).await;
    writer.release().await.unwrap();
    // The release handed the reader its share (a member, for a claim) in the same script.
    assert_eq!(members(&server, "rv-share"), 1);
    reader.abort();
    let _ = reader.await;
    // Whatever the reader was handed is given back: a writer gets the key well within a claim.
    let started = Instant::now();
    let next = locks
        .lock("rv-share")
        .ttl(LONG)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .expect("the key is free again");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    drop(next);
}

/// Readers that arrive while a fair writer is queued (behind a reader) do not overtake it, fair or not, and the writer's fencing token is above the
/// first reader's and below the later readers'.
#[tokio::test]
async fn later_readers_never_overtake_a_queued_writer_and_tokens_follow_grants() {
    let _load = distlock_tests::timed().await;
    let server = RedisServer::start();
    let locks = server.manager();
    let conn = server.client().await;
    let first = locks
        .read_lock("rv-order")
        .ttl(LONG)
        .acquire()
        .await
        .unwrap();
    let writer = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock("rv-order").ttl(LONG).wait(LONG).acquire().await })
    };
    distlock_tests::until_queued(&conn, "rv-order", 1).await;
    for fair in [true, false] {
        let late = locks
            .read_lock("rv-order")
            .fair(fair)
            .wait(Duration::ZERO)
            .acquire()
            .await;
        assert!(
            matches!(late, Err(LockError::NotAcquired { .. })),
            "fair {fair}: {late:?}"
        );
    }
    let started = Instant::now();
    let late = spawn_reader(&locks, "rv-order", true, LONG, started);
    distlock_tests::until_queued(&conn, "rv-order", 2).await;
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let writer = writer.await.unwrap().expect("the writer is handed the key");
    assert!(writer.fencing_token() > first_token);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !late.is_finished(),
        "a later reader entered beside the writer"
    );
    let writer_token = writer.fencing_token();
    writer.release().await.unwrap();
    let (late, _) = late.await.unwrap();
    assert!(late.unwrap().fencing_token() > writer_token);
}

/// A shared lease that is lost is logged under the key it lived in (`distlock:holders:{KEY}`,
/// with its mode), not the lock key a shared lease never has.
#[tokio::test]
async fn a_lost_shared_lease_is_logged_under_the_key_it_lived_in() {
    let server = RedisServer::start();
    let locks = server.manager();
    let (logs, _capture) = distlock_tests::Logs::capture();
    let lease = locks
        .read_lock("rv-log")
        .ttl(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    assert!(locks.force_release("rv-log").await.unwrap());
    tokio::time::timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("the reader learns of the loss at its next renewal");
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("distlock lease lost"))
        .unwrap_or_else(|| panic!("no loss logged: {text}"));
    assert!(
        line.contains("distlock:holders:{rv-log}") || line.contains("shared"),
        "{line}"
    );
}

/// `LockInfo::fencing_token` of a key held shared is the last token drawn, as its docs say: no
/// holder's is greater, and it may be that of a reader that has left.
#[tokio::test]
async fn inspect_reports_the_last_token_drawn_which_no_holder_exceeds() {
    let server = RedisServer::start();
    let locks = server.manager();
    let first = locks
        .read_lock("rv-info")
        .ttl(LONG)
        .acquire()
        .await
        .unwrap();
    let second = locks
        .read_lock("rv-info")
        .ttl(LONG)
        .acquire()
        .await
        .unwrap();
    let gone = second.fencing_token();
    second.release().await.unwrap();
    let info = locks.inspect("rv-info").await.unwrap().expect("held");
    assert_eq!(info.holders, 1);
    assert_eq!(info.fencing_token, gone);
    assert!(info.fencing_token > first.fencing_token());
}
