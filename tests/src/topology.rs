//! Multi-server topologies: a Redis Cluster, a Sentinel group, and a set of independent servers.
//!
//! Each is the runtime's (`distlock_runtime::testing::{TestCluster, TestSentinel,
//! TestQuorum}`, whose docs say how they are set up and waited for), with its servers seen as
//! [`RedisServer`]s and its errors turned into panics that say what was still missing.
//!
//! - [`RedisCluster`]: `primaries` primaries with `replicas_per_primary` replicas each, with a
//!   500 ms node timeout, so a synced replica takes over 1.5 to 2 s after its primary died.
//!   Startup takes 2 s (a new primary refuses to say `cluster_state:ok` for its first 2 s).
//! - [`SentinelGroup`]: one primary, its replicas, and sentinels watching them with a 500 ms
//!   down-after, so a dead primary is replaced after about 2 s. Startup takes about 0.3 s.
//! - [`QuorumSet`]: independent servers, one per quorum member.
//!
//! Everything here blocks the calling thread (like [`RedisServer::start`]).

use std::time::Duration;

use distlock_runtime::testing::{TestCluster, TestQuorum, TestSentinel};

use super::{ok, RedisServer};

/// A Redis Cluster of real `redis-server` processes (cluster mode): the runtime's
/// [`TestCluster`].
///
/// Nodes have indices `0..node_count()`; which of them are primaries is decided by `redis-cli`
/// and changes on failover, so ask [`RedisCluster::primary_of_slot`].
pub struct RedisCluster(TestCluster);

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
        Self(ok(TestCluster::start_blocking(
            primaries,
            replicas_per_primary,
        )))
    }

    /// `redis://127.0.0.1:PORT` of every node (primaries and replicas, in index order), as
    /// started: a node killed since is still listed, as a client's seed list would.
    pub fn seed_urls(&self) -> Vec<String> {
        self.0.seed_urls()
    }

    /// How many nodes the cluster has (primaries and replicas, live or not).
    pub fn node_count(&self) -> usize {
        self.0.node_count()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        RedisServer::of(self.0.node(i))
    }

    /// Node `i`, to kill, pause or restart it. A restarted node reloads its cluster config file
    /// and rejoins (as a replica, if its slots were taken over meanwhile).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        RedisServer::of_mut(self.0.node_mut(i))
    }

    /// The hash slot of `key`.
    pub fn slot_of(&self, key: &str) -> u16 {
        self.0.slot_of(key)
    }

    /// The index of the node serving `slot` as primary, in the view of the first node that
    /// answers (during a failover, views may differ for a moment; see
    /// [`RedisCluster::wait_for_failover`]).
    ///
    /// # Panics
    /// When no node answers, or the answer names no node of this cluster.
    pub fn primary_of_slot(&self, slot: u16) -> usize {
        ok(self.0.primary_of_slot(slot))
    }

    /// The index of the primary serving `key`.
    pub fn primary_of(&self, key: &str) -> usize {
        ok(self.0.primary_of(key))
    }

    /// Kills (SIGKILL) the primary serving `key`, and returns its index. Its replica takes over
    /// after about 1.5 s: see [`RedisCluster::wait_for_failover`].
    pub fn kill_primary_of(&mut self, key: &str) -> usize {
        ok(self.0.kill_primary_of(key))
    }

    /// Pauses (SIGSTOP) the primary serving `key`, and returns its index. Paused for longer
    /// than the node timeout (500 ms), it is failed over like a dead one, and becomes a replica
    /// once resumed.
    pub fn pause_primary_of(&mut self, key: &str) -> usize {
        ok(self.0.pause_primary_of(key))
    }

    /// Resumes (SIGCONT) node `i` after a pause.
    pub fn resume(&mut self, i: usize) {
        self.node_mut(i).resume();
    }

    /// Waits until a node that runs (and is not paused) serves `slot` as primary in the view of
    /// every such node, and all of them say `cluster_state:ok`; returns its index.
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_for_failover(&self, slot: u16, within: Duration) -> usize {
        ok(self.0.wait_for_failover(slot, within))
    }

    /// The cluster id of node `i` (`CLUSTER MYID`).
    ///
    /// # Panics
    /// When the node does not answer.
    pub fn node_id(&self, i: usize) -> String {
        ok(self.0.node_id(i))
    }

    /// A running replica of the primary at index `primary`, in the view of that primary.
    pub fn replica_of(&self, primary: usize) -> Option<usize> {
        ok(self.0.replica_of(primary))
    }

    /// Moves `slot` to the primary at index `to`, keys and all, the way `redis-cli --cluster
    /// reshard` does. A no-op when `to` serves the slot already.
    ///
    /// # Panics
    /// When a step is refused.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        ok(self.0.migrate_slot(slot, to));
    }

    /// Waits until the cluster has settled after a change (a failover, a restarted node
    /// rejoining).
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_until_settled(&self, within: Duration) {
        ok(self.0.wait_until_settled(within));
    }
}

/// A primary, its replicas and the sentinels that watch them: the runtime's [`TestSentinel`].
///
/// Data servers have indices `0..server_count()`: 0 is the first primary, the replicas follow;
/// [`SentinelGroup::primary_index`] says which is the primary now.
pub struct SentinelGroup(TestSentinel);

impl SentinelGroup {
    /// Starts a primary, `replicas` replicas of it (synced), and `sentinels` sentinels, and
    /// waits until every sentinel has reached the primary, every replica and every other
    /// sentinel, so that a failover can happen at once.
    ///
    /// # Panics
    /// With no sentinel, when a process does not start, or when the group is not ready within
    /// 20 s.
    pub fn start(replicas: usize, sentinels: usize) -> Self {
        Self(ok(TestSentinel::start_blocking(replicas, sentinels)))
    }

    /// The name the sentinels know the primary by (`SENTINEL GET-MASTER-ADDR-BY-NAME <name>`).
    pub fn master_name(&self) -> &str {
        self.0.master_name()
    }

    /// `redis://127.0.0.1:PORT` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.0.sentinel_urls()
    }

    /// The port of the primary, as the first sentinel that answers names it.
    ///
    /// # Panics
    /// When no sentinel answers with an address.
    pub fn primary_port(&self) -> u16 {
        ok(self.0.primary_port())
    }

    /// The index of the data server the sentinels name as primary.
    ///
    /// # Panics
    /// When no sentinel answers, or it names a server not of this group.
    pub fn primary_index(&self) -> usize {
        ok(self.0.primary_index())
    }

    /// How many data servers (primary and replicas) the group has.
    pub fn server_count(&self) -> usize {
        self.0.server_count()
    }

    /// Data server `i`.
    pub fn server(&self, i: usize) -> &RedisServer {
        RedisServer::of(self.0.server(i))
    }

    /// Data server `i`, to kill, pause or restart it. A restarted server is empty and starts
    /// with its first arguments (a replica of the first primary, or a primary); the sentinels
    /// make it a replica of the current primary within about 10 s.
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        RedisServer::of_mut(self.0.server_mut(i))
    }

    /// Kills every sentinel and starts each again on its port with the config it rewrote, and
    /// waits until the group is ready.
    ///
    /// # Panics
    /// When a sentinel does not come back, or the group is not ready within 20 s.
    pub fn restart_sentinels(&mut self) {
        ok(self.0.restart_sentinels());
    }

    /// Kills (SIGKILL) the current primary and returns its index. The sentinels replace it after
    /// about 2 s: see [`SentinelGroup::wait_for_new_primary`].
    pub fn kill_primary(&mut self) -> usize {
        ok(self.0.kill_primary())
    }

    /// Stops sentinel `i` (in [`SentinelGroup::sentinel_urls`] order) with SIGSTOP: a hung
    /// sentinel. While it is paused, the group's own queries that ask it first
    /// ([`SentinelGroup::primary_port`] and those built on it) wait 2 s for it.
    pub fn pause_sentinel(&self, i: usize) {
        ok(self.0.pause_sentinel(i));
    }

    /// Continues sentinel `i` after [`SentinelGroup::pause_sentinel`].
    pub fn resume_sentinel(&self, i: usize) {
        ok(self.0.resume_sentinel(i));
    }

    /// Asks a sentinel for a failover (`SENTINEL FAILOVER`) and returns the port of the primary
    /// it replaces; see the runtime's [`TestSentinel::failover`].
    ///
    /// # Panics
    /// When no sentinel accepts within 10 s.
    pub fn failover(&self) -> u16 {
        ok(self.0.failover())
    }

    /// Waits until every sentinel names a primary other than `old_port`, the same one, and that
    /// server says `role:master`; returns its port.
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_for_new_primary(&self, old_port: u16, within: Duration) -> u16 {
        ok(self.0.wait_for_new_primary(old_port, within))
    }

    /// Waits until every data server that runs (and is not paused), other than the primary the
    /// sentinels name, follows that primary with its link up.
    ///
    /// # Panics
    /// After `within`, with what was still missing.
    pub fn wait_until_replicas_follow(&self, within: Duration) {
        ok(self.0.wait_until_replicas_follow(within));
    }
}

/// `n` independent servers, for a quorum of locks across them: the runtime's [`TestQuorum`].
pub struct QuorumSet(TestQuorum);

impl QuorumSet {
    /// Starts `n` servers.
    ///
    /// # Panics
    /// When one does not start.
    pub fn start(n: usize) -> Self {
        Self(ok(TestQuorum::start_blocking(n)))
    }

    /// `redis://127.0.0.1:PORT` of every server, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.0.urls()
    }

    /// Server `i`.
    pub fn server(&self, i: usize) -> &RedisServer {
        RedisServer::of(self.0.server(i))
    }

    /// Server `i`, to kill, pause or restart it.
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        RedisServer::of_mut(self.0.server_mut(i))
    }
}
