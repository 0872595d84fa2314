//! Exclusion checked by overlap, not by lost updates: every body marks the keys it is inside
//! (`Occupancy`), and two bodies inside one key at once is a failure, whatever they wrote.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_runtime::{current_lease, LockManager};
use distlock_tests::{Occupancy, RedisServer};

/// Fencing tokens seen per key, in the order bodies entered.
type Tokens = Arc<Mutex<HashMap<String, Vec<u64>>>>;

/// A short random pause inside a body, so bodies interleave in many ways.
async fn jiggle() {
    let micros = fastrand::u64(0..300);
    if micros < 100 {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(Duration::from_micros(micros)).await;
    }
}

/// Runs `rounds` bodies under `keys` (fair or not) on `locks`, each marking its keys inside
/// `occupancy` and, if `tokens` is given, recording its fencing token per key in entry order.
async fn worker(
    locks: LockManager,
    keys: Vec<&'static str>,
    fair: bool,
    rounds: usize,
    occupancy: Arc<Occupancy>,
    tokens: Option<Tokens>,
) {
    for _ in 0..rounds {
        let occupancy = Arc::clone(&occupancy);
        let tokens = tokens.clone();
        let keys_inside = keys.clone();
        locks
            .lock_all(keys.clone())
            .fair(fair)
            .wait(Duration::from_secs(30))
            .run(async move {
                let _inside = occupancy.enter(&keys_inside);
                if let Some(tokens) = tokens {
                    let token = current_lease().expect("inside a run").fencing_token();
                    let mut tokens = tokens.lock().unwrap();
                    for key in &keys_inside {
                        tokens.entry((*key).to_owned()).or_default().push(token);
                    }
                }
                jiggle().await;
            })
            .await
            .expect("acquired within the wait");
    }
}

/// Runs 8 workers, alternating between the two `managers` (two processes' worth of connections),
/// taking the plans (keys, fair) in turn, `rounds` bodies each; waits for all of them.
async fn run_workers(
    managers: &[LockManager; 2],
    plans: &[(Vec<&'static str>, bool)],
    rounds: usize,
    occupancy: &Arc<Occupancy>,
    tokens: Option<&Tokens>,
) {
    let mut tasks = Vec::new();
    for (i, (keys, fair)) in plans.iter().cycle().take(8).enumerate() {
        tasks.push(tokio::spawn(worker(
            managers[i % 2].clone(),
            keys.clone(),
            *fair,
            rounds,
            Arc::clone(occupancy),
            tokens.cloned(),
        )));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_key_sets_are_never_inside_at_once() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    // Two managers: two processes' worth of connections and notifications.
    let managers = [server.manager(), server.manager()];
    let occupancy = Arc::new(Occupancy::default());
    let sets = [
        (vec!["a", "b"], false),
        (vec!["b", "c"], false),
        (vec!["c"], false),
        (vec!["a", "c"], false),
    ];
    run_workers(&managers, &sets, 60, &occupancy, None).await;
    assert_eq!(occupancy.entries(), 8 * 60);
    assert_eq!(occupancy.overlaps(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_unfair_requests_on_one_key_are_never_inside_at_once() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let managers = [server.manager(), server.manager()];
    let occupancy = Arc::new(Occupancy::default());
    // Per manager: two fair workers and two unfair ones.
    let plans = [
        (vec!["mixed"], true),
        (vec!["mixed"], true),
        (vec!["mixed"], true),
        (vec!["mixed"], true),
        (vec!["mixed"], false),
        (vec!["mixed"], false),
        (vec!["mixed"], false),
        (vec!["mixed"], false),
    ];
    run_workers(&managers, &plans, 60, &occupancy, None).await;
    assert_eq!(occupancy.entries(), 8 * 60);
    assert_eq!(occupancy.overlaps(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_in_entry_order_across_hand_offs_and_multi_key_leases() {
    let _load = distlock_tests::heavy().await;
    let server = RedisServer::start();
    let managers = [server.manager(), server.manager()];
    let occupancy = Arc::new(Occupancy::default());
    let tokens = Arc::new(Mutex::new(HashMap::new()));
    // Fair single-key leases on `x` (mostly handed over), unfair ones on `y`, and multi-key
    // leases on both.
    let plans: [(Vec<&'static str>, bool); 4] = [
        (vec!["x"], true),
        (vec!["x"], true),
        (vec!["x", "y"], false),
        (vec!["y"], false),
    ];
    run_workers(&managers, &plans, 50, &occupancy, Some(&tokens)).await;
    assert_eq!(occupancy.overlaps(), 0);
    let handed = managers.iter().map(|m| m.stats().handed_over).sum::<u64>();
    assert!(handed > 0, "some fair leases were handed over");
    let tokens = tokens.lock().unwrap();
    for (key, seen) in tokens.iter() {
        assert!(seen.len() >= 100, "{key}: {} leases", seen.len());
        for pair in seen.windows(2) {
            assert!(
                pair[0] < pair[1],
                "{key}: token {} then {}",
                pair[0],
                pair[1]
            );
        }
    }
}
