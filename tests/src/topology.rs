//! Multi-server topologies: a Redis Cluster, a Sentinel group, and a set of independent servers.
//!
//! Every process runs on free loopback ports, from the `redis-server` and `redis-cli` binaries
//! alone, and is stopped by its pid when its owner is dropped; config files the processes need
//! are made in the temp dir under unique names and removed on drop.
//!
//! - [`RedisCluster`]: `primaries` primaries with `replicas_per_primary` replicas each, with a
//!   500 ms node timeout, so a synced replica takes over 1.5 to 2 s after its primary died.
//!   Startup takes 2 s (a new primary refuses to say `cluster_state:ok` for its first 2 s).
//! - [`SentinelGroup`]: one primary, its replicas, and sentinels watching them with a 500 ms
//!   down-after, so a dead primary is replaced after about 2 s. Startup takes about 0.3 s.
//! - [`QuorumSet`]: independent servers, one per quorum member.
//!
//! Startup waits (polling, no fixed sleeps) until the topology is ready for what the tests do to
//! it: every cluster node agrees on the slot map and every replica is in sync; every sentinel
//! knows the primary, its replicas and the other sentinels. The waits are bounded and panic with
//! what was still missing.
//!
//! Everything here blocks the calling thread (like [`RedisServer::start`]).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{free_port, ours_when_up, parse_reply, resp_command, send_signal, RedisServer, Reply};

/// How long startups may take before they panic.
const STARTUP: Duration = Duration::from_secs(20);

/// How often the waits look again.
const POLL: Duration = Duration::from_millis(10);

/// A path in the temp dir no other process or call uses: `distlock-<kind>-<pid>-<port>-<n>.conf`.
fn unique_temp_file(kind: &str, port: u16) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    std::env::temp_dir().join(format!("distlock-{kind}-{pid}-{port}-{n}.conf"))
}

/// Runs one command on `port` and parses its reply; `None` if the server cannot be reached, does
/// not answer within 2 s, or the reply is malformed.
fn query(port: u16, args: &[&str]) -> Option<Reply> {
    let raw = resp_command(port, args).ok()?;
    parse_reply(raw.as_bytes()).map(|(reply, _)| reply)
}

impl Reply {
    /// The text of a simple or bulk string.
    fn text(&self) -> Option<&str> {
        match self {
            Reply::Simple(text) | Reply::Bulk(Some(text)) => Some(text),
            _ => None,
        }
    }

    /// The elements of an array (none for anything else).
    fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) => items,
            _ => &[],
        }
    }

    /// A flat array of alternating names and values (`SENTINEL MASTER`) as a map.
    fn fields(&self) -> HashMap<String, String> {
        self.items()
            .chunks(2)
            .filter_map(|pair| match pair {
                [name, value] => Some((name.text()?.to_owned(), value.text()?.to_owned())),
                _ => None,
            })
            .collect()
    }

    /// What the reply says, for a panic message.
    fn describe(&self) -> String {
        match self {
            Reply::Simple(text) | Reply::Bulk(Some(text)) => text.clone(),
            Reply::Error(message) => format!("error {message}"),
            Reply::Integer(n) => n.to_string(),
            Reply::Bulk(None) | Reply::Array(None) => "nil".to_owned(),
            Reply::Array(Some(items)) => {
                let items: Vec<String> = items.iter().map(Reply::describe).collect();
                format!("[{}]", items.join(", "))
            }
        }
    }
}

/// Whether `server` runs and is not paused: whether it can be asked anything.
fn answers(server: &RedisServer) -> bool {
    server.child.is_some() && !server.paused
}

/// Polls `check` every [`POLL`] until it gives `Ok`, and returns that; panics after `within`
/// with `what` and the last `Err` (what was still missing).
fn wait_for<T>(within: Duration, what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(done) => return done,
            Err(missing) if Instant::now() >= deadline => {
                panic!("{what}: not done after {within:?}: {missing}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ClusterNode {
    id: String,
    port: u16,
    primary: bool,
    /// Flagged `fail` (not only `fail?`) by the node asked.
    failed: bool,
    /// The id of its primary, for a replica.
    primary_id: Option<String>,
    /// The slot ranges it serves, inclusive.
    slots: Vec<(u16, u16)>,
}

/// Parses a `CLUSTER NODES` reply:
/// `<id> <ip:port@cport[,hostname]> <flags> <primary|-> <ping> <pong> <epoch> <link> <slot>...`.
fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let port = fields[1].split_once(':')?.1.split(['@', ',']).next()?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                // `[slot->-id]` / `[slot-<-id]` mark a migration, not a slot served.
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| {
                    let (first, last) = range.split_once('-').unwrap_or((range, range));
                    Some((first.parse().ok()?, last.parse().ok()?))
                })
                .collect();
            Some(ClusterNode {
                id: fields[0].to_owned(),
                port: port.parse().ok()?,
                primary: flags.contains(&"master"),
                failed: flags.contains(&"fail"),
                primary_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// A Redis Cluster of real `redis-server` processes (cluster mode), created with
/// `redis-cli --cluster create`.
///
/// Nodes have indices `0..node_count()`; which of them are primaries is decided by `redis-cli`
/// and changes on failover, so ask [`RedisCluster::primary_of_slot`]. Nodes run with
/// `cluster-node-timeout 500` and `cluster-replica-validity-factor 0` (a replica may always take
/// over), each on its own free data port and free cluster-bus port.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's `cluster-config-file`, removed on drop.
    config_files: Vec<PathBuf>,
    primaries: usize,
}

impl RedisCluster {
    /// Starts `primaries * (1 + replicas_per_primary)` nodes, creates the cluster, and waits
    /// until every node says `cluster_state:ok` and agrees on the slot map and on who replicates
    /// whom, and every replica's link to its primary is up.
    ///
    /// # Panics
    /// With fewer than 3 primaries (`redis-cli` refuses them), when a node does not start, when
    /// `redis-cli --cluster create` fails (its output is in the message), or when the cluster is
    /// not ready within 20 s.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Self {
        assert!(primaries >= 3, "a cluster needs at least 3 primaries");
        let count = primaries * (1 + replicas_per_primary);
        let mut cluster = Self {
            nodes: Vec::with_capacity(count),
            config_files: Vec::with_capacity(count),
            primaries,
        };
        for _ in 0..count {
            let node = (0..10).find_map(|_| {
                // The bus port is free too, rather than the default data port + 10000, which
                // may be taken or (for a data port above 55535) out of range. Another test's
                // server may take it before this node binds it: then a new one is chosen.
                let bus_port = free_port();
                let config_file = unique_temp_file("cluster", bus_port);
                // Kept first, so the file is removed on drop even if the node fails to start.
                cluster.config_files.push(config_file.clone());
                RedisServer::try_start_with(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &config_file.to_string_lossy(),
                        "--cluster-port",
                        &bus_port.to_string(),
                        "--cluster-node-timeout",
                        "500",
                        "--cluster-replica-validity-factor",
                        "0",
                    ],
                    3,
                )
            });
            cluster
                .nodes
                .push(node.expect("could not start a cluster node on free ports"));
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas_per_primary.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli: is it installed and on PATH?");
        assert!(
            output.status.success(),
            "redis-cli --cluster create {} failed ({}):\n{}{}",
            addresses.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        wait_for(STARTUP, "cluster startup", || cluster.check_settled(true));
        cluster
    }

    /// `redis://127.0.0.1:PORT` of every node (primaries and replicas, in index order), as
    /// started: a node killed since is still listed, as a client's seed list would.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// How many nodes the cluster has (primaries and replicas, live or not).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, to kill, pause or restart it. A restarted node reloads its cluster config file
    /// and rejoins (as a replica, if its slots were taken over meanwhile).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, asked of a live node).
    ///
    /// # Panics
    /// When no node answers.
    pub fn slot_of(&self, key: &str) -> u16 {
        let reply = self.ask_any(&["CLUSTER", "KEYSLOT", key]);
        match reply {
            Reply::Integer(slot) => u16::try_from(slot).expect("a slot fits in u16"),
            other => panic!("CLUSTER KEYSLOT {key}: {}", other.describe()),
        }
    }

    /// The index of the node serving `slot` as primary, in the view of the first node that
    /// answers (during a failover, views may differ for a moment; see
    /// [`RedisCluster::wait_for_failover`]). A primary that died may still be named until the
    /// failover is done.
    ///
    /// # Panics
    /// When no node answers, or the answer names no node of this cluster.
    pub fn primary_of_slot(&self, slot: u16) -> usize {
        let (_, view) = self
            .live_indices()
            .find_map(|i| Some((i, self.cluster_nodes(i)?)))
            .expect("no cluster node answers CLUSTER NODES");
        let owner = view
            .iter()
            .find(|node| node.primary && covers(&node.slots, slot))
            .unwrap_or_else(|| panic!("no primary serves slot {slot}: {view:?}"));
        self.index_of_port(owner.port)
            .unwrap_or_else(|| panic!("slot {slot} is served by unknown port {}", owner.port))
    }

    /// The index of the primary serving `key`.
    pub fn primary_of(&self, key: &str) -> usize {
        self.primary_of_slot(self.slot_of(key))
    }

    /// Kills (SIGKILL) the primary serving `key`, and returns its index. Its replica takes over
    /// after about 1.5 s: see [`RedisCluster::wait_for_failover`].
    pub fn kill_primary_of(&mut self, key: &str) -> usize {
        let i = self.primary_of(key);
        self.nodes[i].kill();
        i
    }

    /// Pauses (SIGSTOP) the primary serving `key`, and returns its index. Paused for longer
    /// than the node timeout (500 ms), it is failed over like a dead one, and becomes a replica
    /// once resumed.
    pub fn pause_primary_of(&mut self, key: &str) -> usize {
        let i = self.primary_of(key);
        self.nodes[i].pause();
        i
    }

    /// Resumes (SIGCONT) node `i` after a pause.
    pub fn resume(&mut self, i: usize) {
        self.nodes[i].resume();
    }

    /// Waits until a node that runs (and is not paused) serves `slot` as primary in the view of
    /// every such node, and all of them say `cluster_state:ok`; returns its index. Call it after
    /// killing or pausing the slot's primary.
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_for_failover(&self, slot: u16, within: Duration) -> usize {
        wait_for(within, &format!("failover of slot {slot}"), || {
            let mut owner = None;
            for i in self.live_indices() {
                let info = self.ask_text(i, &["CLUSTER", "INFO"])?;
                if !info.contains("cluster_state:ok") {
                    return Err(format!("node {i} is not cluster_state:ok"));
                }
                let view = self
                    .cluster_nodes(i)
                    .ok_or(format!("node {i} did not answer CLUSTER NODES"))?;
                let port = view
                    .iter()
                    .find(|node| node.primary && !node.failed && covers(&node.slots, slot))
                    .map(|node| node.port)
                    .ok_or(format!("node {i} sees no primary for slot {slot}"))?;
                let serving = self
                    .index_of_port(port)
                    .filter(|&j| answers(&self.nodes[j]))
                    .ok_or(format!(
                        "node {i} says port {port}, which is down, serves it"
                    ))?;
                match owner {
                    Some(j) if j != serving => {
                        return Err(format!("nodes disagree: {j} or {serving} serves it"))
                    }
                    _ => owner = Some(serving),
                }
            }
            owner.ok_or_else(|| "no node answers".to_owned())
        })
    }

    /// The cluster id of node `i` (`CLUSTER MYID`).
    ///
    /// # Panics
    /// When the node does not answer.
    pub fn node_id(&self, i: usize) -> String {
        self.ask_text(i, &["CLUSTER", "MYID"])
            .unwrap_or_else(|e| panic!("CLUSTER MYID: {e}"))
    }

    /// A running replica of the primary at index `primary`, in the view of that primary.
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        let id = self.node_id(primary);
        let view = self.cluster_nodes(primary)?;
        view.iter()
            .filter(|node| node.primary_id.as_deref() == Some(id.as_str()))
            .filter_map(|node| self.index_of_port(node.port))
            .find(|&i| answers(&self.nodes[i]))
    }

    /// Moves `slot` to the primary at index `to`, keys and all, the way `redis-cli --cluster
    /// reshard` does: `IMPORTING` on the new owner, `MIGRATING` on the old one, `MIGRATE` of
    /// its keys until none is left (clients meanwhile get `ASK` and `TRYAGAIN`), then
    /// `SETSLOT NODE` on every node. A no-op when `to` serves the slot already.
    ///
    /// # Panics
    /// When a step is refused.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        let from = self.primary_of_slot(slot);
        if from == to {
            return;
        }
        let (slot, from_id, to_id) = (slot.to_string(), self.node_id(from), self.node_id(to));
        let step = |i: usize, args: &[&str]| {
            let reply = query(self.nodes[i].port(), args);
            assert!(
                matches!(&reply, Some(Reply::Simple(ok)) if ok == "OK"),
                "{args:?} on node {i}: {:?}",
                reply.map(|r| r.describe())
            );
        };
        step(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
        step(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
        let port = self.nodes[to].port().to_string();
        loop {
            let keys = query(
                self.nodes[from].port(),
                &["CLUSTER", "GETKEYSINSLOT", &slot, "100"],
            )
            .expect("CLUSTER GETKEYSINSLOT");
            let keys: Vec<&str> = keys.items().iter().filter_map(Reply::text).collect();
            if keys.is_empty() {
                break;
            }
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            migrate.extend(keys);
            let reply = query(self.nodes[from].port(), &migrate);
            // NOKEY: they expired meanwhile.
            assert!(
                matches!(&reply, Some(Reply::Simple(ok)) if ok == "OK" || ok == "NOKEY"),
                "MIGRATE: {:?}",
                reply.map(|r| r.describe())
            );
        }
        step(to, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        step(from, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        for i in self.live_indices().filter(|&i| i != to && i != from) {
            // A replica refuses SETSLOT: it learns the move from its primary.
            let _ = query(
                self.nodes[i].port(),
                &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id],
            );
        }
    }

    /// Waits until the cluster has settled after a change (a failover, a restarted node
    /// rejoining): every node that runs says `cluster_state:ok`, all of them agree on which
    /// running primary serves each of the 16384 slots and on who replicates whom, and every
    /// running replica's link to its primary is up.
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_until_settled(&self, within: Duration) {
        wait_for(within, "cluster settling", || self.check_settled(false));
    }

    /// Indices of the nodes that can be asked (running, not paused).
    fn live_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| answers(&self.nodes[i]))
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|node| node.port() == port)
    }

    /// The first answer of a live node to `args`.
    fn ask_any(&self, args: &[&str]) -> Reply {
        self.live_indices()
            .find_map(|i| query(self.nodes[i].port(), args))
            .unwrap_or_else(|| panic!("no cluster node answers {args:?}"))
    }

    /// The text node `i` answers to `args`.
    fn ask_text(&self, i: usize, args: &[&str]) -> Result<String, String> {
        match query(self.nodes[i].port(), args) {
            Some(Reply::Bulk(Some(text)) | Reply::Simple(text)) => Ok(text),
            Some(other) => Err(format!("node {i}: {args:?}: {}", other.describe())),
            None => Err(format!("node {i} does not answer {args:?}")),
        }
    }

    /// `CLUSTER NODES` as node `i` sees it.
    fn cluster_nodes(&self, i: usize) -> Option<Vec<ClusterNode>> {
        let text = self.ask_text(i, &["CLUSTER", "NODES"]).ok()?;
        Some(parse_cluster_nodes(&text))
    }

    /// `Ok` once the live nodes agree (see [`RedisCluster::wait_until_settled`]); at startup
    /// (`complete`), also every node must be in it with the expected number of primaries.
    fn check_settled(&self, complete: bool) -> Result<(), String> {
        let live: Vec<usize> = self.live_indices().collect();
        let live_ports: Vec<u16> = live.iter().map(|&i| self.nodes[i].port()).collect();
        let mut agreed: Option<(usize, Vec<NodeRole>)> = None;
        for &i in &live {
            let info = self.ask_text(i, &["CLUSTER", "INFO"])?;
            if !info.contains("cluster_state:ok") {
                return Err(format!("node {i} is not cluster_state:ok"));
            }
            let view = self
                .cluster_nodes(i)
                .ok_or(format!("node {i} does not answer CLUSTER NODES"))?;
            let port_of_id: HashMap<&str, u16> = view
                .iter()
                .map(|node| (node.id.as_str(), node.port))
                .collect();
            // Who serves what and who replicates whom, among the nodes that run.
            let mut roles: Vec<NodeRole> = view
                .iter()
                .filter(|node| live_ports.contains(&node.port))
                .map(|node| NodeRole {
                    port: node.port,
                    primary_port: match (&node.primary_id, node.primary) {
                        (Some(id), false) => {
                            Some(port_of_id.get(id.as_str()).copied().unwrap_or(0))
                        }
                        _ => None,
                    },
                    slots: node.slots.clone(),
                })
                .collect();
            roles.sort();
            if roles.len() != live.len() {
                return Err(format!("node {i} knows {} of the live nodes", roles.len()));
            }
            let served: usize = roles
                .iter()
                .filter(|role| role.primary_port.is_none())
                .flat_map(|role| &role.slots)
                .map(|&(first, last)| usize::from(last) + 1 - usize::from(first))
                .sum();
            if served != 16384 {
                return Err(format!("node {i} sees {served} slots served by live nodes"));
            }
            if complete {
                let primaries = roles.iter().filter(|r| r.primary_port.is_none()).count();
                if primaries != self.primaries {
                    return Err(format!("node {i} sees {primaries} primaries"));
                }
            }
            let myself = roles.iter().find(|role| role.port == self.nodes[i].port());
            if myself.is_some_and(|role| role.primary_port.is_some()) {
                let replication = self.ask_text(i, &["INFO", "replication"])?;
                if !replication.contains("master_link_status:up") {
                    return Err(format!("replica {i} is not in sync with its primary"));
                }
            }
            match &agreed {
                Some((j, first)) if *first != roles => {
                    return Err(format!("nodes {j} and {i} disagree: {first:?} / {roles:?}"))
                }
                Some(_) => {}
                None => agreed = Some((i, roles)),
            }
        }
        if complete && live.len() != self.nodes.len() {
            return Err("not every node runs".to_owned());
        }
        agreed
            .map(|_| ())
            .ok_or_else(|| "no node answers".to_owned())
    }
}

/// A node's place in the cluster, as one node sees it: what the others must agree on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct NodeRole {
    port: u16,
    /// The port of its primary, for a replica.
    primary_port: Option<u16>,
    /// The slot ranges it serves, for a primary.
    slots: Vec<(u16, u16)>,
}

/// Whether `slot` is in one of the inclusive `ranges`.
fn covers(ranges: &[(u16, u16)], slot: u16) -> bool {
    ranges
        .iter()
        .any(|&(first, last)| (first..=last).contains(&slot))
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        // Stops every node (by pid) before their files go.
        self.nodes.clear();
        for file in &self.config_files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A `redis-server --sentinel` process owned by a [`SentinelGroup`].
struct Sentinel {
    child: Child,
    port: u16,
    /// Its config file, which it rewrites as it learns; removed on drop.
    config_file: PathBuf,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config_file);
    }
}

/// A primary, its replicas and the sentinels that watch them (`down-after-milliseconds 500`,
/// `failover-timeout 3000`, quorum a majority of the sentinels), under the name
/// [`SentinelGroup::master_name`].
///
/// Data servers have indices `0..server_count()`: 0 is the first primary, the replicas follow;
/// [`SentinelGroup::primary_index`] says which is the primary now. Each sentinel is started
/// already knowing the replicas and the other sentinels (ids chosen here), and pings every
/// 100 ms rather than every second, so the group is ready in about 0.3 s (not the 2 s it takes
/// sentinels to discover each other) and a killed primary is replaced in about 2 s.
pub struct SentinelGroup {
    /// Declared first so they are stopped first: no sentinel reacts to the servers going.
    sentinels: Vec<Sentinel>,
    servers: Vec<RedisServer>,
}

/// The name the sentinels monitor the primary under.
const MASTER_NAME: &str = "distlock-test";

impl SentinelGroup {
    /// Starts a primary, `replicas` replicas of it (synced), and `sentinels` sentinels, and
    /// waits until every sentinel has reached the primary, every replica and every other
    /// sentinel, so that a failover can happen at once.
    ///
    /// # Panics
    /// With no sentinel, when a process does not start, or when the group is not ready within
    /// 20 s.
    pub fn start(replicas: usize, sentinels: usize) -> Self {
        assert!(sentinels >= 1, "a sentinel group needs a sentinel");
        let primary = RedisServer::start();
        let mut servers = vec![];
        for _ in 0..replicas {
            let replica = RedisServer::start_replica_of(&primary);
            servers.push(replica);
        }
        servers.insert(0, primary);
        let mut group = Self {
            sentinels: Vec::with_capacity(sentinels),
            servers,
        };
        group.sentinels = (0..20)
            .find_map(|_| group.spawn_sentinels(sentinels))
            .expect("could not start the sentinels on free ports");
        group.shorten_ping_period();
        wait_for(STARTUP, "sentinel group startup", || group.check_ready());
        group
    }

    /// The name the sentinels know the primary by (`SENTINEL GET-MASTER-ADDR-BY-NAME <name>`).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// `redis://127.0.0.1:PORT` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| format!("redis://127.0.0.1:{}", sentinel.port))
            .collect()
    }

    /// The port of the primary, as the first sentinel that answers names it.
    ///
    /// # Panics
    /// When no sentinel answers with an address.
    pub fn primary_port(&self) -> u16 {
        self.sentinels
            .iter()
            .find_map(|sentinel| self.named_primary(sentinel.port))
            .expect("no sentinel names a primary")
    }

    /// The index of the data server the sentinels name as primary.
    ///
    /// # Panics
    /// When no sentinel answers, or it names a server not of this group.
    pub fn primary_index(&self) -> usize {
        let port = self.primary_port();
        self.index_of_port(port)
            .unwrap_or_else(|| panic!("the sentinels name unknown port {port}"))
    }

    /// How many data servers (primary and replicas) the group has.
    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// Data server `i`.
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// Data server `i`, to kill, pause or restart it. A restarted server is empty and starts
    /// with its first arguments (a replica of the first primary, or a primary); the sentinels
    /// make it a replica of the current primary within about 10 s.
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// Kills every sentinel and starts each again on its port with the config it rewrote (what
    /// it knew of the primary, the replicas and its peers), and waits until the group is ready.
    ///
    /// # Panics
    /// When a sentinel does not come back, or the group is not ready within 20 s.
    pub fn restart_sentinels(&mut self) {
        for sentinel in &mut self.sentinels {
            let _ = sentinel.child.kill();
            let _ = sentinel.child.wait();
        }
        for sentinel in &mut self.sentinels {
            let child = Command::new("redis-server")
                .arg(&sentinel.config_file)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server --sentinel");
            sentinel.child = ours_when_up(child, sentinel.port)
                .unwrap_or_else(|| panic!("sentinel did not restart on {}", sentinel.port));
        }
        self.shorten_ping_period();
        wait_for(STARTUP, "sentinels restarted", || self.check_ready());
    }

    /// Kills (SIGKILL) the current primary and returns its index. The sentinels replace it after
    /// about 2 s: see [`SentinelGroup::wait_for_new_primary`].
    pub fn kill_primary(&mut self) -> usize {
        let i = self.primary_index();
        self.servers[i].kill();
        i
    }

    /// Stops sentinel `i` (in [`SentinelGroup::sentinel_urls`] order) with SIGSTOP: its
    /// connections stay open, new ones are accepted by the kernel, nothing is answered (a hung
    /// sentinel). While it is paused, the group's own queries that ask it first
    /// ([`SentinelGroup::primary_port`] and those built on it) wait 2 s for it.
    pub fn pause_sentinel(&self, i: usize) {
        send_signal(self.sentinels[i].child.id(), "STOP");
    }

    /// Continues sentinel `i` after [`SentinelGroup::pause_sentinel`].
    pub fn resume_sentinel(&self, i: usize) {
        send_signal(self.sentinels[i].child.id(), "CONT");
    }

    /// Asks a sentinel for a failover (`SENTINEL FAILOVER`, no agreement needed) and returns the
    /// port of the primary it replaces. The old primary stays up; the sentinels make it a
    /// replica of the new one some 10 s after the switch (until then both say `role:master`:
    /// see [`SentinelGroup::wait_until_replicas_follow`]).
    ///
    /// # Panics
    /// When no sentinel accepts within 10 s (one refuses while an earlier failover is still in
    /// progress, and until it has fresh news of a replica to promote).
    pub fn failover(&self) -> u16 {
        let old_port = self.primary_port();
        wait_for(Duration::from_secs(10), "SENTINEL FAILOVER", || {
            let mut refusals = vec![];
            for sentinel in &self.sentinels {
                match query(sentinel.port, &["SENTINEL", "FAILOVER", MASTER_NAME]) {
                    Some(Reply::Simple(ok)) if ok == "OK" => return Ok(old_port),
                    Some(other) => refusals.push(other.describe()),
                    None => refusals.push("no answer".to_owned()),
                }
            }
            Err(refusals.join("; "))
        })
    }

    /// Waits until every sentinel names a primary other than `old_port`, the same one, and that
    /// server says `role:master`; returns its port.
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_for_new_primary(&self, old_port: u16, within: Duration) -> u16 {
        wait_for(within, &format!("a primary other than {old_port}"), || {
            let mut named = None;
            for sentinel in &self.sentinels {
                let port = self
                    .named_primary(sentinel.port)
                    .ok_or(format!("sentinel {} does not answer", sentinel.port))?;
                if port == old_port {
                    return Err(format!("sentinel {} still names {port}", sentinel.port));
                }
                match named {
                    Some(other) if other != port => {
                        return Err(format!("sentinels name {other} and {port}"))
                    }
                    _ => named = Some(port),
                }
            }
            let port = named.ok_or("no sentinel")?;
            let replication = resp_command(port, &["INFO", "replication"]).unwrap_or_default();
            if replication.contains("role:master") {
                Ok(port)
            } else {
                Err(format!("{port} does not say role:master yet"))
            }
        })
    }

    /// Waits until every data server that runs (and is not paused), other than the primary the
    /// sentinels name, says `role:slave` with that primary and its link up. After
    /// [`SentinelGroup::failover`] this is how long two servers say `role:master`.
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_until_replicas_follow(&self, within: Duration) {
        wait_for(within, "replicas following the new primary", || {
            let primary = self.primary_port();
            let master_port = format!("master_port:{primary}\r\n");
            for server in self.servers.iter().filter(|server| answers(server)) {
                if server.port() == primary {
                    continue;
                }
                let replication = resp_command(server.port(), &["INFO", "replication"])
                    .map_err(|e| format!("{}: {e}", server.port()))?;
                if !(replication.contains("role:slave")
                    && replication.contains(&master_port)
                    && replication.contains("master_link_status:up"))
                {
                    return Err(format!("{} does not follow {primary} yet", server.port()));
                }
            }
            Ok(())
        });
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.servers.iter().position(|server| server.port() == port)
    }

    /// The primary's port as the sentinel on `port` names it.
    fn named_primary(&self, port: u16) -> Option<u16> {
        let reply = query(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])?;
        reply.items().get(1)?.text()?.parse().ok()
    }

    /// Writes the configs of `count` sentinels on fresh free ports and starts them; `None` (the
    /// ones started stopped again) if one does not come up, a port having been taken meanwhile.
    ///
    /// Each config names the replicas and the other sentinels (with ids chosen here), so no
    /// sentinel has to wait for hellos (every 2 s) to discover them.
    fn spawn_sentinels(&self, count: usize) -> Option<Vec<Sentinel>> {
        let mut ports: Vec<u16> = vec![];
        while ports.len() < count {
            let port = free_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let ids: Vec<String> = ports.iter().map(|_| random_id()).collect();
        let primary = self.servers[0].port();
        let quorum = count / 2 + 1;
        let mut spawned = vec![];
        for (me, &port) in ports.iter().enumerate() {
            let mut config = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 dir {dir}\n\
                 sentinel myid {id}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} {quorum}\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 500\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = std::env::temp_dir().display(),
                id = ids[me],
            );
            for replica in &self.servers[1..] {
                let replica = replica.port();
                config.push_str(&format!(
                    "sentinel known-replica {MASTER_NAME} 127.0.0.1 {replica}\n"
                ));
            }
            for (other, &other_port) in ports.iter().enumerate().filter(|&(i, _)| i != me) {
                let id = &ids[other];
                config.push_str(&format!(
                    "sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {other_port} {id}\n"
                ));
            }
            let config_file = unique_temp_file("sentinel", port);
            std::fs::write(&config_file, config).expect("write a sentinel config file");
            let child = Command::new("redis-server")
                .arg(&config_file)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server --sentinel");
            spawned.push((child, port, config_file));
        }
        let mut started = vec![];
        let mut all_up = true;
        for (child, port, config_file) in spawned {
            match ours_when_up(child, port) {
                Some(child) => started.push(Sentinel {
                    child,
                    port,
                    config_file,
                }),
                None => {
                    all_up = false;
                    let _ = std::fs::remove_file(&config_file);
                }
            }
        }
        // If not, `started` is dropped: those sentinels are stopped.
        all_up.then_some(started)
    }

    /// Makes every sentinel ping (and retry a connection) every 100 ms instead of every second
    /// (`SENTINEL DEBUG PING-PERIOD`, which has no config-file form).
    ///
    /// A sentinel tries to (re)connect to an instance at most once a ping period. With the
    /// default second, a sentinel started before a peer listened reaches it only a second later
    /// (the group is ready after 1.1 s instead of 0.2 s); and a primary killed within a second
    /// of the sentinels connecting is marked down, then (when the delayed reconnection attempt
    /// restarts the down-after clock) up again and down 500 ms later, so it is replaced about
    /// 0.6 s later than one killed after a quiet second (2.6 s instead of 2 s, measured).
    fn shorten_ping_period(&self) {
        for sentinel in &self.sentinels {
            let reply = query(sentinel.port, &["SENTINEL", "DEBUG", "PING-PERIOD", "100"]);
            assert_eq!(
                reply,
                Some(Reply::Simple("OK".to_owned())),
                "SENTINEL DEBUG PING-PERIOD 100 on sentinel {}",
                sentinel.port
            );
        }
    }

    /// `Ok` once every sentinel has reached the primary, has news of every replica (their
    /// `INFO`, which a failover needs) and is linked to every other sentinel.
    fn check_ready(&self) -> Result<(), String> {
        let replicas = self.servers.len() - 1;
        let others = self.sentinels.len() - 1;
        for sentinel in &self.sentinels {
            let port = sentinel.port;
            let ask = |what: &str| {
                query(port, &["SENTINEL", what, MASTER_NAME])
                    .ok_or(format!("sentinel {port} does not answer SENTINEL {what}"))
            };
            let master = ask("MASTER")?.fields();
            let field = |name: &str| master.get(name).map_or("", String::as_str);
            if field("flags") != "master" || field("role-reported") != "master" {
                return Err(format!(
                    "sentinel {port} has not reached the primary: {master:?}"
                ));
            }
            let known = ask("REPLICAS")?;
            let ready = known
                .items()
                .iter()
                .map(Reply::fields)
                .filter(|replica| {
                    replica.get("flags").is_some_and(|flags| flags == "slave")
                        && replica
                            .get("master-link-status")
                            .is_some_and(|status| status == "ok")
                })
                .count();
            if ready != replicas {
                return Err(format!(
                    "sentinel {port} has news of {ready} of {replicas} replicas"
                ));
            }
            let peers = ask("SENTINELS")?;
            let linked = peers
                .items()
                .iter()
                .map(Reply::fields)
                .filter(|peer| peer.get("flags").is_some_and(|flags| flags == "sentinel"))
                .count();
            if linked != others {
                return Err(format!(
                    "sentinel {port} is linked to {linked} of {others} others"
                ));
            }
        }
        Ok(())
    }
}

/// 40 random hex digits: a sentinel id.
fn random_id() -> String {
    let part = || {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(Instant::now().elapsed().as_nanos());
        hasher.finish()
    };
    format!("{:016x}{:016x}{:08x}", part(), part(), part() as u32)
}

/// `n` independent servers, for a quorum of locks across them.
pub struct QuorumSet {
    servers: Vec<RedisServer>,
}

impl QuorumSet {
    /// Starts `n` servers.
    ///
    /// # Panics
    /// When one does not start.
    pub fn start(n: usize) -> Self {
        Self {
            servers: (0..n).map(|_| RedisServer::start()).collect(),
        }
    }

    /// `redis://127.0.0.1:PORT` of every server, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// Server `i`.
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// Server `i`, to kill, pause or restart it.
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_replies_are_complete_only_with_their_last_element() {
        let whole = b"*2\r\n*2\r\n$4\r\nname\r\n$1\r\nx\r\n*1\r\n:7\r\n";
        for cut in 0..whole.len() {
            assert_eq!(parse_reply(&whole[..cut]), None, "complete at {cut} bytes");
        }
        let (reply, len) = parse_reply(whole).expect("complete");
        assert_eq!(len, whole.len());
        assert_eq!(reply.items()[0].fields()["name"], "x");
        assert_eq!(reply.items()[1].items(), [Reply::Integer(7)]);
        assert_eq!(parse_reply(b"$-1\r\n"), Some((Reply::Bulk(None), 5)));
        assert_eq!(
            parse_reply(b"\r\n"),
            Some((Reply::Simple(String::new()), 2))
        );
        assert_eq!(
            parse_reply(b"-ERR no\r\n"),
            Some((Reply::Error("ERR no".to_owned()), 9))
        );
    }

    #[test]
    fn cluster_nodes_lines_give_ports_roles_and_slots() {
        let text = "\
a1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-b2]\n\
b2 127.0.0.1:30002@40002,host master,fail - 0 0 2 disconnected\n\
c3 127.0.0.1:30003@40003 slave a1 0 0 1 connected\n";
        let nodes = parse_cluster_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].port, 30001);
        assert!(nodes[0].primary && !nodes[0].failed);
        assert_eq!(nodes[0].slots, [(0, 5460), (7000, 7000)]);
        assert!(covers(&nodes[0].slots, 7000) && !covers(&nodes[0].slots, 5461));
        assert!(nodes[1].primary && nodes[1].failed && nodes[1].slots.is_empty());
        assert_eq!(nodes[2].primary_id.as_deref(), Some("a1"));
        assert!(!nodes[2].primary);
    }
}
