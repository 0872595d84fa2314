//! A Redis Cluster of throwaway servers, created with `redis-cli --cluster create`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::program::{cli_beside, run_error, shown};
use super::resp::{query, Reply};
use super::server::{build, with_test_timeouts};
use super::{free_port_or_error, off_the_runtime, unique_temp_file, wait_for};
use super::{TestRedis, TestRedisError};
use crate::{LockManager, LockManagerBuilder};

/// How long a startup may take.
const STARTUP: Duration = Duration::from_secs(20);

/// How often the waits look again.
const POLL: Duration = Duration::from_millis(10);

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

/// A Redis Cluster of throwaway `redis-server` processes (cluster mode), created with
/// `redis-cli --cluster create`, stopped (with their files removed) when dropped.
///
/// Nodes have indices `0..node_count()`; which of them are primaries is decided by `redis-cli`
/// and changes on failover, so ask [`TestCluster::primary_of`]. Nodes run with
/// `cluster-node-timeout 500` and `cluster-replica-validity-factor 0` (a replica may always take
/// over), so a synced replica takes over 1.5 to 2 s after its primary died; each has its own
/// free data port and free cluster-bus port. Startup takes about 2 s (a new primary refuses to
/// say `cluster_state:ok` for its first 2 s).
///
/// ```no_run
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use distlock_runtime::testing::TestCluster;
///
/// let mut cluster = TestCluster::start(3, 1).await?;
/// let locks = cluster.manager();
/// locks.lock("order:42").run(async {}).await?;
///
/// // The primary of the key dies; its replica takes over (the wait blocks this thread).
/// cluster.kill_primary_of("order:42")?;
/// let slot = cluster.slot_of("order:42");
/// cluster.wait_for_failover(slot, Duration::from_secs(10))?;
/// locks.lock("order:42").run(async {}).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestCluster {
    nodes: Vec<TestRedis>,
    /// Each node's `cluster-config-file`, removed on drop.
    config_files: Vec<PathBuf>,
    primaries: usize,
}

impl TestCluster {
    /// Starts `primaries * (1 + replicas_per_primary)` nodes, creates the cluster, and waits
    /// until every node says `cluster_state:ok` and agrees on the slot map and on who replicates
    /// whom, and every replica's link to its primary is up; the waiting is done off the async
    /// runtime's threads.
    ///
    /// # Errors
    /// As [`start_blocking`](Self::start_blocking).
    pub async fn start(
        primaries: usize,
        replicas_per_primary: usize,
    ) -> Result<Self, TestRedisError> {
        off_the_runtime(move || Self::start_blocking(primaries, replicas_per_primary)).await
    }

    /// [`start`](Self::start), blocking the calling thread meanwhile.
    ///
    /// # Errors
    /// [`TestRedisError::Refused`] with fewer than 3 primaries (`redis-cli` refuses them) or
    /// when `redis-cli --cluster create` fails (its output is in the message); those of
    /// [`TestRedis::start`] when a node does not start, and [`TestRedisError::NotInstalled`]
    /// without `redis-cli`; [`TestRedisError::NotReady`] when the cluster is not ready within
    /// 20 s.
    pub fn start_blocking(
        primaries: usize,
        replicas_per_primary: usize,
    ) -> Result<Self, TestRedisError> {
        if primaries < 3 {
            return Err(TestRedisError::Refused {
                step: format!("a cluster of {primaries} primaries"),
                reason: "a cluster needs at least 3 primaries".to_owned(),
            });
        }
        let count = primaries * (1 + replicas_per_primary);
        let mut cluster = Self {
            nodes: Vec::with_capacity(count),
            config_files: Vec::with_capacity(count),
            primaries,
        };
        for _ in 0..count {
            let node = cluster.start_node()?;
            cluster.nodes.push(node);
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let cli = cli_beside(cluster.nodes[0].program());
        let output = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas_per_primary.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| run_error(&cli, e))?;
        if !output.status.success() {
            return Err(TestRedisError::Refused {
                step: format!("{} --cluster create {}", shown(&cli), addresses.join(" ")),
                reason: format!(
                    "{}:\n{}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ),
            });
        }
        wait_for(STARTUP, "cluster startup", POLL, || {
            cluster.check_settled(true)
        })?;
        Ok(cluster)
    }

    /// Starts one more node on a free data port and a free bus port, trying new ports a few
    /// times.
    fn start_node(&mut self) -> Result<TestRedis, TestRedisError> {
        let mut last = None;
        for _ in 0..10 {
            // The bus port is free too, rather than the default data port + 10000, which may be
            // taken or (for a data port above 55535) out of range. Another test's server may
            // take it before this node binds it: then a new one is chosen.
            let bus_port = free_port_or_error()?;
            let config_file = unique_temp_file("cluster", bus_port);
            // Kept first, so the file is removed on drop even if the node fails to start.
            self.config_files.push(config_file.clone());
            let started = TestRedis::builder()
                .arg("--cluster-enabled")
                .arg("yes")
                .arg("--cluster-config-file")
                .arg(&config_file)
                .args(["--cluster-port", &bus_port.to_string()])
                .args(["--cluster-node-timeout", "500"])
                .args(["--cluster-replica-validity-factor", "0"])
                .tries(3)
                .start_blocking();
            match started {
                Err(e @ TestRedisError::Startup { .. }) => last = Some(e),
                other => return other,
            }
        }
        Err(last.expect("tried at least once"))
    }

    /// `redis://127.0.0.1:PORT` of every node (primaries and replicas, in index order), as
    /// started: a node killed since is still listed, as a client's seed list would.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(TestRedis::url).collect()
    }

    /// A manager for the cluster (seeded with every node), with 2 s timeouts like
    /// [`TestRedis::manager`]'s.
    ///
    /// # Panics
    /// Never in practice: the builder of [`manager_builder`](Self::manager_builder) is valid.
    pub fn manager(&self) -> LockManager {
        build(self.manager_builder())
    }

    /// The builder behind [`manager`](Self::manager), to adjust before building.
    pub fn manager_builder(&self) -> LockManagerBuilder {
        with_test_timeouts(LockManager::builder().cluster(self.seed_urls()))
    }

    /// How many nodes the cluster has (primaries and replicas, live or not).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`.
    ///
    /// # Panics
    /// When `i` is not below [`node_count`](Self::node_count).
    pub fn node(&self, i: usize) -> &TestRedis {
        &self.nodes[i]
    }

    /// Node `i`, to kill, pause or restart it. A restarted node reloads its cluster config file
    /// and rejoins (as a replica, if its slots were taken over meanwhile).
    ///
    /// # Panics
    /// When `i` is not below [`node_count`](Self::node_count).
    pub fn node_mut(&mut self, i: usize) -> &mut TestRedis {
        &mut self.nodes[i]
    }

    /// The hash slot of `key`, as a cluster computes it (CRC16 of its hash tag, or of the
    /// whole key without one).
    pub fn slot_of(&self, key: &str) -> u16 {
        crate::topology::cluster::slot(key)
    }

    /// The index of the node serving `slot` as primary, in the view of the first node that
    /// answers (during a failover, views may differ for a moment; see
    /// [`TestCluster::wait_for_failover`]). A primary that died may still be named until the
    /// failover is done.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] when no node answers, or the answer names no node of this
    /// cluster for the slot.
    pub fn primary_of_slot(&self, slot: u16) -> Result<usize, TestRedisError> {
        let not_ready = |missing: String| TestRedisError::NotReady {
            what: format!("the primary of slot {slot}"),
            within: Duration::ZERO,
            missing,
        };
        let view = self
            .live_indices()
            .find_map(|i| self.cluster_nodes(i))
            .ok_or_else(|| not_ready("no node answers CLUSTER NODES".to_owned()))?;
        let owner = view
            .iter()
            .find(|node| node.primary && covers(&node.slots, slot))
            .ok_or_else(|| not_ready(format!("no primary serves it: {view:?}")))?;
        self.index_of_port(owner.port)
            .ok_or_else(|| not_ready(format!("it is served by unknown port {}", owner.port)))
    }

    /// The index of the primary serving `key`.
    ///
    /// # Errors
    /// As [`primary_of_slot`](Self::primary_of_slot).
    pub fn primary_of(&self, key: &str) -> Result<usize, TestRedisError> {
        self.primary_of_slot(self.slot_of(key))
    }

    /// Kills (`SIGKILL`) the primary serving `key`, and returns its index. Its replica takes
    /// over after about 1.5 s: see [`TestCluster::wait_for_failover`].
    ///
    /// # Errors
    /// As [`primary_of`](Self::primary_of).
    pub fn kill_primary_of(&mut self, key: &str) -> Result<usize, TestRedisError> {
        let i = self.primary_of(key)?;
        self.nodes[i].kill();
        Ok(i)
    }

    /// Pauses (`SIGSTOP`) the primary serving `key`, and returns its index. Paused for longer
    /// than the node timeout (500 ms), it is failed over like a dead one, and becomes a replica
    /// once resumed.
    ///
    /// # Errors
    /// As [`primary_of`](Self::primary_of), and [`TestRedis::pause`]'s.
    pub fn pause_primary_of(&mut self, key: &str) -> Result<usize, TestRedisError> {
        let i = self.primary_of(key)?;
        self.nodes[i].pause()?;
        Ok(i)
    }

    /// Waits until a node that runs (and is not paused) serves `slot` as primary in the view of
    /// every such node, and all of them say `cluster_state:ok`; returns its index. Call it after
    /// killing or pausing the slot's primary. Blocks the calling thread meanwhile.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] after `within`, with what was still missing.
    pub fn wait_for_failover(&self, slot: u16, within: Duration) -> Result<usize, TestRedisError> {
        wait_for(within, &format!("failover of slot {slot}"), POLL, || {
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
                    .filter(|&j| self.nodes[j].answers())
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
    /// # Errors
    /// [`TestRedisError::NotReady`] when the node does not answer.
    pub fn node_id(&self, i: usize) -> Result<String, TestRedisError> {
        self.ask_text(i, &["CLUSTER", "MYID"])
            .map_err(|missing| TestRedisError::NotReady {
                what: format!("the id of node {i}"),
                within: Duration::ZERO,
                missing,
            })
    }

    /// A running replica of the primary at index `primary`, in the view of that primary.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] when the primary does not answer.
    pub fn replica_of(&self, primary: usize) -> Result<Option<usize>, TestRedisError> {
        let id = self.node_id(primary)?;
        let Some(view) = self.cluster_nodes(primary) else {
            return Ok(None);
        };
        Ok(view
            .iter()
            .filter(|node| node.primary_id.as_deref() == Some(id.as_str()))
            .filter_map(|node| self.index_of_port(node.port))
            .find(|&i| self.nodes[i].answers()))
    }

    /// Moves `slot` to the primary at index `to`, keys and all, the way `redis-cli --cluster
    /// reshard` does: `IMPORTING` on the new owner, `MIGRATING` on the old one, `MIGRATE` of
    /// its keys until none is left (clients meanwhile get `ASK` and `TRYAGAIN`), then
    /// `SETSLOT NODE` on every node. Nothing to do when `to` serves the slot already.
    ///
    /// # Errors
    /// [`TestRedisError::Refused`] when a step is refused.
    pub fn migrate_slot(&self, slot: u16, to: usize) -> Result<(), TestRedisError> {
        let from = self.primary_of_slot(slot)?;
        if from == to {
            return Ok(());
        }
        let (slot, from_id, to_id) = (slot.to_string(), self.node_id(from)?, self.node_id(to)?);
        let step = |i: usize, args: &[&str]| match query(self.nodes[i].port(), args) {
            Some(reply) if reply.is_simple("OK") => Ok(()),
            reply => Err(TestRedisError::Refused {
                step: format!("{} on node {i}", args.join(" ")),
                reason: reply.map_or("no answer".to_owned(), |r| r.describe()),
            }),
        };
        step(to, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id])?;
        step(from, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id])?;
        let port = self.nodes[to].port().to_string();
        loop {
            let keys = query(
                self.nodes[from].port(),
                &["CLUSTER", "GETKEYSINSLOT", &slot, "100"],
            )
            .ok_or_else(|| TestRedisError::Refused {
                step: format!("CLUSTER GETKEYSINSLOT {slot} 100 on node {from}"),
                reason: "no answer".to_owned(),
            })?;
            let keys: Vec<&str> = keys.items().iter().filter_map(Reply::text).collect();
            if keys.is_empty() {
                break;
            }
            let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            migrate.extend(keys);
            match query(self.nodes[from].port(), &migrate) {
                // NOKEY: they expired meanwhile.
                Some(reply) if reply.is_simple("OK") || reply.is_simple("NOKEY") => {}
                reply => {
                    return Err(TestRedisError::Refused {
                        step: format!("MIGRATE of slot {slot} to node {to}"),
                        reason: reply.map_or("no answer".to_owned(), |r| r.describe()),
                    })
                }
            }
        }
        step(to, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])?;
        step(from, &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id])?;
        for i in self.live_indices().filter(|&i| i != to && i != from) {
            // A replica refuses SETSLOT: it learns the move from its primary.
            let _ = query(
                self.nodes[i].port(),
                &["CLUSTER", "SETSLOT", &slot, "NODE", &to_id],
            );
        }
        Ok(())
    }

    /// Waits until the cluster has settled after a change (a failover, a restarted node
    /// rejoining): every node that runs says `cluster_state:ok`, all of them agree on which
    /// running primary serves each of the 16384 slots and on who replicates whom, and every
    /// running replica's link to its primary is up. Blocks the calling thread meanwhile.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] after `within`, with what was still missing.
    pub fn wait_until_settled(&self, within: Duration) -> Result<(), TestRedisError> {
        wait_for(within, "cluster settling", POLL, || {
            self.check_settled(false)
        })
    }

    /// Indices of the nodes that can be asked (running, not paused).
    fn live_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].answers())
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|node| node.port() == port)
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

    /// `Ok` once the live nodes agree (see [`TestCluster::wait_until_settled`]); at startup
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

impl Drop for TestCluster {
    fn drop(&mut self) {
        // Stops every node (by pid) before their files go.
        self.nodes.clear();
        for file in &self.config_files {
            let _ = std::fs::remove_file(file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
