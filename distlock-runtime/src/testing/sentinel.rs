//! A Sentinel group of throwaway servers: a primary, its replicas, and the sentinels watching
//! them.

use std::path::PathBuf;
use std::time::Duration;

use super::resp::{query, Reply};
use super::server::{build, with_test_timeouts};
use super::{free_port_or_error, off_the_runtime, resp, unique_temp_file, wait_for};
use super::{TestRedis, TestRedisError};
use crate::{LockManager, LockManagerBuilder};

/// How long a startup may take.
const STARTUP: Duration = Duration::from_secs(20);

/// How often the waits look again.
const POLL: Duration = Duration::from_millis(10);

/// The name the sentinels monitor the primary under.
const MASTER_NAME: &str = "distlock-test";

/// A primary, its replicas and the sentinels that watch them (`down-after-milliseconds 500`,
/// `failover-timeout 3000`, quorum a majority of the sentinels), under the name
/// [`TestSentinel::master_name`]; every process stopped, and every config file removed, when
/// dropped.
///
/// Data servers have indices `0..server_count()`: 0 is the first primary, the replicas follow;
/// [`TestSentinel::primary_index`] says which is the primary now. Each sentinel is started
/// already knowing the replicas and the other sentinels (ids chosen here), and pings every
/// 100 ms rather than every second, so the group is ready in about 0.3 s (not the 2 s it takes
/// sentinels to discover each other) and a killed primary is replaced in about 2 s.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use distlock_runtime::testing::TestSentinel;
///
/// let group = TestSentinel::start(1, 1).await?;
/// let locks = group.manager();
/// locks.lock("order:42").run(async {}).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestSentinel {
    /// Declared first so they are stopped first: no sentinel reacts to the servers going.
    sentinels: Vec<TestRedis>,
    servers: Vec<TestRedis>,
    /// Every sentinel's config file (which it rewrites as it learns), removed on drop.
    config_files: Vec<PathBuf>,
}

impl TestSentinel {
    /// Starts a primary, `replicas` replicas of it (synced), and `sentinels` sentinels, and
    /// waits until every sentinel has reached the primary, every replica and every other
    /// sentinel, so that a failover can happen at once; the waiting is done off the async
    /// runtime's threads.
    ///
    /// # Errors
    /// As [`start_blocking`](Self::start_blocking).
    pub async fn start(replicas: usize, sentinels: usize) -> Result<Self, TestRedisError> {
        off_the_runtime(move || Self::start_blocking(replicas, sentinels)).await
    }

    /// [`start`](Self::start), blocking the calling thread meanwhile.
    ///
    /// # Errors
    /// [`TestRedisError::Refused`] with no sentinel; those of [`TestRedis::start`] when a
    /// process does not start; [`TestRedisError::NotReady`] when the group is not ready within
    /// 20 s.
    pub fn start_blocking(replicas: usize, sentinels: usize) -> Result<Self, TestRedisError> {
        if sentinels == 0 {
            return Err(TestRedisError::Refused {
                step: "a sentinel group without sentinels".to_owned(),
                reason: "a sentinel group needs a sentinel".to_owned(),
            });
        }
        let primary = TestRedis::start_blocking()?;
        let mut servers = vec![];
        for _ in 0..replicas {
            servers.push(TestRedis::builder().replica_of(&primary).start_blocking()?);
        }
        servers.insert(0, primary);
        let mut group = Self {
            sentinels: Vec::with_capacity(sentinels),
            servers,
            config_files: vec![],
        };
        let mut last = None;
        for _ in 0..20 {
            match group.spawn_sentinels(sentinels) {
                Ok(started) => {
                    group.sentinels = started;
                    break;
                }
                Err(e @ TestRedisError::Startup { .. }) => last = Some(e),
                Err(other) => return Err(other),
            }
        }
        if group.sentinels.is_empty() {
            return Err(last.expect("tried at least once"));
        }
        group.shorten_ping_period()?;
        wait_for(STARTUP, "sentinel group startup", POLL, || {
            group.check_ready()
        })?;
        Ok(group)
    }

    /// The name the sentinels know the primary by (`SENTINEL GET-MASTER-ADDR-BY-NAME <name>`).
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// `redis://127.0.0.1:PORT` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(TestRedis::url).collect()
    }

    /// A manager for the group (through its sentinels), with 2 s timeouts like
    /// [`TestRedis::manager`]'s.
    ///
    /// # Panics
    /// Never in practice: the builder of [`manager_builder`](Self::manager_builder) is valid.
    pub fn manager(&self) -> LockManager {
        build(self.manager_builder())
    }

    /// The builder behind [`manager`](Self::manager), to adjust before building.
    pub fn manager_builder(&self) -> LockManagerBuilder {
        with_test_timeouts(LockManager::builder().sentinel(MASTER_NAME, self.sentinel_urls()))
    }

    /// The port of the primary, as the first sentinel that answers names it.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] when no sentinel answers with an address.
    pub fn primary_port(&self) -> Result<u16, TestRedisError> {
        self.sentinels
            .iter()
            .find_map(|sentinel| self.named_primary(sentinel.port()))
            .ok_or_else(|| TestRedisError::NotReady {
                what: "the primary's address".to_owned(),
                within: Duration::ZERO,
                missing: "no sentinel names a primary".to_owned(),
            })
    }

    /// The index of the data server the sentinels name as primary.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] when no sentinel answers, or it names a server not of this
    /// group.
    pub fn primary_index(&self) -> Result<usize, TestRedisError> {
        let port = self.primary_port()?;
        self.index_of_port(port)
            .ok_or_else(|| TestRedisError::NotReady {
                what: "the primary's index".to_owned(),
                within: Duration::ZERO,
                missing: format!("the sentinels name unknown port {port}"),
            })
    }

    /// How many data servers (primary and replicas) the group has.
    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    /// Data server `i`.
    ///
    /// # Panics
    /// When `i` is not below [`server_count`](Self::server_count).
    pub fn server(&self, i: usize) -> &TestRedis {
        &self.servers[i]
    }

    /// Data server `i`, to kill, pause or restart it. A restarted server is empty and starts
    /// with its first arguments (a replica of the first primary, or a primary); the sentinels
    /// make it a replica of the current primary within about 10 s.
    ///
    /// # Panics
    /// When `i` is not below [`server_count`](Self::server_count).
    pub fn server_mut(&mut self, i: usize) -> &mut TestRedis {
        &mut self.servers[i]
    }

    /// Kills every sentinel and starts each again on its port with the config it rewrote (what
    /// it knew of the primary, the replicas and its peers), and waits until the group is ready.
    ///
    /// # Errors
    /// [`TestRedisError::Startup`] when a sentinel does not come back,
    /// [`TestRedisError::NotReady`] when the group is not ready within 20 s.
    pub fn restart_sentinels(&mut self) -> Result<(), TestRedisError> {
        for sentinel in &mut self.sentinels {
            sentinel.kill();
        }
        for sentinel in &mut self.sentinels {
            sentinel.restart()?;
        }
        self.shorten_ping_period()?;
        wait_for(STARTUP, "sentinels restarted", POLL, || self.check_ready())
    }

    /// Kills (`SIGKILL`) the current primary and returns its index. The sentinels replace it
    /// after about 2 s: see [`TestSentinel::wait_for_new_primary`].
    ///
    /// # Errors
    /// As [`primary_index`](Self::primary_index).
    pub fn kill_primary(&mut self) -> Result<usize, TestRedisError> {
        let i = self.primary_index()?;
        self.servers[i].kill();
        Ok(i)
    }

    /// Stops sentinel `i` (in [`TestSentinel::sentinel_urls`] order) with `SIGSTOP`: its
    /// connections stay open, new ones are accepted by the kernel, nothing is answered (a hung
    /// sentinel). While it is paused, the group's own queries that ask it first
    /// ([`TestSentinel::primary_port`] and those built on it) wait 2 s for it.
    ///
    /// # Errors
    /// As [`TestRedis::pause`].
    pub fn pause_sentinel(&self, i: usize) -> Result<(), TestRedisError> {
        self.sentinels[i].signal("STOP")
    }

    /// Continues sentinel `i` after [`TestSentinel::pause_sentinel`].
    ///
    /// # Errors
    /// As [`TestRedis::resume`].
    pub fn resume_sentinel(&self, i: usize) -> Result<(), TestRedisError> {
        self.sentinels[i].signal("CONT")
    }

    /// Asks a sentinel for a failover (`SENTINEL FAILOVER`, no agreement needed) and returns the
    /// port of the primary it replaces. The old primary stays up; the sentinels make it a
    /// replica of the new one some 10 s after the switch (until then both say `role:master`:
    /// see [`TestSentinel::wait_until_replicas_follow`]).
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] when no sentinel accepts within 10 s (one refuses while an
    /// earlier failover is still in progress, and until it has fresh news of a replica to
    /// promote).
    pub fn failover(&self) -> Result<u16, TestRedisError> {
        let old_port = self.primary_port()?;
        wait_for(Duration::from_secs(10), "SENTINEL FAILOVER", POLL, || {
            let mut refusals = vec![];
            for sentinel in &self.sentinels {
                match query(sentinel.port(), &["SENTINEL", "FAILOVER", MASTER_NAME]) {
                    Some(reply) if reply.is_simple("OK") => return Ok(old_port),
                    Some(other) => refusals.push(other.describe()),
                    None => refusals.push("no answer".to_owned()),
                }
            }
            Err(refusals.join("; "))
        })
    }

    /// Waits until every sentinel names a primary other than `old_port`, the same one, and that
    /// server says `role:master`; returns its port. Blocks the calling thread meanwhile.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] after `within`, with what was still missing.
    pub fn wait_for_new_primary(
        &self,
        old_port: u16,
        within: Duration,
    ) -> Result<u16, TestRedisError> {
        let what = format!("a primary other than {old_port}");
        wait_for(within, &what, POLL, || {
            let mut named = None;
            for sentinel in &self.sentinels {
                let port = self
                    .named_primary(sentinel.port())
                    .ok_or(format!("sentinel {} does not answer", sentinel.port()))?;
                if port == old_port {
                    return Err(format!("sentinel {} still names {port}", sentinel.port()));
                }
                match named {
                    Some(other) if other != port => {
                        return Err(format!("sentinels name {other} and {port}"))
                    }
                    _ => named = Some(port),
                }
            }
            let port = named.ok_or("no sentinel")?;
            let replication = resp::command(port, &["INFO", "replication"]).unwrap_or_default();
            if replication.contains("role:master") {
                Ok(port)
            } else {
                Err(format!("{port} does not say role:master yet"))
            }
        })
    }

    /// Waits until every data server that runs (and is not paused), other than the primary the
    /// sentinels name, says `role:slave` with that primary and its link up. After
    /// [`TestSentinel::failover`] this is how long two servers say `role:master`. Blocks the
    /// calling thread meanwhile.
    ///
    /// # Errors
    /// [`TestRedisError::NotReady`] after `within`, with what was still missing.
    pub fn wait_until_replicas_follow(&self, within: Duration) -> Result<(), TestRedisError> {
        wait_for(within, "replicas following the new primary", POLL, || {
            let primary = self.primary_port().map_err(|e| e.to_string())?;
            let master_port = format!("master_port:{primary}\r\n");
            for server in self.servers.iter().filter(|server| server.answers()) {
                if server.port() == primary {
                    continue;
                }
                let replication = resp::command(server.port(), &["INFO", "replication"])
                    .map_err(|e| format!("{}: {e}", server.port()))?;
                if !(replication.contains("role:slave")
                    && replication.contains(&master_port)
                    && replication.contains("master_link_status:up"))
                {
                    return Err(format!("{} does not follow {primary} yet", server.port()));
                }
            }
            Ok(())
        })
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.servers.iter().position(|server| server.port() == port)
    }

    /// The primary's port as the sentinel on `port` names it.
    fn named_primary(&self, port: u16) -> Option<u16> {
        let reply = query(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])?;
        reply.items().get(1)?.text()?.parse().ok()
    }

    /// Writes the configs of `count` sentinels on fresh free ports and starts them; a
    /// [`TestRedisError::Startup`] (the ones started stopped again) if one does not come up, a
    /// port having been taken meanwhile.
    ///
    /// Each config names the replicas and the other sentinels (with ids chosen here), so no
    /// sentinel has to wait for hellos (every 2 s) to discover them.
    fn spawn_sentinels(&mut self, count: usize) -> Result<Vec<TestRedis>, TestRedisError> {
        let mut ports: Vec<u16> = vec![];
        while ports.len() < count {
            let port = free_port_or_error()?;
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let ids: Vec<String> = ports.iter().map(|_| random_id()).collect();
        let primary = self.servers[0].port();
        let quorum = count / 2 + 1;
        let mut started = vec![];
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
            self.config_files.push(config_file.clone());
            std::fs::write(&config_file, config).map_err(|source| TestRedisError::Io {
                what: format!("write the sentinel config file {}", config_file.display()),
                source,
            })?;
            // If one fails, `started` is dropped: those sentinels are stopped.
            started.push(
                TestRedis::builder()
                    .program(self.servers[0].program())
                    .config_file(config_file)
                    .arg("--sentinel")
                    .port(port)
                    .start_blocking()?,
            );
        }
        Ok(started)
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
    fn shorten_ping_period(&self) -> Result<(), TestRedisError> {
        for sentinel in &self.sentinels {
            let args = ["SENTINEL", "DEBUG", "PING-PERIOD", "100"];
            match query(sentinel.port(), &args) {
                Some(reply) if reply.is_simple("OK") => {}
                reply => {
                    return Err(TestRedisError::Refused {
                        step: format!("{} on sentinel {}", args.join(" "), sentinel.port()),
                        reason: reply.map_or("no answer".to_owned(), |r| r.describe()),
                    })
                }
            }
        }
        Ok(())
    }

    /// `Ok` once every sentinel has reached the primary, has news of every replica (their
    /// `INFO`, which a failover needs) and is linked to every other sentinel.
    fn check_ready(&self) -> Result<(), String> {
        let replicas = self.servers.len() - 1;
        let others = self.sentinels.len() - 1;
        for sentinel in &self.sentinels {
            let port = sentinel.port();
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

impl Drop for TestSentinel {
    fn drop(&mut self) {
        // Stops the sentinels, then the servers (by pid), before the files go.
        self.sentinels.clear();
        self.servers.clear();
        for file in &self.config_files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// 40 random hex digits: a sentinel id.
fn random_id() -> String {
    let [first, second] = crate::ids::random_ids();
    first
        .iter()
        .chain(&second[..4])
        .map(|byte| format!("{byte:02x}"))
        .collect()
}
