//! Partitions and clocks, Jepsen-style: several `partition_worker` processes lock through a
//! fault while each writes its history (acquires, leases' validity, losses, releases, fenced
//! writes to a storage Redis of its own); the checker (`distlock_tests::history`) reads them
//! together. The harness (`distlock_tests::partition`) puts each node on a loopback address of
//! its own and cuts traffic with `iptables`; clocks are moved with libfaketime.
//!
//! Each case prints its report (`--nocapture`): the figures in `docs/reliability.md`
//! ("Partitions and clocks") come from these runs. The long version, random fault schedules for
//! minutes, is `random_fault_schedules` (`-- --ignored`).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock_tests::history::{
    check, now_us, read_histories, CheckOptions, Event, FaultPhase, Recorder, Report,
};
use distlock_tests::partition::{
    faults_possible, Addresses, Cluster, Cut, FakeClock, Node, Sentinels, CLIENTS, MASTER,
};
use distlock_tests::RedisServer;

/// One worker process's load.
struct Worker {
    topology: String,
    tasks: usize,
    keys: u64,
    hold_ms: u64,
    options: Vec<String>,
}

impl Worker {
    fn new(topology: &str, tasks: usize, keys: u64, hold_ms: u64, options: &[&str]) -> Self {
        Self {
            topology: topology.to_owned(),
            tasks,
            keys,
            hold_ms,
            options: options.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

/// Worker processes locking, their histories, the storage they write to, and the test's own
/// history (the faults).
struct Load {
    case: String,
    dir: PathBuf,
    storage: RedisServer,
    children: Vec<Child>,
    histories: Vec<PathBuf>,
    test: Recorder,
}

impl Load {
    fn start(case: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "distlock-partitions-{}-{case}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).expect("create the histories' dir");
        let test_history = dir.join("test.history");
        Self {
            case: case.to_owned(),
            storage: RedisServer::start(),
            children: vec![],
            histories: vec![test_history.clone()],
            test: Recorder::create(&test_history, "test").expect("create the test's history"),
            dir,
        }
    }

    /// Starts a worker process named `p1`, `p2`, ... and waits until it is ready.
    fn add(&mut self, worker: Worker) {
        let name = format!("p{}", self.children.len() + 1);
        let history = self.dir.join(format!("{name}.history"));
        let stderr = std::fs::File::create(self.dir.join(format!("{name}.stderr"))).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_partition_worker"))
            .arg(&worker.topology)
            .arg(self.storage.url())
            .arg(&history)
            .arg(&name)
            .arg(worker.tasks.to_string())
            .arg(worker.keys.to_string())
            .arg(worker.hold_ms.to_string())
            .args(&worker.options)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start partition_worker");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "{name} did not start: {}",
            self.stderr(&name)
        );
        self.children.push(child);
        self.histories.push(history);
    }

    fn stderr(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.stderr"))).unwrap_or_default()
    }

    /// Notes a fault's phase in the test's history; returns when.
    fn fault(&self, name: &str, phase: FaultPhase) -> u64 {
        self.test.fault(name, phase);
        now_us()
    }

    /// Stops the workers (stdin closed; killed after 10 s) and checks the histories.
    fn stop(mut self, options: &CheckOptions) -> (Vec<Event>, Report) {
        for child in &mut self.children {
            drop(child.stdin.take());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for child in &mut self.children {
            while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let events = read_histories(&self.histories).expect("read the histories");
        let report = check(&events, options);
        eprintln!("== {}\n{report}", self.case);
        if std::env::var_os("DISTLOCK_KEEP_HISTORIES").is_some() {
            eprintln!("histories kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        (events, report)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Leases granted per process whose grant fell in `from..to`.
fn grants_between(events: &[Event], from: u64, to: u64) -> BTreeMap<String, u64> {
    let mut grants = BTreeMap::new();
    for event in events {
        if let Event::Granted { process, at, .. } = event {
            if (from..to).contains(at) {
                *grants.entry(process.clone()).or_insert(0) += 1;
            }
        }
    }
    grants
}

/// Failed acquires per class whose answer fell in `from..to`.
fn failures_between(events: &[Event], from: u64, to: u64) -> BTreeMap<String, u64> {
    let mut failures = BTreeMap::new();
    for event in events {
        if let Event::Failed { class, at, .. } = event {
            if (from..to).contains(at) {
                *failures.entry(class.clone()).or_insert(0) += 1;
            }
        }
    }
    failures
}

/// The longest an acquire took to answer, granted or failed.
fn longest_acquire(events: &[Event]) -> Duration {
    let mut invoked: HashMap<(&str, u64), u64> = HashMap::new();
    let mut longest = 0;
    for event in events {
        match event {
            Event::Invoke {
                process, op, at, ..
            } => {
                invoked.insert((process, *op), *at);
            }
            Event::Granted {
                process, op, at, ..
            }
            | Event::Failed {
                process, op, at, ..
            } => {
                if let Some(started) = invoked.get(&(process.as_str(), *op)) {
                    longest = longest.max(at - started);
                }
            }
            _ => {}
        }
    }
    Duration::from_micros(longest)
}

/// Fencing held: no write accepted out of token order, no token shared by two leases, no token
/// backwards, no body acting past its validity.
#[track_caller]
fn assert_fenced(report: &Report) {
    assert!(
        report.out_of_order.is_empty()
            && report.shared_tokens.is_empty()
            && report.backwards.is_empty()
            && report.after_validity.is_empty(),
        "{report}"
    );
}

/// Every process got a lease within `within` of each heal.
#[track_caller]
fn assert_resumed(report: &Report, within: Duration) {
    for resume in &report.resumes {
        assert!(
            resume
                .after_us
                .is_some_and(|us| us <= within.as_micros() as u64),
            "{} did not resume within {within:?} of healing {}: {report}",
            resume.process,
            resume.fault
        );
    }
}

/// Each process's leases granted per second, from `from`, one column a second: for the eye.
fn timeline(events: &[Event], from: u64) -> String {
    let mut rows: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for event in events {
        if let Event::Granted { process, at, .. } = event {
            if *at >= from {
                let second = ((at - from) / 1_000_000) as usize;
                let row = rows.entry(process).or_default();
                if row.len() <= second {
                    row.resize(second + 1, 0);
                }
                row[second] += 1;
            }
        }
    }
    rows.iter()
        .map(|(process, row)| format!("{process}: {row:?}\n"))
        .collect()
}

fn per_second(count: u64, from: u64, to: u64) -> f64 {
    count as f64 / ((to - from) as f64 / 1e6)
}

/// The load a failover case runs under, started and warmed up for 2 s: two processes lock keys
/// with 10 ms holds (ttl 2 s), a third holds its own keys for 4 s of a 5 s ttl (holds that span
/// the failover); `options` for all three.
fn failover_load(case: &str, topology: &str, options: &[&str]) -> Load {
    let mut load = Load::start(case);
    let mut long = options.to_vec();
    long.extend(["from=10", "ttl=5000"]);
    load.add(Worker::new(topology, 4, 2, 10, options));
    load.add(Worker::new(topology, 4, 2, 10, options));
    load.add(Worker::new(topology, 4, 2, 4000, &long));
    std::thread::sleep(Duration::from_secs(2));
    load
}

/// A cluster (3 primaries, a replica each, `cluster-node-timeout` 1 s) whose keys' primary is
/// cut off from its replica and the other primaries for 8 s while clients still reach it, under
/// [`failover_load`].
fn cluster_cut(case: &str, options: &[&str]) -> (Vec<Event>, Report, u64, u64) {
    let addresses = Addresses::claim(6);
    let cluster = Cluster::start(&addresses, 3, 1000);
    let topology = format!("cluster={}", cluster.seed_urls().join(","));
    let load = failover_load(case, &topology, options);
    let slot = cluster.slot_of("{fault}:0");
    let old = cluster.owner_seen_by(0, slot).expect("the slot's primary");
    let others = cluster.addresses_but(&[old]);
    load.fault("primary cut off", FaultPhase::Start);
    let cut = Cut::between(&[cluster.nodes[old].address], &others);
    let asked = (old + 1) % 3;
    cluster.wait_for_new_owner(asked, slot, old, Duration::from_secs(10));
    let promoted = now_us();
    std::thread::sleep(Duration::from_secs(6));
    let healed = load.fault("primary cut off", FaultPhase::Heal);
    cut.heal();
    cluster.wait_settled(Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));
    let (events, report) = load.stop(&CheckOptions::default());
    (events, report, promoted, healed)
}

#[test]
fn a_cluster_primary_cut_off_keeps_fencing_and_locking_goes_on_at_the_promoted_primary() {
    if !faults_possible("cluster_primary_cut_off") {
        return;
    }
    let (events, report, promoted, healed) = cluster_cut("cluster, primary cut off", &[]);
    let from = promoted + 1_000_000;
    let grants = grants_between(&events, from, healed);
    eprintln!(
        "after the promotion: grants {grants:?} in {:.1} s, failures {:?}; overlaps {}",
        (healed - from) as f64 / 1e6,
        failures_between(&events, from, healed),
        report.overlaps.len()
    );
    assert_fenced(&report);
    assert_resumed(&report, Duration::from_secs(5));
    // The short-hold processes lock at the promoted primary's pace, not once per wait: their
    // waiters hear of releases there.
    for process in ["p1", "p2"] {
        let rate = per_second(grants.get(process).copied().unwrap_or(0), from, healed);
        assert!(
            rate >= 10.0,
            "{process} locked {rate:.1}/s after the promotion: {report}"
        );
    }
}

#[test]
fn with_min_replicas_a_cluster_primary_cut_off_grants_no_key_twice() {
    if !faults_possible("cluster_primary_cut_off_min_replicas") {
        return;
    }
    let (events, report, promoted, healed) = cluster_cut(
        "cluster, primary cut off, min_replicas(1)",
        &["min_replicas=1"],
    );
    let failures = failures_between(&events, promoted, healed);
    eprintln!(
        "after the promotion: grants {:?}, failures {failures:?}; longest acquire {:?}",
        grants_between(&events, promoted, healed),
        longest_acquire(&events)
    );
    assert!(report.overlaps.is_empty(), "{report}");
    assert_fenced(&report);
    assert_resumed(&report, Duration::from_secs(5));
    // Nothing could be confirmed at the promoted primary (its replica is cut off): no failure
    // there is contention.
    assert_eq!(failures.get("busy"), None, "{failures:?}");
    // Every wait (1 s) ended by its deadline and one response timeout (0.5 s).
    let longest = longest_acquire(&events);
    assert!(
        longest <= Duration::from_millis(1_650),
        "an acquire took {longest:?}"
    );
}

/// A Sentinel-managed primary cut off from its replica and the sentinels until 5 s after the
/// failover, while clients still reach it, under [`failover_load`].
fn sentinel_cut(case: &str, options: &[&str]) -> (Vec<Event>, Report, u64, u64) {
    let addresses = Addresses::claim(5);
    let group = Sentinels::start(&addresses, 1000);
    let topology = format!("sentinel={MASTER}@{}", group.sentinel_urls().join(","));
    let load = failover_load(case, &topology, options);
    let old = group.primary_address();
    let primary = group.servers[0].address;
    let others: Vec<_> = std::iter::once(group.servers[1].address)
        .chain(group.sentinels.iter().map(|s| s.address))
        .collect();
    load.fault("primary cut off", FaultPhase::Start);
    let cut = Cut::between(&[primary], &others);
    let deadline = Instant::now() + Duration::from_secs(15);
    while group.primary_address() == old {
        assert!(Instant::now() < deadline, "no failover");
        std::thread::sleep(Duration::from_millis(50));
    }
    let promoted = now_us();
    std::thread::sleep(Duration::from_secs(5));
    let healed = load.fault("primary cut off", FaultPhase::Heal);
    cut.heal();
    // The sentinels turn the old primary into a replica of the new one (some seconds after they
    // see it again): until then a write cannot reach a replica.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !group.servers[0]
        .ask(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(
            Instant::now() < deadline,
            "the old primary did not follow the new one"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (events, report) = load.stop(&CheckOptions::default());
    (events, report, promoted, healed)
}

#[test]
fn a_sentinel_primary_cut_off_keeps_fencing_and_the_promoted_one_serves() {
    if !faults_possible("sentinel_primary_cut_off") {
        return;
    }
    let (events, report, promoted, healed) = sentinel_cut("Sentinel, primary cut off", &[]);
    let from = promoted + 1_000_000;
    let grants = grants_between(&events, from, healed);
    eprintln!(
        "after the promotion: grants {grants:?}, failures {:?}; overlaps {}",
        failures_between(&events, from, healed),
        report.overlaps.len()
    );
    assert_fenced(&report);
    assert_resumed(&report, Duration::from_secs(5));
    for process in ["p1", "p2"] {
        let rate = per_second(grants.get(process).copied().unwrap_or(0), from, healed);
        assert!(
            rate >= 10.0,
            "{process} locked {rate:.1}/s after the promotion: {report}"
        );
    }
}

#[test]
fn with_min_replicas_a_sentinel_primary_cut_off_grants_no_key_twice() {
    if !faults_possible("sentinel_primary_cut_off_min_replicas") {
        return;
    }
    let (events, report, promoted, healed) = sentinel_cut(
        "Sentinel, primary cut off, min_replicas(1)",
        &["min_replicas=1"],
    );
    let failures = failures_between(&events, promoted, healed);
    eprintln!(
        "after the promotion: grants {:?}, failures {failures:?}; longest acquire {:?}",
        grants_between(&events, promoted, healed),
        longest_acquire(&events)
    );
    assert!(report.overlaps.is_empty(), "{report}");
    assert_fenced(&report);
    // Until the old primary follows the new one (the sentinels take about 10 s), nothing can be
    // confirmed.
    assert_resumed(&report, Duration::from_secs(20));
    assert_eq!(failures.get("busy"), None, "{failures:?}");
    let longest = longest_acquire(&events);
    assert!(
        longest <= Duration::from_millis(1_650),
        "an acquire took {longest:?}"
    );
}

/// A quorum of five on addresses of their own; `cut_off` of them (node 0, where subscriptions
/// start, among them) cut off from the clients for 6 s.
fn quorum_cut(case: &str, cut_off: usize) -> (Vec<Event>, Report, u64, u64) {
    let addresses = Addresses::claim(5);
    let nodes: Vec<Node> = (0..5)
        .map(|i| Node::start(addresses.get(i), &[], None))
        .collect();
    let urls: Vec<String> = nodes.iter().map(Node::url).collect();
    let topology = format!("quorum={}", urls.join(","));
    let mut load = Load::start(case);
    for _ in 0..3 {
        load.add(Worker::new(&topology, 4, 8, 10, &[]));
    }
    std::thread::sleep(Duration::from_secs(2));
    let minority: Vec<_> = nodes[..cut_off].iter().map(|n| n.address).collect();
    let cut_at = load.fault("nodes cut off", FaultPhase::Start);
    let cut = Cut::between(&minority, &[CLIENTS]);
    std::thread::sleep(Duration::from_secs(6));
    let healed = load.fault("nodes cut off", FaultPhase::Heal);
    cut.heal();
    std::thread::sleep(Duration::from_secs(2));
    let (events, report) = load.stop(&CheckOptions::default());
    (events, report, cut_at, healed)
}

#[test]
fn a_quorums_minority_cut_off_changes_nothing() {
    if !faults_possible("quorum_minority_cut_off") {
        return;
    }
    let (events, report, cut_at, healed) = quorum_cut("quorum of 5, 2 cut off", 2);
    // A round waits for the majority only. Waiters subscribed on a node cut off hear of no
    // release until the subscriber connection's check (a PING every 2 s) replaces it, on a node
    // that answers: judged from 3 s into the cut. (With 3 of 5 nodes left, a round needs every
    // one of them: contended acquires split their votes more often, so the keys are 8 here.)
    let from = cut_at + 3_000_000;
    let grants = grants_between(&events, from, healed);
    eprint!(
        "grants a second from 2 s before the cut:\n{}",
        timeline(&events, cut_at - 2_000_000)
    );
    eprintln!(
        "during the cut: grants {grants:?}, failures {:?}",
        failures_between(&events, from, healed)
    );
    assert!(report.overlaps.is_empty(), "{report}");
    assert_fenced(&report);
    for process in ["p1", "p2", "p3"] {
        let rate = per_second(grants.get(process).copied().unwrap_or(0), from, healed);
        assert!(
            rate >= 3.0,
            "{process} locked {rate:.1}/s with a minority cut off: {report}"
        );
    }
}

#[test]
fn a_quorums_majority_cut_off_stops_locking_and_never_splits() {
    if !faults_possible("quorum_majority_cut_off") {
        return;
    }
    let (events, report, cut_at, healed) = quorum_cut("quorum of 5, 3 cut off", 3);
    // Acquires answered in the cut, after those already out when it began.
    let from = cut_at + 1_000_000;
    let grants = grants_between(&events, from, healed);
    eprintln!(
        "during the cut: grants {grants:?}, failures {:?}",
        failures_between(&events, from, healed)
    );
    assert!(
        grants.is_empty(),
        "leases granted without a majority: {grants:?}"
    );
    assert!(report.overlaps.is_empty(), "{report}");
    assert_fenced(&report);
    assert_resumed(&report, Duration::from_secs(3));
}

/// One server; `p1` connects to it on its own address (which the cut cuts), `p2` on 127.0.0.1.
fn client_cut(case: &str, one_way: bool) -> (Vec<Event>, Report, u64, u64) {
    let addresses = Addresses::claim(1);
    let node = Node::start(addresses.get(0), &[], None);
    let mut load = Load::start(case);
    let holder = if one_way {
        Worker::new(&format!("url={}", node.url()), 2, 1, 200, &["ttl=3000"])
    } else {
        Worker::new(&format!("url={}", node.url()), 1, 1, 30_000, &["ttl=3000"])
    };
    load.add(holder);
    std::thread::sleep(Duration::from_millis(500));
    load.add(Worker::new(
        &format!("url={}", node.server.url()),
        2,
        1,
        50,
        &["ttl=3000", "wait=1000"],
    ));
    std::thread::sleep(Duration::from_secs(2));
    let cut_at = load.fault("client cut off", FaultPhase::Start);
    let cut = Cut::new(&[node.address], &[CLIENTS], one_way);
    std::thread::sleep(Duration::from_secs(7));
    let healed = load.fault("client cut off", FaultPhase::Heal);
    cut.heal();
    std::thread::sleep(Duration::from_secs(3));
    let (events, report) = load.stop(&CheckOptions::default());
    (events, report, cut_at, healed)
}

#[test]
fn a_holder_cut_off_from_redis_stops_before_anybody_else_takes_its_key() {
    if !faults_possible("client_cut_off") {
        return;
    }
    let (events, report, cut_at, healed) = client_cut("one server, holder cut off", false);
    let rival = grants_between(&events, cut_at, healed);
    eprintln!("during the cut: grants {rival:?}");
    assert!(report.overlaps.is_empty(), "{report}");
    assert_fenced(&report);
    // The holder's key expired in Redis within its ttl: the rival got it during the cut.
    assert!(rival.get("p2").is_some_and(|&n| n > 0), "{report}");
    let lost = events
        .iter()
        .any(|e| matches!(e, Event::Lost { process, .. } if process == "p1"));
    assert!(
        lost,
        "the holder never learned its lease was lost: {report}"
    );
}

#[test]
fn a_client_whose_replies_are_lost_leaves_no_lock_held_for_ever() {
    if !faults_possible("replies_lost") {
        return;
    }
    let (events, report, cut_at, healed) =
        client_cut("one server, replies to one client lost", true);
    let rival = grants_between(&events, cut_at + 4_000_000, healed);
    eprintln!(
        "during the cut: grants {:?} (from ttl + 1 s on: {rival:?}), failures {:?}",
        grants_between(&events, cut_at, healed),
        failures_between(&events, cut_at, healed)
    );
    assert!(report.overlaps.is_empty(), "{report}");
    assert_fenced(&report);
    // Whatever the cut-off client's requests took expired or was released: from a ttl after
    // the cut on, the rival kept locking.
    assert!(rival.get("p2").is_some_and(|&n| n > 5), "{report}");
    assert_resumed(&report, Duration::from_secs(3));
}

/// One server under a fake clock set by `schedule` (offsets in seconds, one per second), with
/// two processes locking keys held 1.2 s of a 2 s ttl.
fn clocked(case: &str, schedule: &[i64]) -> (Vec<Event>, Report) {
    let clock = FakeClock::new(schedule[0]);
    let addresses = Addresses::claim(1);
    let node = Node::start(addresses.get(0), &[], Some(&clock.program()));
    let mut load = Load::start(case);
    load.add(Worker::new(&format!("url={}", node.url()), 4, 2, 1200, &[]));
    load.add(Worker::new(&format!("url={}", node.url()), 4, 2, 1200, &[]));
    for &offset in schedule {
        clock.set(offset);
        std::thread::sleep(Duration::from_secs(1));
    }
    load.stop(&CheckOptions::default())
}

#[test]
fn a_server_clock_ahead_or_behind_changes_nothing() {
    if !faults_possible("clock_offset") {
        return;
    }
    for (case, offset) in [
        ("one server, clock 30 s ahead", 30),
        ("one server, clock 30 s behind", -30),
    ] {
        let (_, report) = clocked(case, &[offset; 5]);
        assert!(report.overlaps.is_empty(), "{report}");
        assert_fenced(&report);
    }
}

#[test]
fn a_server_clock_jumping_forward_frees_keys_early_and_fencing_keeps_order() {
    if !faults_possible("clock_jump") {
        return;
    }
    let (_, report) = clocked(
        "one server, clock jumps 10 s forward then back",
        &[0, 0, 10, 10, 10, 0, 0, 0],
    );
    // Redis expires keys by its wall clock: a jump forward past the ttl expires every lease at
    // once while its holder still counts on it (measured: docs/reliability.md). Fencing keeps
    // the storage in order.
    assert_fenced(&report);
}

/// Kleppmann's case: a lease granted by nodes 0 and 1 while node 2 still held an older lease;
/// node 0's clock jumps and expires it; a second acquire then takes nodes 0 and 2, a second
/// majority, while the first holder still runs (measured: docs/reliability.md). Fencing keeps
/// the storage in order.
#[test]
fn a_quorum_node_whose_clock_jumps_can_grant_a_key_twice_and_fencing_keeps_order() {
    if !faults_possible("quorum_clock_jump") {
        return;
    }
    let clock = FakeClock::new(0);
    let addresses = Addresses::claim(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| {
            let program = (i == 0).then(|| clock.program());
            Node::start(addresses.get(i), &[], program.as_deref())
        })
        .collect();
    let topology = format!(
        "quorum={}",
        nodes.iter().map(Node::url).collect::<Vec<_>>().join(",")
    );
    let mut load = Load::start("quorum of 3, one clock jumps 10 s forward then back");
    load.add(Worker::new(&topology, 4, 2, 1200, &[]));
    load.add(Worker::new(&topology, 4, 2, 1200, &[]));
    for offset in [0, 10, 10, 10, -10, -10, 0, 0] {
        clock.set(offset);
        std::thread::sleep(Duration::from_secs(1));
    }
    let (_, report) = load.stop(&CheckOptions::default());
    assert_fenced(&report);
}

#[test]
fn a_promoted_replica_whose_clock_runs_ahead_frees_keys_early_and_fencing_keeps_order() {
    if !faults_possible("replica_clock_ahead") {
        return;
    }
    // A primary and its replica (whose clock runs 5 s ahead) under three sentinels; a failover
    // while leases are held.
    let clock = FakeClock::new(5);
    let addresses = Addresses::claim(5);
    let group = Sentinels::start_with(&addresses, 1000, Some(&clock.program()));
    let topology = format!("sentinel={MASTER}@{}", group.sentinel_urls().join(","));
    let mut load = Load::start("Sentinel, failover to a replica 5 s ahead");
    load.add(Worker::new(&topology, 4, 2, 1200, &[]));
    load.add(Worker::new(&topology, 4, 2, 1200, &[]));
    std::thread::sleep(Duration::from_secs(2));
    load.fault("failover", FaultPhase::Start);
    group.sentinels[0].ask(&["SENTINEL", "FAILOVER", MASTER]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !group.servers[0]
        .ask(&["INFO", "replication"])
        .contains("master_link_status:up")
    {
        assert!(
            Instant::now() < deadline,
            "the old primary did not follow the new one"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    load.fault("failover", FaultPhase::Heal);
    std::thread::sleep(Duration::from_secs(3));
    let (_, report) = load.stop(&CheckOptions::default());
    // Keys are replicated with their expiry as a time: the promoted replica, 5 s ahead, finds
    // every lease of a 2 s ttl expired (measured: docs/reliability.md). Fencing keeps order.
    assert_fenced(&report);
    assert_resumed(&report, Duration::from_secs(5));
}

/// The long version: random cuts for minutes (`DISTLOCK_FAULT_MINUTES`, 4 unless set), half the
/// time on a cluster (a random node cut off from the others, clients still reaching it), half
/// on a quorum of five (random nodes cut off from the clients), each cut lasting 1 to 8 s with
/// 2 to 6 s between them. Fencing must hold throughout, and every process lock again within 10 s
/// of each heal. Run with `cargo test -p distlock-tests --test partitions -- --ignored
/// --nocapture`.
#[test]
#[ignore = "minutes long: the short cases above run in CI"]
fn random_fault_schedules() {
    if !faults_possible("random_fault_schedules") {
        return;
    }
    let minutes: u64 = std::env::var("DISTLOCK_FAULT_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(4);
    let half = Duration::from_secs(minutes * 30);
    let pause = || Duration::from_millis(fastrand::u64(2_000..6_000));
    let length = || Duration::from_millis(fastrand::u64(1_000..8_000));

    let addresses = Addresses::claim(6);
    let cluster = Cluster::start(&addresses, 3, 1000);
    let topology = format!("cluster={}", cluster.seed_urls().join(","));
    let mut load = Load::start("random cuts, cluster");
    load.add(Worker::new(&topology, 4, 4, 10, &[]));
    load.add(Worker::new(&topology, 4, 4, 10, &[]));
    load.add(Worker::new(&topology, 4, 2, 1500, &["from=10", "ttl=5000"]));
    let until = Instant::now() + half;
    let mut cuts = 0;
    while Instant::now() < until {
        std::thread::sleep(pause());
        let node = fastrand::usize(0..cluster.nodes.len());
        let name = format!("node {node} cut off");
        load.fault(&name, FaultPhase::Start);
        let cut = Cut::between(
            &[cluster.nodes[node].address],
            &cluster.addresses_but(&[node]),
        );
        std::thread::sleep(length());
        load.fault(&name, FaultPhase::Heal);
        cut.heal();
        cluster.wait_settled(Duration::from_secs(30));
        cuts += 1;
    }
    std::thread::sleep(Duration::from_secs(3));
    let (_, report) = load.stop(&CheckOptions::default());
    eprintln!("{cuts} cuts; overlaps {}", report.overlaps.len());
    assert_fenced(&report);
    assert_resumed(&report, Duration::from_secs(10));

    let addresses = Addresses::claim(5);
    let nodes: Vec<Node> = (0..5)
        .map(|i| Node::start(addresses.get(i), &[], None))
        .collect();
    let topology = format!(
        "quorum={}",
        nodes.iter().map(Node::url).collect::<Vec<_>>().join(",")
    );
    let mut load = Load::start("random cuts, quorum of 5");
    for _ in 0..3 {
        load.add(Worker::new(&topology, 4, 4, 10, &[]));
    }
    let until = Instant::now() + half;
    while Instant::now() < until {
        std::thread::sleep(pause());
        let mut chosen: Vec<usize> = (0..5).collect();
        fastrand::shuffle(&mut chosen);
        chosen.truncate(fastrand::usize(1..=3));
        let name = format!("nodes {chosen:?} cut off");
        load.fault(&name, FaultPhase::Start);
        let cut_off: Vec<_> = chosen.iter().map(|&i| nodes[i].address).collect();
        let cut = Cut::between(&cut_off, &[CLIENTS]);
        std::thread::sleep(length());
        load.fault(&name, FaultPhase::Heal);
        cut.heal();
    }
    std::thread::sleep(Duration::from_secs(3));
    let (_, report) = load.stop(&CheckOptions::default());
    assert!(report.overlaps.is_empty(), "{report}");
    assert_fenced(&report);
    assert_resumed(&report, Duration::from_secs(10));
}

/// A quorum's subscriber connection goes to a node that answers: its waiters are woken by the
/// release, not by polling. Before, the first node was dialled again and again while it was cut
/// off (each connect cut short by the notifier's connect timeout before the next node was
/// chosen), and waiters polled for as long as the cut lasted.
#[test]
fn a_quorum_waiter_is_woken_by_a_release_while_the_first_node_is_cut_off() {
    if !faults_possible("quorum_subscriber_cut_off") {
        return;
    }
    let addresses = Addresses::claim(3);
    let nodes: Vec<Node> = (0..3)
        .map(|i| Node::start(addresses.get(i), &[], None))
        .collect();
    let _cut = Cut::between(&[nodes[0].address], &[CLIENTS]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let locks = distlock_runtime::LockManager::builder()
            .quorum(nodes.iter().map(Node::url).collect::<Vec<_>>())
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let held = locks
            .lock("woken")
            .ttl(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let lease = locks
                    .lock("woken")
                    .wait(Duration::from_secs(8))
                    .acquire()
                    .await;
                (lease.map(drop), started.elapsed())
            })
        };
        // Time to find a node for the subscriber connection and subscribe there.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let before = nodes[1].server.script_calls();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let polled = nodes[1].server.script_calls() - before;
        held.release().await.unwrap();
        let (acquired, waited) = waiter.await.unwrap();
        acquired.unwrap();
        eprintln!("the waiter's attempts in 2 s: {polled}; acquired after {waited:?}");
        // A notified waiter sleeps until the release (or the holder's expiry, at 10 s); a
        // polling one tries every 50 ms at most. Woken by the release at 5 s, it acquires at
        // once, or (about one run in three, the cause not yet known) one response timeout of
        // the cut-off node (500 ms) later: allowed here, and under investigation.
        assert!(polled <= 2, "the waiter polled: {polled} attempts in 2 s");
        assert!(
            waited < Duration::from_millis(5_800),
            "acquired after {waited:?}"
        );
    });
}
