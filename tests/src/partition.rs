//! Partitions and clocks on one machine, for `tests/partitions.rs`.
//!
//! Every node runs on a loopback address of its own ([`Addresses`]: 127.0.0.x, also bound on
//! 127.0.0.1 so the test can always reach it), and its own outgoing links (replication, the
//! cluster bus, a sentinel's links) leave from that address (`--bind-source-addr`). Clients
//! connect to the node's own address from 127.0.0.1. A [`Cut`] drops packets between chosen
//! addresses with `iptables` rules on the loopback interface, each tagged with this process's
//! pid; the rules go when the cut is healed or dropped (also on panic), and rules a killed test
//! process left behind are swept when the next one starts. A [`FakeClock`] runs a server with its
//! wall clock shifted by an offset that can be changed while it runs (`tests/clock/shift.c`,
//! preloaded: libfaketime hangs a jemalloc-linked `redis-server` at startup).
//!
//! The suite needs root, `iptables` and `gcc` (`.ci/run` installs them); without them each test
//! says so on stderr and passes, unless `DISTLOCK_REQUIRE_FAULTS` is set (as on CI), when it
//! fails.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;
use std::time::{Duration, Instant};

use distlock_runtime::testing::TestRedis;

use crate::RedisServer;

/// Set (to anything) where a partition test must not skip: CI.
pub const REQUIRE_FAULTS_ENV: &str = "DISTLOCK_REQUIRE_FAULTS";

/// `false`, with a line on stderr saying why, where faults cannot be made here (not root, no
/// `iptables`, or no `gcc` for the clock shim); panics instead under [`REQUIRE_FAULTS_ENV`].
pub fn faults_possible(test: &str) -> bool {
    let missing = if Command::new("gcc").arg("--version").output().is_err() {
        Some("gcc (apt-get install gcc), to build the clock shim".to_owned())
    } else {
        match Command::new("iptables")
            .args(["-w", "-S", "OUTPUT"])
            .output()
        {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(format!(
                "iptables rights ({}): run as root",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Some(format!("iptables ({e}): apt-get install iptables")),
        }
    };
    match missing {
        None => {
            static SWEEP: Once = Once::new();
            SWEEP.call_once(sweep_stale_rules);
            true
        }
        Some(what) if std::env::var_os(REQUIRE_FAULTS_ENV).is_some() => {
            panic!("{test} needs {what}, and {REQUIRE_FAULTS_ENV} is set")
        }
        Some(what) => {
            eprintln!("skipped `{test}`: it needs {what}");
            false
        }
    }
}

/// Loopback addresses 127.0.0.x (x in 10..=250) held by this process: each is claimed with a
/// file in the temp dir naming the holder's pid (a dead holder's claim is taken over), and freed
/// on drop, so tests running at once never share one.
pub struct Addresses {
    claimed: Vec<(Ipv4Addr, PathBuf)>,
}

impl Addresses {
    /// Claims `n` addresses.
    ///
    /// # Panics
    /// When fewer than `n` are free.
    pub fn claim(n: usize) -> Self {
        let dir = std::env::temp_dir().join("distlock-addresses");
        std::fs::create_dir_all(&dir).expect("create the addresses' claim dir");
        let mut claimed = Vec::with_capacity(n);
        let start = fastrand::u8(10..=250);
        for step in 0..241u16 {
            if claimed.len() == n {
                break;
            }
            let x = 10 + ((u16::from(start) - 10 + step) % 241) as u8;
            let address = Ipv4Addr::new(127, 0, 0, x);
            let file = dir.join(address.to_string());
            if let Ok(holder) = std::fs::read_to_string(&file) {
                let alive = holder
                    .trim()
                    .parse::<u32>()
                    .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                if alive {
                    continue;
                }
                let _ = std::fs::remove_file(&file);
            }
            let created = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&file);
            if let Ok(mut created) = created {
                use std::io::Write;
                let _ = write!(created, "{}", std::process::id());
                claimed.push((address, file));
            }
        }
        assert_eq!(
            claimed.len(),
            n,
            "fewer than {n} loopback addresses are free"
        );
        Self { claimed }
    }

    /// The `i`th address.
    pub fn get(&self, i: usize) -> Ipv4Addr {
        self.claimed[i].0
    }
}

impl Drop for Addresses {
    fn drop(&mut self) {
        for (_, file) in &self.claimed {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The tag on every rule this process adds.
fn tag() -> String {
    format!("distlock-test-{}", std::process::id())
}

fn iptables(args: &[String]) -> Result<(), String> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| format!("iptables: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Removes the rules of test processes that no longer run (killed before their cuts dropped).
fn sweep_stale_rules() {
    let Ok(out) = Command::new("iptables")
        .args(["-w", "-S", "OUTPUT"])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(pid) = line
            .split_once("distlock-test-")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            if let Some(rule) = line.strip_prefix("-A ") {
                let mut args = vec!["-D".to_owned()];
                args.extend(
                    rule.split_whitespace()
                        .map(|w| w.trim_matches('"').to_owned()),
                );
                let _ = iptables(&args);
            }
        }
    }
}

/// Packets dropped between addresses, until [`heal`](Self::heal) or drop.
pub struct Cut {
    rules: Vec<Vec<String>>,
}

impl Cut {
    /// Drops every packet from each of `from` to each of `to`, and back unless `one_way`.
    ///
    /// # Panics
    /// When `iptables` refuses a rule (the ones added are removed first).
    pub fn new(from: &[Ipv4Addr], to: &[Ipv4Addr], one_way: bool) -> Self {
        let mut cut = Self { rules: vec![] };
        for a in from {
            for b in to {
                let mut pairs = vec![(a, b)];
                if !one_way {
                    pairs.push((b, a));
                }
                for (source, destination) in pairs {
                    let rule: Vec<String> = [
                        "OUTPUT",
                        "-o",
                        "lo",
                        "-s",
                        &source.to_string(),
                        "-d",
                        &destination.to_string(),
                        "-m",
                        "comment",
                        "--comment",
                        &tag(),
                        "-j",
                        "DROP",
                    ]
                    .map(str::to_owned)
                    .into();
                    let mut insert = vec!["-I".to_owned()];
                    insert.extend(rule.iter().cloned());
                    if let Err(e) = iptables(&insert) {
                        drop(cut);
                        panic!("{e}");
                    }
                    cut.rules.push(rule);
                }
            }
        }
        cut
    }

    /// Both ways between the two sides.
    pub fn between(a: &[Ipv4Addr], b: &[Ipv4Addr]) -> Self {
        Self::new(a, b, false)
    }

    /// Removes the rules.
    pub fn heal(self) {}
}

impl Drop for Cut {
    fn drop(&mut self) {
        for rule in self.rules.drain(..) {
            let mut delete = vec!["-D".to_owned()];
            delete.extend(rule);
            if let Err(e) = iptables(&delete) {
                eprintln!("could not remove a rule: {e}");
            }
        }
    }
}

/// The address clients connect from (the kernel's source for loopback destinations).
pub const CLIENTS: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// A wall clock for the servers started with [`FakeClock::program`]: an offset in seconds from
/// the real one, read by the preloaded shim (`tests/clock/shift.c`) from a file at most 100 ms
/// old. Only `CLOCK_REALTIME` (and `gettimeofday`, `time`) move, as when NTP steps a clock:
/// monotonic clocks do not. Redis expires keys and answers `TIME` by that clock.
pub struct FakeClock {
    dir: PathBuf,
}

/// The shim, built once per test process into the temp dir.
fn shim() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("distlock-shift-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("create the shim's dir");
            let source = dir.join("shift.c");
            std::fs::write(&source, include_str!("../clock/shift.c")).expect("write shift.c");
            let library = dir.join("shift.so");
            let out = Command::new("gcc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&library)
                .arg(&source)
                .output()
                .expect("run gcc");
            assert!(
                out.status.success(),
                "gcc shift.c: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            library
        })
        .clone()
}

impl FakeClock {
    /// A clock `offset_s` seconds from the real one.
    pub fn new(offset_s: i64) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "distlock-clock-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("create the fake clock's dir");
        let clock = Self { dir };
        clock.set(offset_s);
        let script = format!(
            "#!/bin/sh\nexec env LD_PRELOAD={shim} FAKE_CLOCK_FILE={file} {real} \"$@\"\n",
            shim = shim().display(),
            file = clock.dir.join("offset").display(),
            real = server_program().display(),
        );
        let wrapper = clock.program();
        std::fs::write(&wrapper, script).expect("write the fake clock's wrapper");
        let status = Command::new("chmod").arg("+x").arg(&wrapper).status();
        assert!(status.is_ok_and(|s| s.success()), "chmod the wrapper");
        clock
    }

    /// Moves the clock to `offset_s` seconds from the real one (seen within 100 ms).
    pub fn set(&self, offset_s: i64) {
        // Written whole, then renamed over: the shim never reads half a number.
        let next = self.dir.join("offset.next");
        std::fs::write(&next, format!("{offset_s:+}\n")).expect("write the fake clock's offset");
        std::fs::rename(&next, self.dir.join("offset")).expect("move the offset in place");
    }

    /// The program to start servers with: the harness's `redis-server` under this clock.
    pub fn program(&self) -> PathBuf {
        self.dir.join("redis-server")
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server program the harness starts: `DISTLOCK_REDIS_SERVER`, else `redis-server` (or
/// `valkey-server`) on `PATH`.
fn server_program() -> PathBuf {
    if let Some(program) = std::env::var_os(distlock_runtime::testing::PROGRAM_ENV) {
        return PathBuf::from(program);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["redis-server", "valkey-server"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .expect("redis-server on PATH")
}

/// The text of a raw RESP reply: bulk strings' contents, simple strings and numbers, one per
/// line (array and length headers dropped).
pub fn text(raw: &str) -> String {
    raw.lines()
        .filter(|line| !line.starts_with('*') && !line.starts_with('$'))
        .map(|line| line.strip_prefix(['+', ':']).unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A server on an address of its own (and on 127.0.0.1, for the test's own commands).
pub struct Node {
    /// The server; its `command`s go through 127.0.0.1, which no cut touches.
    pub server: RedisServer,
    /// The address clients and the other nodes use.
    pub address: Ipv4Addr,
}

impl Node {
    /// Starts a server on `address` with `extra` arguments, under `program` if given.
    pub fn start(address: Ipv4Addr, extra: &[&str], program: Option<&Path>) -> Self {
        let address_text = address.to_string();
        let mut builder = TestRedis::builder()
            .args(["--bind", &address_text, "127.0.0.1"])
            .args(["--bind-source-addr", &address_text])
            // Protected mode would refuse the other nodes: only 127.0.0.1 counts as local.
            .args(["--protected-mode", "no"])
            .args(extra);
        if let Some(program) = program {
            builder = builder.program(program);
        }
        let server = builder
            .start_blocking()
            .unwrap_or_else(|e| panic!("start a node on {address}: {e}"));
        Self {
            server: RedisServer::from(server),
            address,
        }
    }

    /// What the server answers `args` with, as [`text`].
    pub fn ask(&self, args: &[&str]) -> String {
        text(&self.server.command(args))
    }

    /// `redis://ADDRESS:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.address, self.server.port())
    }
}

/// A Redis Cluster whose nodes each have an address of their own (announced to the others).
pub struct Cluster {
    /// Primaries first, then one replica of each, in order.
    pub nodes: Vec<Node>,
    config_files: Vec<PathBuf>,
}

impl Cluster {
    /// `primaries` primaries, each with one replica, on `addresses` (2 × `primaries` of them),
    /// with `cluster-node-timeout` `node_timeout_ms`; waits until every node says
    /// `cluster_state:ok` and every replica's link is up.
    pub fn start(addresses: &Addresses, primaries: usize, node_timeout_ms: u64) -> Self {
        let mut cluster = Self {
            nodes: vec![],
            config_files: vec![],
        };
        for i in 0..primaries * 2 {
            let address = addresses.get(i);
            let bus = crate::free_port();
            let config = std::env::temp_dir().join(format!(
                "distlock-partition-{}-{bus}.conf",
                std::process::id()
            ));
            cluster.config_files.push(config.clone());
            let (bus, timeout) = (bus.to_string(), node_timeout_ms.to_string());
            let node = Node::start(
                address,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &config.to_string_lossy(),
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    &timeout,
                    "--cluster-announce-ip",
                    &address.to_string(),
                    "--cluster-replica-validity-factor",
                    "0",
                ],
                None,
            );
            cluster.nodes.push(node);
        }
        let first = &cluster.nodes[0];
        for node in &cluster.nodes[1..] {
            let (ip, port) = (node.address.to_string(), node.server.port().to_string());
            let bus = node
                .ask(&["CONFIG", "GET", "cluster-port"])
                .lines()
                .last()
                .unwrap_or_default()
                .to_owned();
            first.ask(&["CLUSTER", "MEET", &ip, &port, &bus]);
        }
        let per = 16384 / primaries;
        for (i, node) in cluster.nodes[..primaries].iter().enumerate() {
            let from = i * per;
            let to = if i + 1 == primaries {
                16383
            } else {
                from + per - 1
            };
            node.ask(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &from.to_string(),
                &to.to_string(),
            ]);
        }
        cluster.wait(Duration::from_secs(20), |c| {
            let all = c.nodes.iter().all(|node| {
                let nodes = node.ask(&["CLUSTER", "NODES"]);
                nodes.lines().count() == c.nodes.len() && !nodes.contains("handshake")
            });
            all.then_some(())
                .ok_or("every node to know the others".to_owned())
        });
        for i in 0..primaries {
            let id = cluster.nodes[i].ask(&["CLUSTER", "MYID"]);
            cluster.nodes[primaries + i].ask(&["CLUSTER", "REPLICATE", id.trim()]);
        }
        cluster.wait_settled(Duration::from_secs(30));
        cluster
    }

    /// Blocks until `done` says `Ok` or `within` passes (then panics with its last `Err`).
    fn wait(&self, within: Duration, done: impl Fn(&Self) -> Result<(), String>) {
        let deadline = Instant::now() + within;
        while let Err(missing) = done(self) {
            assert!(Instant::now() < deadline, "waited {within:?} for {missing}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every node says `cluster_state:ok`, sees no node failing, and every
    /// replica's link to its primary is up.
    pub fn wait_settled(&self, within: Duration) {
        self.wait(within, |c| {
            for (i, node) in c.nodes.iter().enumerate() {
                let info = node.ask(&["CLUSTER", "INFO"]);
                let nodes = node.ask(&["CLUSTER", "NODES"]);
                let role = node.ask(&["INFO", "replication"]);
                if !info.contains("cluster_state:ok") {
                    return Err(format!("node {i} to say cluster_state:ok"));
                }
                if nodes.contains("fail") {
                    return Err(format!("node {i} to see no node failing:\n{nodes}"));
                }
                if !role.contains("role:master") && !role.contains("master_link_status:up") {
                    return Err(format!("node {i}'s replication link:\n{role}"));
                }
            }
            Ok(())
        });
    }

    /// The seeds for a manager: every node's `redis://ADDRESS:PORT`.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// `key`'s slot.
    pub fn slot_of(&self, key: &str) -> u16 {
        self.nodes[0]
            .ask(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .parse()
            .expect("a slot number")
    }

    /// The node serving `slot` as node `asked` sees it (by address).
    pub fn owner_seen_by(&self, asked: usize, slot: u16) -> Option<usize> {
        let nodes = self.nodes[asked].ask(&["CLUSTER", "NODES"]);
        let by_address: HashMap<String, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (format!("{}:{}", node.address, node.server.port()), i))
            .collect();
        nodes.lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let serves = fields.get(8..)?.iter().any(|range| {
                let (from, to) = range.split_once('-').unwrap_or((range, range));
                match (from.parse::<u16>(), to.parse::<u16>()) {
                    (Ok(from), Ok(to)) => (from..=to).contains(&slot),
                    _ => false,
                }
            });
            let address = fields.get(1)?.split('@').next()?;
            (serves && fields.get(2)?.contains("master"))
                .then(|| by_address.get(address).copied())
                .flatten()
        })
    }

    /// The replica of primary `i` (the nodes are started that way).
    pub fn replica_of(&self, i: usize) -> usize {
        i + self.nodes.len() / 2
    }

    /// Every node's address but `except`'s.
    pub fn addresses_but(&self, except: &[usize]) -> Vec<Ipv4Addr> {
        (0..self.nodes.len())
            .filter(|i| !except.contains(i))
            .map(|i| self.nodes[i].address)
            .collect()
    }

    /// Waits until node `asked` sees `slot` served by another node than `old`, and returns it.
    pub fn wait_for_new_owner(
        &self,
        asked: usize,
        slot: u16,
        old: usize,
        within: Duration,
    ) -> usize {
        let deadline = Instant::now() + within;
        loop {
            match self.owner_seen_by(asked, slot) {
                Some(owner) if owner != old => return owner,
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "no failover of slot {slot} within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        for file in &self.config_files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A primary, its replica and three sentinels, each on an address of its own.
pub struct Sentinels {
    /// The primary (index 0) and its replica (1), as started.
    pub servers: Vec<Node>,
    /// The sentinels.
    pub sentinels: Vec<Node>,
    config_files: Vec<PathBuf>,
}

/// The name the sentinels monitor.
pub const MASTER: &str = "partitioned";

impl Sentinels {
    /// Starts them on `addresses` (5 of them: primary, replica, three sentinels), with
    /// `down-after-milliseconds` `down_after_ms`.
    pub fn start(addresses: &Addresses, down_after_ms: u64) -> Self {
        Self::start_with(addresses, down_after_ms, None)
    }

    /// [`start`](Self::start), the replica under `replica_program` if given.
    pub fn start_with(
        addresses: &Addresses,
        down_after_ms: u64,
        replica_program: Option<&Path>,
    ) -> Self {
        let primary = Node::start(addresses.get(0), &[], None);
        let (ip, port) = (
            primary.address.to_string(),
            primary.server.port().to_string(),
        );
        let replica = Node::start(
            addresses.get(1),
            &["--replicaof", &ip, &port],
            replica_program,
        );
        let mut group = Self {
            servers: vec![primary, replica],
            sentinels: vec![],
            config_files: vec![],
        };
        for i in 2..5 {
            let address = addresses.get(i);
            // A free port may be taken by another test before the sentinel binds it: the
            // sentinel then exits at once, and another port is tried.
            let mut tries = 0;
            let server = loop {
                tries += 1;
                let sentinel_port = crate::free_port();
                let config = std::env::temp_dir().join(format!(
                    "distlock-partition-sentinel-{}-{sentinel_port}.conf",
                    std::process::id()
                ));
                group.config_files.push(config.clone());
                std::fs::write(
                    &config,
                    format!(
                        "port {sentinel_port}\nprotected-mode no\nbind-source-addr {address}\n\
                     sentinel announce-ip {address}\n\
                     sentinel monitor {MASTER} {ip} {port} 2\n\
                     sentinel down-after-milliseconds {MASTER} {down_after_ms}\n\
                     sentinel failover-timeout {MASTER} 3000\n"
                    ),
                )
                .expect("write a sentinel's config");
                let address_text = address.to_string();
                // After the harness's own `--bind 127.0.0.1`, which would override the file's.
                let started = TestRedis::builder()
                    .config_file(&config)
                    .arg("--sentinel")
                    .args(["--bind", &address_text, "127.0.0.1"])
                    .port(sentinel_port)
                    .start_blocking();
                match started {
                    Ok(server) => break server,
                    Err(e) if tries >= 5 => panic!("start a sentinel: {e}"),
                    Err(_) => {}
                }
            };
            group.sentinels.push(Node {
                server: RedisServer::from(server),
                address,
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !group.sentinels.iter().all(|s| {
            let info = s.ask(&["SENTINEL", "MASTER", MASTER]);
            let replicas = s.ask(&["SENTINEL", "REPLICAS", MASTER]);
            let sentinels = s.ask(&["SENTINEL", "SENTINELS", MASTER]);
            info.contains("master")
                && replicas.contains(&group.servers[1].address.to_string())
                && sentinels.matches("name").count() >= 2
        }) {
            assert!(Instant::now() < deadline, "the sentinels did not meet");
            std::thread::sleep(Duration::from_millis(100));
        }
        group
    }

    /// The sentinels' `redis://ADDRESS:PORT`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// The primary's address as sentinel 0 names it.
    pub fn primary_address(&self) -> String {
        let reply = self.sentinels[0].ask(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]);
        reply.lines().next().unwrap_or_default().to_owned()
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        self.sentinels.clear();
        self.servers.clear();
        for file in &self.config_files {
            let _ = std::fs::remove_file(file);
        }
    }
}
