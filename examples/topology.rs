//! `--topology`, shared by the `seckill` and `bench` examples: the local servers a topology
//! needs (started here on free loopback ports with `distlock_runtime::testing`, and stopped on
//! drop), and a lock manager builder on them.

use distlock_runtime::testing::{TestCluster, TestQuorum, TestRedisError, TestSentinel};
use distlock_runtime::{LockManager, LockManagerBuilder};

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
    Cluster(TestCluster),
    Sentinel(TestSentinel),
    Quorum(TestQuorum),
}

impl Servers {
    /// Starts the local servers of `topology`; `None` for standalone.
    ///
    /// # Errors
    /// When they cannot be started (`redis-server` missing, say), with what to do.
    pub(crate) async fn start(topology: Topology) -> Result<Option<Self>, TestRedisError> {
        Ok(match topology {
            Topology::Standalone => None,
            Topology::Cluster => Some(Self::Cluster(TestCluster::start(3, 1).await?)),
            Topology::Sentinel => Some(Self::Sentinel(TestSentinel::start(1, 3).await?)),
            Topology::Quorum => Some(Self::Quorum(TestQuorum::start(5).await?)),
        })
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
                format!("a local quorum of {} Redis servers", quorum.server_count())
            }
        }
    }
}
