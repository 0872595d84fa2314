//! The fault matrix: each case runs load from two processes (`load_worker`, two managers each,
//! four tasks per manager, random keys among 64) against a deployment, applies a fault, makes
//! the deployment whole again, and judges every manager on its own: it must serve again within
//! 5 s of the deployment being whole, its `ping()` must end within its timeout throughout, and
//! the guarded resource (a ledger on a Redis of its own, fenced by the leases' tokens) must see
//! no broken exclusion: no token shared by two leases, no lost update. Each case prints every
//! manager's time to recover (`docs/reliability.md` quotes them).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock_tests::topology::{QuorumSet, RedisCluster, SentinelGroup};
use distlock_tests::RedisServer;

/// How soon after the deployment is whole every manager must serve again.
const RECOVERY: Duration = Duration::from_secs(5);

/// A ping must end within this: its own timeouts (0.5 s to connect, 1 s to answer; on a
/// cluster it may wait up to 1 s for the slot map first, on Sentinel ask for the primary) add
/// up to 2.5 s, and a loaded machine's scheduling adds to that (a ping of a cluster whose
/// primary hung was seen out for 2.6 s under two parallel builds); a hung ping stays out.
const PING_BOUND: Duration = Duration::from_millis(3000);

/// How hard each manager of a load process works.
#[derive(Clone, Copy)]
struct Intensity {
    tasks: usize,
    /// The pause between a task's lock cycles.
    think_ms: u64,
}

/// Enough to see every manager serve, light enough for several cases at once on 2 cores.
const LIGHT: Intensity = Intensity {
    tasks: 4,
    think_ms: 5,
};

/// As hard as the report: 16 tasks per manager, no pause, many requests in flight when
/// a node dies.
const HARD: Intensity = Intensity {
    tasks: 16,
    think_ms: 0,
};

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
    stdin: Option<ChildStdin>,
    ticks: Arc<Mutex<Vec<Vec<Tick>>>>,
    done: Arc<Mutex<Vec<String>>>,
    /// What it logged (distlock's warnings), shown when a case fails.
    logs: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn spawn(topology: &str, ledger: &RedisServer, managers: usize, load: Intensity) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_load_worker"))
            .args([
                topology,
                &ledger.url(),
                &managers.to_string(),
                &load.tasks.to_string(),
                "64",
                "120",
                &format!("think={}", load.think_ms),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start load_worker");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        let stdin = child.stdin.take();
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
            stdin,
            ticks,
            done,
            logs,
            reader: Some(reader),
        }
    }

    /// Whether every manager served in each of its last `n` ticks after `since_ms`.
    fn serving(&self, since_ms: u128, n: usize) -> bool {
        let ticks = self.ticks.lock().unwrap();
        ticks.iter().all(|ticks| {
            let after: Vec<&Tick> = ticks.iter().filter(|t| t.at_ms >= since_ms).collect();
            after.len() >= n && after[after.len() - n..].iter().all(|t| t.ok > 0)
        })
    }

    /// Stops the process (closes its stdin) and returns what each manager printed, its closing
    /// lines and its logs.
    fn finish(mut self) -> (Vec<Vec<Tick>>, Vec<String>, Vec<String>) {
        drop(self.stdin.take());
        let status = self.child.wait().expect("load_worker");
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        assert!(status.success(), "load_worker failed: {status}");
        let ticks = self.ticks.lock().unwrap().clone();
        let done = self.done.lock().unwrap().clone();
        let logs = self.logs.lock().unwrap().clone();
        (ticks, done, logs)
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

/// Two load processes (two managers each) against `topology`, and their ledger.
struct Fleet {
    ledger: RedisServer,
    loads: Vec<Load>,
}

impl Fleet {
    /// Starts the load and waits until every manager serves steadily.
    fn start(topology: &str) -> Self {
        Self::start_with(topology, LIGHT)
    }

    /// [`Fleet::start`] with another load.
    fn start_with(topology: &str, load: Intensity) -> Self {
        let ledger = RedisServer::start();
        let loads: Vec<Load> = (0..2)
            .map(|_| Load::spawn(topology, &ledger, 2, load))
            .collect();
        let started = unix_ms();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !loads.iter().all(|load| load.serving(started, 3)) {
            assert!(Instant::now() < deadline, "the load never got going");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { ledger, loads }
    }

    /// The fault was undone (a server restarted or resumed, a failover started) at `undone_ms`
    /// and the deployment is whole again since `whole_ms`: waits until every manager serves
    /// steadily (or [`RECOVERY`] and a bit have passed), stops the load, and judges each
    /// manager (see [`judge`]) and the ledger.
    fn judge_after(self, case: &str, undone_ms: u128, whole_ms: u128) {
        let deadline = Instant::now() + RECOVERY + Duration::from_millis(1500);
        while Instant::now() < deadline && !self.loads.iter().all(|l| l.serving(whole_ms, 4)) {
            std::thread::sleep(Duration::from_millis(100));
        }
        judge(case, self.loads, undone_ms, whole_ms);
        check_ledger(case, &self.ledger);
    }
}

/// Judges each manager of each process: it must serve steadily (a successful lock cycle in
/// every 200 ms tick) from at most [`RECOVERY`] after `whole_ms` on; every ping must end within
/// [`PING_BOUND`]; no process may have seen a fencing token twice. Prints, per manager, its
/// longest stretch without a lock (the outage it saw) and when it served again, counted from
/// `undone_ms`.
fn judge(case: &str, loads: Vec<Load>, undone_ms: u128, whole_ms: u128) {
    let mut slowest = 0;
    let mut failures = Vec::new();
    for (p, load) in loads.into_iter().enumerate() {
        let (ticks, done, logs) = load.finish();
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
            // The last tick may be cut short by the stop.
            let ticks = &ticks[..ticks.len().saturating_sub(1)];
            // The start of the steady run of serving ticks that lasts to the end.
            let last_dead = ticks.iter().rposition(|t| t.ok == 0);
            let serving_ms = match last_dead {
                None => ticks.first().map_or(0, |t| t.at_ms.saturating_sub(200)),
                Some(i) if i + 1 < ticks.len() => ticks[i].at_ms,
                // Nothing served at the end.
                Some(_) => u128::MAX,
            };
            let longest = ticks
                .split(|t| t.ok > 0)
                .map(|dead| dead.len() as u64 * 200)
                .max()
                .unwrap_or(0);
            if serving_ms > whole_ms + RECOVERY.as_millis() {
                let errors: Vec<&str> = ticks
                    .iter()
                    .filter(|t| t.at_ms >= whole_ms && !t.first_error.is_empty())
                    .map(|t| t.first_error.as_str())
                    .take(3)
                    .collect();
                let seen: Vec<String> = ticks
                    .iter()
                    .filter(|t| t.at_ms + 1000 >= whole_ms)
                    .map(|t| format!("{:+}ms ok {}", t.at_ms as i128 - whole_ms as i128, t.ok))
                    .collect();
                let logged = &logs[logs.len().saturating_sub(20)..];
                failures.push(format!(
                    "{case}: process {p} manager {m} did not serve steadily within {RECOVERY:?} of the deployment being whole (errors: {errors:?})\nticks: {seen:?}\nits process logged last:\n{}",
                    logged.join("\n")
                ));
                continue;
            }
            let back = serving_ms.saturating_sub(undone_ms);
            slowest = slowest.max(back);
            println!(
                "{case}: process {p} manager {m}: longest outage {longest} ms, serving again {back} ms after the fault was undone ({} ms after the deployment was whole)",
                serving_ms.saturating_sub(whole_ms)
            );
            // A ping still out shows as `-`; one out for longer than the bound hangs.
            let mut out_since = None;
            for tick in ticks {
                match (tick.ping, out_since) {
                    (None, None) => out_since = Some(tick.at_ms),
                    (None, Some(since)) if tick.at_ms - since > PING_BOUND.as_millis() => {
                        failures.push(format!(
                            "{case}: process {p} manager {m}: a ping was out for over {PING_BOUND:?}"
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
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!(
        "{case}: every manager serves again within {slowest} ms of the fault being undone \
         ({} ms to the deployment being whole)",
        whole_ms.saturating_sub(undone_ms)
    );
}

/// Every write the ledger accepted was one increment of the key's counter by a holder that
/// read it under the same token: counter and accepted writes agree (no lost update).
fn check_ledger(case: &str, ledger: &RedisServer) {
    let script = "local n, bad = 0, {} \
        for _, key in ipairs(redis.call('KEYS', 'ledger:load:*')) do \
          if redis.call('TYPE', key).ok == 'hash' then \
            n = n + 1 \
            local count = redis.call('HGET', key, 'count') or '0' \
            local writes = redis.call('HGET', key, 'writes') or '0' \
            if count ~= writes then bad[#bad + 1] = key .. ' ' .. count .. ' ' .. writes end \
          end \
        end \
        return {n, bad}";
    let answer = ledger.command(&["EVAL", script, "0"]);
    // `*2\r\n:N\r\n*0\r\n`: N keys checked, none bad.
    let mut lines = answer.lines();
    assert_eq!(lines.next(), Some("*2"), "{answer}");
    let checked: u64 = lines
        .next()
        .and_then(|n| n.strip_prefix(':'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(checked > 0, "{case}: the ledger saw no writes");
    assert_eq!(lines.next(), Some("*0"), "{case}: lost updates: {answer}");
}

fn cluster_topology(cluster: &RedisCluster) -> String {
    format!("cluster={}", cluster.seed_urls().join(","))
}

/// One server killed, and restarted on its port empty (its locks and counters gone).
#[test]
fn one_server_killed_and_restarted_without_its_data() {
    let mut server = RedisServer::start();
    let fleet = Fleet::start(&format!("url={}", server.url()));
    server.kill();
    std::thread::sleep(Duration::from_secs(2));
    server.restart();
    let undone = unix_ms();
    fleet.judge_after("one server restarted empty", undone, undone);
}

/// One server killed, and restarted on its port with the data it saved just before.
#[test]
fn one_server_killed_and_restarted_with_its_data() {
    let mut server = RedisServer::start();
    let fleet = Fleet::start(&format!("url={}", server.url()));
    assert!(server.command(&["SAVE"]).starts_with("+OK"));
    server.kill();
    // Shorter than the locks' 2 s ttl: some of those saved are still held when it is back.
    std::thread::sleep(Duration::from_millis(300));
    server.restart();
    let undone = unix_ms();
    assert_ne!(
        server.command(&["DBSIZE"]).trim(),
        ":0",
        "restarted with its data"
    );
    fleet.judge_after("one server restarted with its data", undone, undone);
}

/// One server paused (SIGSTOP) for longer than every timeout, then resumed.
#[test]
fn one_server_paused_past_every_timeout_then_resumed() {
    let mut server = RedisServer::start();
    let fleet = Fleet::start(&format!("url={}", server.url()));
    server.pause();
    std::thread::sleep(Duration::from_secs(3));
    server.resume();
    let undone = unix_ms();
    fleet.judge_after("one server paused 3 s", undone, undone);
}

fn sentinel_topology(group: &SentinelGroup) -> String {
    format!(
        "sentinel={}@{}",
        group.master_name(),
        group.sentinel_urls().join(",")
    )
}

/// Sentinel: the primary killed and failed over; back on its port, it rejoins as a replica.
#[test]
fn sentinel_primary_killed_failed_over_and_back_as_a_replica() {
    let mut group = SentinelGroup::start(1, 3);
    let fleet = Fleet::start(&sentinel_topology(&group));
    let old_port = group.primary_port();
    let old = group.kill_primary();
    group.wait_for_new_primary(old_port, Duration::from_secs(15));
    let undone = unix_ms();
    group.server_mut(old).restart();
    group.wait_until_replicas_follow(Duration::from_secs(30));
    fleet.judge_after(
        "sentinel primary killed, back as a replica",
        undone,
        unix_ms(),
    );
}

/// Sentinel: every sentinel restarted; then a failover, which the managers must still follow
/// (their watchers found the restarted sentinels again).
#[test]
fn sentinel_sentinels_restarted_then_a_failover_is_followed() {
    let mut group = SentinelGroup::start(1, 3);
    let fleet = Fleet::start(&sentinel_topology(&group));
    group.restart_sentinels();
    // Long enough for a watcher to notice its sentinel is gone (it pings after 5 s of silence).
    std::thread::sleep(Duration::from_secs(2));
    let old_port = group.failover();
    let undone = unix_ms();
    group.wait_for_new_primary(old_port, Duration::from_secs(15));
    group.wait_until_replicas_follow(Duration::from_secs(30));
    fleet.judge_after("sentinels restarted, then a failover", undone, unix_ms());
}

/// The wedge: a primary killed (its replica takes over) and restarted on its port 4 s
/// later, under load from two processes of 32 tasks. Before the cluster router was distlock's
/// own, a manager stayed wedged for good in half the runs and more: every acquire timed out,
/// `ping()` too (redis-rs's cluster client, see `topology/cluster.rs`).
#[test]
fn cluster_primary_killed_and_restarted_every_manager_recovers() {
    let mut cluster = RedisCluster::start(3, 1);
    let fleet = Fleet::start_with(&cluster_topology(&cluster), HARD);
    let slot = cluster.slot_of("distlock:lock:{load:1}");
    let killed = cluster.primary_of_slot(slot);
    cluster.node_mut(killed).kill();
    cluster.wait_for_failover(slot, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    cluster.node_mut(killed).restart();
    let undone = unix_ms();
    cluster.wait_until_settled(Duration::from_secs(15));
    fleet.judge_after(
        "cluster primary killed, failed over, restarted",
        undone,
        unix_ms(),
    );
}

/// A cluster primary paused (`SIGSTOP`, as a process stuck or cut off would be) past the node
/// timeout: its replica takes over while it still hangs, and the deployment serves every slot
/// again without it. Calls to it time out, and have the slot map fetched anew from the other
/// nodes. Resumed at the end, it rejoins as a replica.
#[test]
fn cluster_primary_paused_and_failed_over_while_it_hangs() {
    let mut cluster = RedisCluster::start(3, 1);
    let fleet = Fleet::start(&cluster_topology(&cluster));
    let key = "distlock:lock:{load:1}";
    let slot = cluster.slot_of(key);
    let paused = cluster.pause_primary_of(key);
    cluster.wait_for_failover(slot, Duration::from_secs(10));
    let whole = unix_ms();
    fleet.judge_after("cluster primary paused, failed over", whole, whole);
    cluster.resume(paused);
}

/// A cluster without replicas: a primary killed (its slots down) and restarted on its port with
/// its `nodes.conf`, empty.
#[test]
fn cluster_without_replicas_primary_killed_and_restarted() {
    let mut cluster = RedisCluster::start(3, 0);
    let fleet = Fleet::start(&cluster_topology(&cluster));
    let killed = cluster.primary_of("distlock:lock:{load:1}");
    cluster.node_mut(killed).kill();
    std::thread::sleep(Duration::from_secs(2));
    cluster.node_mut(killed).restart();
    let undone = unix_ms();
    cluster.wait_until_settled(Duration::from_secs(15));
    fleet.judge_after(
        "cluster without replicas, primary restarted",
        undone,
        unix_ms(),
    );
}

/// A manual failover (`CLUSTER FAILOVER` on a replica): the old primary becomes its replica.
#[test]
fn cluster_failover_is_followed() {
    let cluster = RedisCluster::start(3, 1);
    let fleet = Fleet::start(&cluster_topology(&cluster));
    let primary = cluster.primary_of("distlock:lock:{load:1}");
    let replica = cluster.replica_of(primary).expect("a replica");
    assert!(cluster
        .node(replica)
        .command(&["CLUSTER", "FAILOVER"])
        .starts_with("+OK"));
    let undone = unix_ms();
    let slot = cluster.slot_of("distlock:lock:{load:1}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.primary_of_slot(slot) != replica {
        assert!(Instant::now() < deadline, "the failover did not happen");
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.wait_until_settled(Duration::from_secs(15));
    fleet.judge_after("cluster manual failover", undone, unix_ms());
}

/// Resharding under load: every slot of the load's keys that one primary serves moves to
/// another, keys and all (`MOVED`, `ASK` and `TRYAGAIN` meanwhile).
#[test]
fn cluster_slots_migrated_under_load() {
    let cluster = RedisCluster::start(3, 0);
    let fleet = Fleet::start(&cluster_topology(&cluster));
    let from = cluster.primary_of("distlock:lock:{load:1}");
    let to = (0..3).find(|&i| i != from).unwrap();
    let mut slots: Vec<u16> = (0..64)
        .map(|k| cluster.slot_of(&format!("distlock:lock:{{load:{k}}}")))
        .filter(|&slot| cluster.primary_of_slot(slot) == from)
        .collect();
    slots.sort_unstable();
    slots.dedup();
    assert!(slots.len() > 5, "{slots:?}");
    let undone = unix_ms();
    for &slot in &slots {
        cluster.migrate_slot(slot, to);
    }
    cluster.wait_until_settled(Duration::from_secs(15));
    let case = format!("cluster: {} slots migrated", slots.len());
    fleet.judge_after(&case, undone, unix_ms());
}

/// The whole cluster killed and restarted (each node on its port with its `nodes.conf`, empty).
#[test]
fn whole_cluster_restarted() {
    let mut cluster = RedisCluster::start(3, 0);
    let fleet = Fleet::start(&cluster_topology(&cluster));
    for i in 0..cluster.node_count() {
        cluster.node_mut(i).kill();
    }
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..cluster.node_count() {
        cluster.node_mut(i).restart();
    }
    let undone = unix_ms();
    cluster.wait_until_settled(Duration::from_secs(20));
    fleet.judge_after("whole cluster restarted", undone, unix_ms());
}

fn quorum_topology(set: &QuorumSet) -> String {
    format!("quorum={}", set.urls().join(","))
}

/// A quorum of 3: one node (a minority) restarted empty; the others keep the locks.
#[test]
fn quorum_minority_restarted_empty() {
    let mut set = QuorumSet::start(3);
    let fleet = Fleet::start(&quorum_topology(&set));
    set.server_mut(0).kill();
    std::thread::sleep(Duration::from_secs(2));
    set.server_mut(0).restart();
    let undone = unix_ms();
    fleet.judge_after("quorum: a minority restarted empty", undone, undone);
}

/// A quorum of 3: two nodes (a majority) down, then back empty.
#[test]
fn quorum_majority_down_then_back() {
    let mut set = QuorumSet::start(3);
    let fleet = Fleet::start(&quorum_topology(&set));
    set.server_mut(0).kill();
    set.server_mut(1).kill();
    std::thread::sleep(Duration::from_secs(2));
    set.server_mut(0).restart();
    set.server_mut(1).restart();
    let undone = unix_ms();
    fleet.judge_after("quorum: a majority down, then back", undone, undone);
}
