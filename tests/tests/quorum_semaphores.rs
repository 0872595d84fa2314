//! Semaphores on a quorum: each permit is a slot that a majority grants, so at most N leases are
//! valid at once, whatever the nodes hold of grants that reached no majority; across processes,
//! with nodes down and a node restarted empty (after a ttl down, as the docs require).

use std::time::{Duration, Instant};

use distlock_runtime::{LockError, LockManager, LockMode};
use distlock_tests::stays::{judge, Stay};
use distlock_tests::RedisServer;
use tokio::io::AsyncReadExt;

const TIMEOUT: Duration = Duration::from_millis(500);

fn quorum(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

fn manager(servers: &[RedisServer]) -> LockManager {
    LockManager::builder()
        .quorum(servers.iter().map(RedisServer::url))
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .pool_wait_timeout(TIMEOUT)
        .build()
        .unwrap()
}

/// The members of `key`'s holders on `server`, sorted.
fn members(server: &RedisServer, key: &str) -> Vec<String> {
    let reply = server.command(&["ZRANGE", &format!("distlock:holders:{{{key}}}"), "0", "-1"]);
    let mut members: Vec<String> = reply
        .lines()
        .filter(|line| !line.starts_with('*') && !line.starts_with('$'))
        .map(str::to_owned)
        .collect();
    members.sort();
    members
}

/// Puts `member` among `key`'s holders on `server`, for 30 s.
fn hold_by_hand(server: &RedisServer, key: &str, member: &str) {
    let holders = format!("distlock:holders:{{{key}}}");
    let time = server.command(&["TIME"]);
    let secs: u64 = time.lines().nth(2).unwrap().parse().unwrap();
    let at = (secs * 1000 + 30_000).to_string();
    server.command(&["ZADD", &holders, &at, member]);
    server.command(&["PEXPIRE", &holders, "30000"]);
}

/// The case: with two permits on three nodes, one lease on nodes 1 and 2 and one on 2
/// and 3 leave each node room for one more by count, yet a third lease there would make three.
/// In slots, the two leases hold slot 0 on nodes 1 and 2 and slot 1 on 2 and 3: no slot is free
/// on a majority, so a third is refused, and what it took on a node is undone.
#[tokio::test]
async fn holders_granted_by_different_majorities_never_outnumber_the_permits() {
    let servers = quorum(3);
    let a = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let b = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    for i in [0, 1] {
        hold_by_hand(&servers[i], "pair", &format!("2/0 {a}"));
    }
    for i in [1, 2] {
        hold_by_hand(&servers[i], "pair", &format!("2/1 {b}"));
    }
    let locks = manager(&servers);
    for _ in 0..5 {
        let third = locks
            .lock("pair")
            .permits(2)
            .wait(Duration::ZERO)
            .acquire()
            .await;
        assert!(
            matches!(third, Err(LockError::NotAcquired { .. })),
            "{third:?}"
        );
    }
    assert_eq!(members(&servers[0], "pair"), [format!("2/0 {a}")]);
    assert_eq!(members(&servers[2], "pair"), [format!("2/1 {b}")]);
    // The view lists the holders a majority lists: both.
    let info = locks.inspect("pair").await.unwrap().unwrap();
    assert_eq!((info.mode, info.holders), (LockMode::Permits(2), 2));
    // A slot its holder left on a majority is free again.
    servers[1].command(&["ZREM", "distlock:holders:{pair}", &format!("2/1 {b}")]);
    let third = locks.lock("pair").permits(2).wait(Duration::ZERO).acquire();
    let third = third.await.expect("slot 1 is free on nodes 1 and 2");
    assert_eq!(
        servers[0].command(&["ZCARD", "distlock:holders:{pair}"]),
        ":2\r\n"
    );
    third.release().await.unwrap();
}

/// Grants that reached no majority (left on a minority by a crashed client) hold nothing: two of
/// five nodes hold slot 0 for one token and two others slot 1 for another, and still exactly two
/// leases are admitted, the third refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_left_on_a_minority_admit_neither_fewer_nor_more_than_the_permits() {
    let _load = distlock_tests::heavy().await;
    let servers = quorum(5);
    for i in [0, 1] {
        hold_by_hand(&servers[i], "left", "2/0 cccccccccccccccccccccccccccccccc");
    }
    for i in [2, 3] {
        hold_by_hand(&servers[i], "left", "2/1 dddddddddddddddddddddddddddddddd");
    }
    let locks = manager(&servers);
    let ask = || locks.lock("left").permits(2).wait(Duration::ZERO).acquire();
    let first = ask().await.expect("a slot is free on a majority");
    let second = ask().await.expect("the other slot too");
    let third = ask().await;
    assert!(
        matches!(third, Err(LockError::NotAcquired { .. })),
        "{third:?}"
    );
    assert!(second.fencing_token() > first.fencing_token());
    let info = locks.inspect("left").await.unwrap().unwrap();
    assert_eq!(info.holders, 2, "{info:?}");
    first.release().await.unwrap();
    second.release().await.unwrap();
}

/// A node that does not answer in time may still grant the slot later, under the lease's token:
/// it grants the same slot the majority did, the lease is counted once, and its release clears
/// that node too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_node_grants_the_slot_the_majority_granted_and_the_release_clears_it() {
    let _load = distlock_tests::heavy().await;
    let mut servers = quorum(3);
    let locks = manager(&servers);
    // Connected to every node first: the paused node's requests are sent, and run late.
    locks
        .lock("warm")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    servers[2].pause();
    let first = locks.lock("late").permits(2).acquire().await.unwrap();
    // The other slot is free on a majority: taken without waiting for a release, also when
    // this request's token asks the held slot first (the paused node leaves that round in
    // doubt, and the request goes on to the next slot under a new token).
    let asked = Instant::now();
    let second = locks.lock("late").permits(2).acquire().await.unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    servers[2].resume();
    // Whatever of the acquires the late node ran on resuming, it granted each lease the slot
    // a majority granted it.
    let on_time = members(&servers[0], "late");
    assert_eq!(on_time.len(), 2);
    assert_eq!(members(&servers[1], "late"), on_time);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late = members(&servers[2], "late");
    eprintln!("the late node holds {late:?}");
    assert!(
        late.iter().all(|m| on_time.contains(m)),
        "{late:?} / {on_time:?}"
    );
    let third = locks.lock("late").permits(2).wait(Duration::ZERO).acquire();
    assert!(matches!(third.await, Err(LockError::NotAcquired { .. })));
    first.release().await.unwrap();
    second.release().await.unwrap();
    let cleared = distlock_tests::eventually(Duration::from_secs(2), || {
        let left = servers.iter().any(|s| !members(s, "late").is_empty());
        async move { !left }
    });
    assert!(
        cleared.await.is_some(),
        "{:?}",
        members(&servers[2], "late")
    );
}

/// A waiter asks slot after slot, and still gives up at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_for_a_full_quorum_semaphore_gives_up_at_its_deadline() {
    let _load = distlock_tests::timed().await;
    let servers = quorum(3);
    let locks = manager(&servers);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(locks.lock("full").permits(3).acquire().await.unwrap());
    }
    let wait = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    let waited = locks.lock("full").permits(3).wait(wait).acquire().await;
    let took = started.elapsed();
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    assert!(took >= wait && took < wait + TIMEOUT, "{took:?}");
    // Woken by a release, within its wait.
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let lease = locks.lock("full").permits(3).wait(Duration::from_secs(5));
            lease.acquire().await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = held
        .iter()
        .map(distlock_runtime::Lease::fencing_token)
        .max();
    held.pop().unwrap().release().await.unwrap();
    let woken = waiter.await.unwrap().unwrap();
    assert!(Some(woken.fencing_token()) > last);
    held.push(woken);
    for lease in held {
        lease.release().await.unwrap();
    }
}

/// The acceptance test: five nodes, two down; 3N contenders in three processes take N permits
/// for 30 ms stays, recorded in an independent Redis; mid-run a node of the three is killed
/// while one of the two down comes back empty (it was down longer than a ttl), and the killed
/// one comes back empty after a ttl down, as the docs require. At no point are more than N leases
/// valid at once inside, N are inside together, tokens are never shared and always above every
/// lease that had left before the acquire, and no failed wait outlives its deadline by much.
async fn at_most_n_of_3n_contenders_through_a_restart(n: u32) {
    let _load = distlock_tests::heavy().await;
    let mut servers = quorum(5);
    servers[3].kill();
    servers[4].kill();
    let ledger = RedisServer::start();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let topology = format!("quorum={}", urls.join(","));
    let key = format!("pool-{n}");
    let (n_text, ledger_url) = (n.to_string(), ledger.url());
    let args = [&*topology, &key, &n_text, &n_text, "6500", &ledger_url];
    let mut workers: Vec<tokio::process::Child> = (0..3)
        .map(|_| {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_permit_worker"))
                .args(args)
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // A node of the majority dies, and one down since the start (longer than a ttl) comes back
    // empty in its place: grants go on, on another majority.
    servers[2].kill();
    servers[3].restart();
    // Down for the ttl (1 s) and more, as the docs require of a node that comes back empty.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let restarted_at: u64 = ledger
        .command(&["GET", "seq"])
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    servers[2].restart();
    let mut overrun = 0;
    for worker in &mut workers {
        let status = tokio::time::timeout(Duration::from_secs(20), worker.wait())
            .await
            .expect("the worker ended in time")
            .unwrap();
        let mut out = String::new();
        worker
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .await
            .unwrap();
        assert!(status.success(), "{status}: {out}");
        eprintln!("{out}");
        let over = out
            .split_whitespace()
            .last()
            .unwrap()
            .parse::<u64>()
            .unwrap();
        overrun = overrun.max(over);
    }
    let mut conn = ledger.client().await;
    let lines: Vec<String> = redis::cmd("LRANGE")
        .arg("stays")
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let stays: Vec<Stay> = lines.iter().filter_map(|l| Stay::parse(l)).collect();
    assert_eq!(stays.len(), lines.len());
    let judged = judge(&stays);
    eprintln!("{} stays: {judged:?}, overrun {overrun} ms", stays.len());
    let limit = usize::try_from(n).unwrap();
    assert!(
        judged.most_inside <= limit,
        "more than {n} inside: {judged:?}"
    );
    assert_eq!(judged.most_inside, limit, "{n} were never inside together");
    assert!(judged.shared_tokens.is_empty(), "{judged:?}");
    assert!(judged.below_floor.is_empty(), "{judged:?}");
    assert!(
        stays.iter().any(|s| s.valid && s.enter > restarted_at),
        "no stay after the restart"
    );
    // Leases valid throughout nearly every stay (a few around the outage may not be).
    assert!(judged.invalid * 10 < stays.len(), "{judged:?}");
    assert!(
        overrun < 500,
        "a failed wait outlived its deadline by {overrun} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_on_a_quorum_admit_two_of_six_contenders_through_a_restart() {
    at_most_n_of_3n_contenders_through_a_restart(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_permits_on_a_quorum_admit_three_of_nine_contenders_through_a_restart() {
    at_most_n_of_3n_contenders_through_a_restart(3).await;
}
