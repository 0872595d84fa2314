//! `--topology`, shared by the `seckill` and `bench` examples: the local servers a topology
//! needs (started here on free loopback ports, with the test suite's harness, and stopped on
//! drop), and a lock manager builder on them.

use distlock_runtime::{LockManager, LockManagerBuilder};
use distlock_tests::topology::{QuorumSet, RedisCluster, SentinelGroup};

/// Where the locks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Topology {
    /// One Redis (the default): `REDIS_URL`, else a throwaway one.
    Standalone,
    /// A local Redis Cluster: 3 primaries, 1 replica each.
    Cluster,
    /// A local Sentinel group: a primary, 1 replica, 3 sentinels.
    Sentinel,
    /// A local Redlock quorum of 5 independent servers.
    Quorum,
}

/// The servers started for a topology other than standalone.
pub(crate) enum Servers {
    Cluster(RedisCluster),
    Sentinel(SentinelGroup),
    Quorum(QuorumSet),
}

impl Servers {
    /// Starts the local servers of `topology`; `None` for standalone.
    pub(crate) fn start(topology: Topology) -> Option<Self> {
        match topology {
            Topology::Standalone => None,
            Topology::Cluster => Some(Self::Cluster(RedisCluster::start(3, 1))),
            Topology::Sentinel => Some(Self::Sentinel(SentinelGroup::start(1, 3))),
            Topology::Quorum => Some(Self::Quorum(QuorumSet::start(5))),
        }
    }

    /// A manager builder on these servers.
    pub(crate) fn builder(&self) -> LockManagerBuilder {
        let builder = LockManager::builder();
        match self {
            Self::Cluster(cluster) => builder.cluster(cluster.seed_urls()),
            Self::Sentinel(group) => builder.sentinel(group.master_name(), group.sentinel_urls()),
            Self::Quorum(quorum) => builder.quorum(quorum.urls()),
        }
    }

    /// What was started, for the user.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Cluster(cluster) => format!(
                "a local Redis Cluster of {} nodes (3 primaries, 1 replica each)",
                cluster.node_count()
            ),
            Self::Sentinel(group) => format!(
                "a local Sentinel group: a primary, {} replica(s), {} sentinels",
                group.server_count() - 1,
                group.sentinel_urls().len()
            ),
            Self::Quorum(quorum) => {
                format!("a local quorum of {} Redis servers", quorum.urls().len())
            }
        }
    }
}
