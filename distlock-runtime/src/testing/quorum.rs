//! Independent throwaway servers, one per member of a quorum.

use super::server::{build, with_test_timeouts};
use super::{off_the_runtime, TestRedis, TestRedisError};
use crate::{LockManager, LockManagerBuilder};

/// `n` independent servers for a quorum of locks across them, stopped when dropped.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use distlock_runtime::testing::TestQuorum;
///
/// let mut quorum = TestQuorum::start(3).await?;
/// let locks = quorum.manager();
/// // A minority of the nodes down changes nothing.
/// quorum.server_mut(0).kill();
/// locks.lock("order:42").run(async {}).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestQuorum {
    servers: Vec<TestRedis>,
}

impl TestQuorum {
    /// Starts `n` servers; the waiting is done off the async runtime's threads.
    ///
    /// # Errors
    /// Those of [`TestRedis::start`], when one does not start.
    pub async fn start(n: usize) -> Result<Self, TestRedisError> {
        off_the_runtime(move || Self::start_blocking(n)).await
    }

    /// [`start`](Self::start), blocking the calling thread meanwhile.
    ///
    /// # Errors
    /// Those of [`TestRedis::start`], when one does not start.
    pub fn start_blocking(n: usize) -> Result<Self, TestRedisError> {
        let servers = (0..n)
            .map(|_| TestRedis::start_blocking())
            .collect::<Result<_, _>>()?;
        Ok(Self { servers })
    }

    /// `redis://127.0.0.1:PORT` of every server, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(TestRedis::url).collect()
    }

    /// A manager for the quorum of all the servers, with 2 s timeouts like
    /// [`TestRedis::manager`]'s.
    ///
    /// # Panics
    /// Never in practice: the builder of [`manager_builder`](Self::manager_builder) is valid.
    pub fn manager(&self) -> LockManager {
        build(self.manager_builder())
    }

    /// The builder behind [`manager`](Self::manager), to adjust before building.
    pub fn manager_builder(&self) -> LockManagerBuilder {
        with_test_timeouts(LockManager::builder().quorum(self.urls()))
    }

    /// How many servers.
    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// Server `i`.
    ///
    /// # Panics
    /// When `i` is not below [`server_count`](Self::server_count).
    pub fn server(&self, i: usize) -> &TestRedis {
        &self.servers[i]
    }

    /// Server `i`, to kill, pause or restart it.
    ///
    /// # Panics
    /// When `i` is not below [`server_count`](Self::server_count).
    pub fn server_mut(&mut self, i: usize) -> &mut TestRedis {
        &mut self.servers[i]
    }
}
