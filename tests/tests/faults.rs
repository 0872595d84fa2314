//! The fault matrix: each case runs load from several processes (`load_worker`, two managers
//! each) against a deployment, applies a fault, makes the deployment whole again, and judges
//! every manager on its own: it must serve again within 5 s of the deployment being whole, its
//! `ping()` must answer within its timeout throughout, and the guarded resource (a ledger Redis
//! of its own, fenced by the leases' tokens) must see no broken exclusion.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock_tests::topology::RedisCluster;
use distlock_tests::RedisServer;

/// How soon after the deployment is whole every manager must serve again.
const RECOVERY: Duration = Duration::from_secs(5);

/// A ping must end within this (its own response timeout is 1 s; a connect 0.5 s).
const PING_BOUND: Duration = Duration::from_millis(2500);

/// One line a manager printed every 200 ms.
#[derive(Debug, Clone)]
struct Tick {
    at_ms: u128,
    ok: u64,
    ping: Option<u64>,
    first_error: String,
}

/// A `load_worker` process and what each of its managers printed.
struct Load {
    child: Child,
    ticks: Arc<Mutex<Vec<Vec<Tick>>>>,
    done: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn spawn(
        topology: &str,
        ledger: &RedisServer,
        managers: usize,
        tasks: usize,
        secs: u64,
    ) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_load_worker"))
            .args([
                topology,
                &ledger.url(),
                &managers.to_string(),
                &tasks.to_string(),
                "64",
                &secs.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start load_worker");
        let stdout = child.stdout.take().expect("stdout");
        let ticks = Arc::new(Mutex::new(vec![Vec::new(); managers]));
        let done = Arc::new(Mutex::new(Vec::new()));
        let (t, d) = (Arc::clone(&ticks), Arc::clone(&done));
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let fields: Vec<&str> = line.splitn(17, ' ').collect();
                match fields.as_slice() {
                    ["tick", m, at, "ok", ok, _, _, _, _, _, _, _, _, "ping", ping, "first", rest @ ..] =>
                    {
                        let tick = Tick {
                            at_ms: at.parse().unwrap_or(0),
                            ok: ok.parse().unwrap_or(0),
                            ping: ping.parse().ok(),
                            first_error: rest.join(" "),
                        };
                        let m: usize = m.parse().unwrap_or(0);
                        t.lock().unwrap()[m].push(tick);
                    }
                    ["done", ..] => d.lock().unwrap().push(line.clone()),
                    _ => eprintln!("load_worker: {line}"),
                }
            }
        });
        Self {
            child,
            ticks,
            done,
            reader: Some(reader),
        }
    }

    /// Waits until every manager has served in a tick.
    fn wait_until_serving(&self, within: Duration) {
        let deadline = std::time::Instant::now() + within;
        loop {
            let ticks = self.ticks.lock().unwrap();
            if ticks.iter().all(|t| t.iter().any(|tick| tick.ok > 0)) {
                return;
            }
            drop(ticks);
            assert!(
                std::time::Instant::now() < deadline,
                "the load never got going"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn finish(mut self) -> (Vec<Vec<Tick>>, Vec<String>) {
        let status = self.child.wait().expect("load_worker");
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        assert!(status.success(), "load_worker failed: {status}");
        let ticks = self.ticks.lock().unwrap().clone();
        let done = self.done.lock().unwrap().clone();
        (ticks, done)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Judges each manager of each process: from `whole_ms` on, it must serve (a tick with a
/// successful lock cycle) within [`RECOVERY`] and in every tick after that but the
/// last; every ping must end within [`PING_BOUND`]. Prints each manager's time to recover.
fn judge(case: &str, loads: Vec<Load>, whole_ms: u128) -> Vec<Duration> {
    let mut recoveries = Vec::new();
    let mut failures = Vec::new();
    for (p, load) in loads.into_iter().enumerate() {
        let (ticks, done) = load.finish();
        for line in &done {
            // `done M stale N duplicate N`: a duplicate token is two leases sharing one.
            let duplicate: u64 = line
                .rsplit(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(u64::MAX);
            if duplicate != 0 {
                failures.push(format!("{case}: process {p}: {line}"));
            }
        }
        for (m, ticks) in ticks.iter().enumerate() {
            let after: Vec<&Tick> = ticks.iter().filter(|t| t.at_ms >= whole_ms).collect();
            // The last tick that served nothing (the last one may be cut short by the end).
            let last_dead = after[..after.len().saturating_sub(1)]
                .iter()
                .rposition(|t| t.ok == 0);
            let recovered_at = match last_dead {
                None => whole_ms,
                Some(i) => after[i].at_ms,
            };
            let recovery = Duration::from_millis((recovered_at - whole_ms) as u64);
            println!("{case}: process {p} manager {m}: serving again {recovery:?} after the deployment was whole");
            if recovery > RECOVERY {
                let errors: Vec<&str> = after
                    .iter()
                    .filter(|t| !t.first_error.is_empty())
                    .map(|t| t.first_error.as_str())
                    .take(3)
                    .collect();
                failures.push(format!(
                    "{case}: process {p} manager {m} served nothing {recovery:?} after the deployment was whole (errors: {errors:?})"
                ));
            }
            // A ping still out shows as `-`; one that stays out over several ticks hangs.
            let mut out_since = None;
            for tick in ticks {
                match (tick.ping, out_since) {
                    (None, None) => out_since = Some(tick.at_ms),
                    (None, Some(since)) if tick.at_ms - since > PING_BOUND.as_millis() => {
                        failures.push(format!(
                            "{case}: process {p} manager {m}: ping out for over {PING_BOUND:?} at {}",
                            tick.at_ms
                        ));
                        break;
                    }
                    (Some(ms), _) => {
                        out_since = None;
                        if u128::from(ms) > PING_BOUND.as_millis() {
                            failures.push(format!(
                                "{case}: process {p} manager {m}: a ping took {ms} ms"
                            ));
                            break;
                        }
                    }
                    _ => {}
                }
            }
            recoveries.push(recovery);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    recoveries
}

/// The ledger's counts must add up: every write it accepted was one increment of the key's
/// counter by a holder that read it under the same token.
fn check_ledger(ledger: &RedisServer) {
    let keys = ledger.command(&["KEYS", "ledger:load:*"]);
    let mut checked = 0;
    for key in keys
        .lines()
        .filter(|l| l.starts_with("ledger:") && !l.ends_with(":tokens"))
    {
        let count = ledger.command(&["HGET", key, "count"]);
        let writes = ledger.command(&["HGET", key, "writes"]);
        assert_eq!(
            count.lines().last(),
            writes.lines().last(),
            "{key}: counter and accepted writes differ: a lost update"
        );
        checked += 1;
    }
    assert!(checked > 0, "the ledger saw no writes");
}

fn cluster_topology(cluster: &RedisCluster) -> String {
    format!("cluster={}", cluster.seed_urls().join(","))
}

/// The wedge: a primary killed (its replica takes over) and restarted on its port,
/// under load from two processes. On main before this fix, one process in most runs stayed
/// wedged for good: every acquire timed out, `ping()` too.
#[test]
fn cluster_primary_killed_and_restarted_every_manager_recovers() {
    let mut cluster = RedisCluster::start(3, 1);
    let ledger = RedisServer::start();
    let topology = cluster_topology(&cluster);
    let loads: Vec<Load> = (0..2)
        .map(|_| Load::spawn(&topology, &ledger, 2, 16, 16))
        .collect();
    for load in &loads {
        load.wait_until_serving(Duration::from_secs(10));
    }
    std::thread::sleep(Duration::from_secs(2));
    let slot = cluster.slot_of("distlock:lock:{load:1}");
    let killed = cluster.primary_of_slot(slot);
    cluster.node_mut(killed).kill();
    cluster.wait_for_failover(slot, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    cluster.node_mut(killed).restart();
    cluster.wait_until_settled(Duration::from_secs(10));
    let whole = unix_ms();
    let recoveries = judge("cluster primary killed and restarted", loads, whole);
    println!("recoveries: {recoveries:?}");
    check_ledger(&ledger);
}
