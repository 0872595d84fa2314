//! [`LockManagerBuilder`]: how a [`LockManager`] is made, its settings checked, and where it
//! connects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;

use crate::context::{Context, Counters};
use crate::error::LockError;
use crate::manager::LockManager;
use crate::notify::Notifications;
use crate::order::{LockOrder, Orders};
use crate::renew::Renewals;
use crate::tls::Tls;
use crate::topology::Replicas;
use crate::topology::Timeouts;
use crate::topology::{one, quorum, sentinel, Cluster, Deployment};
use crate::validity::check_ttl;

impl LockManager {
    /// A manager for the Redis at `url` (`redis://[user:password@]host[:port][/db]`,
    /// `rediss://...` for TLS, or `unix:///path`), with every default of [`LockManagerBuilder`].
    /// No connection is made here: an unreachable server is reported by the first lock.
    ///
    /// ```
    /// use distlock_runtime::{LockError, LockManager};
    ///
    /// // No connection is made yet: an unreachable server is reported by the first lock.
    /// let locks = LockManager::from_url("redis://app:secret@127.0.0.1:6379/2").expect("a URL");
    /// // A URL that is not a Redis one fails here.
    /// assert!(matches!(
    ///     LockManager::from_url("http://127.0.0.1:6379"),
    ///     Err(LockError::InvalidUrl { .. })
    /// ));
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidUrl`] when the URL cannot be parsed or is not a Redis URL; the message
    /// never contains the URL's password.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::builder().url(url).build()
    }

    /// A builder to set the pool, key prefix, defaults and timeouts.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .default_wait(Duration::from_secs(2))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::default()
    }
}

/// Builds a [`LockManager`]. Every timeout is finite by default.
///
/// | setting | default |
/// |---|---|
/// | where Redis is: [`url`](Self::url) or [`pool`](Self::pool) (one server), [`cluster`](Self::cluster), [`sentinel`](Self::sentinel) or [`quorum`](Self::quorum) | required, exactly one |
/// | [`min_replicas`](Self::min_replicas) / [`replica_timeout`](Self::replica_timeout) | 0 / 1 s |
/// | for `rediss://` URLs: [`tls_ca_pem`](Self::tls_ca_pem) / [`tls_client_cert_pem`](Self::tls_client_cert_pem) | the system's root CAs / no client certificate |
/// | [`prefix`](Self::prefix) | `"distlock:"` |
/// | [`default_ttl`](Self::default_ttl) | 30 s |
/// | [`default_wait`](Self::default_wait) | 10 s |
/// | [`default_fair`](Self::default_fair) | `true` where the topology serves fair requests (not on a quorum, nor with `min_replicas`) |
/// | [`lock_order`](Self::lock_order) | [`LockOrder::Warn`] |
/// | [`pool_size`](Self::pool_size) | 8 connections |
/// | [`connect_timeout`](Self::connect_timeout) | 2 s |
/// | [`response_timeout`](Self::response_timeout) | 1 s |
/// | [`pool_wait_timeout`](Self::pool_wait_timeout) | 1 s |
///
/// ```no_run
/// use std::time::Duration;
/// # fn demo() -> Result<(), distlock_runtime::LockError> {
/// let locks = distlock_runtime::LockManager::builder()
///     .url("redis://127.0.0.1:6379/0")
///     .prefix("billing:")
///     .default_ttl(Duration::from_secs(10))
///     .response_timeout(Duration::from_millis(500))
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "call .build() to get a LockManager"]
pub struct LockManagerBuilder {
    /// Every topology chosen, in order: the last one is used (`url` and `pool` replace each
    /// other); two different ones are the error `build` returns.
    sources: Vec<Source>,
    /// `count` 0: no replica needs to acknowledge.
    replicas: Replicas,
    prefix: String,
    default_ttl: Duration,
    default_wait: Duration,
    /// `None`: fair where the topology serves fair requests.
    default_fair: Option<bool>,
    holder_label: Option<String>,
    lock_order: LockOrder,
    pool_size: usize,
    timeouts: Timeouts,
    tls: Tls,
}

enum Source {
    Url(String),
    Pool(Pool),
    Cluster(Vec<String>),
    Sentinel { master: String, urls: Vec<String> },
    Quorum(Vec<String>),
}

impl Source {
    /// The builder method that chose it; `url` and `pool` are one topology.
    fn method(&self) -> &'static str {
        match self {
            Self::Url(_) | Self::Pool(_) => ".url(..) / .pool(..)",
            Self::Cluster(_) => ".cluster(..)",
            Self::Sentinel { .. } => ".sentinel(..)",
            Self::Quorum(_) => ".quorum(..)",
        }
    }

    /// The URLs the manager connects to (none for a caller's pool).
    fn urls(&self) -> &[String] {
        match self {
            Self::Url(url) => std::slice::from_ref(url),
            Self::Pool(_) => &[],
            Self::Cluster(urls) | Self::Quorum(urls) | Self::Sentinel { urls, .. } => urls,
        }
    }
}

impl Default for LockManagerBuilder {
    fn default() -> Self {
        Self {
            sources: Vec::new(),
            replicas: Replicas {
                count: 0,
                timeout: Duration::from_secs(1),
            },
            prefix: "distlock:".to_owned(),
            default_ttl: Duration::from_secs(30),
            default_wait: Duration::from_secs(10),
            default_fair: None,
            holder_label: None,
            lock_order: LockOrder::Warn,
            pool_size: 8,
            timeouts: Timeouts {
                connect: Duration::from_secs(2),
                response: Duration::from_secs(1),
                pool_wait: Duration::from_secs(1),
            },
            tls: Tls::default(),
        }
    }
}

impl fmt::Debug for LockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockManagerBuilder")
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("default_wait", &self.default_wait)
            .finish_non_exhaustive()
    }
}

impl LockManagerBuilder {
    /// Connect to the Redis at `url`, through a pool this builder creates. Replaces a
    /// [`pool`](Self::pool) given before. A `rediss://` URL connects over TLS (see
    /// [`tls_ca_pem`](Self::tls_ca_pem)); an ACL user goes in the URL:
    /// `redis://user:password@host:port`.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://app:secret@10.0.0.5:6379/1") // user, password and database 1
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn url(self, url: impl Into<String>) -> Self {
        self.choose(Source::Url(url.into()))
    }

    /// Use a Redis Cluster, found from any of `seed_urls` (`redis://host:port`, one or more
    /// nodes): slots, `MOVED` / `ASK` redirections and failovers are followed. Each lock lives
    /// in its key's slot; a request for keys in several slots takes them slot by slot, all or
    /// nothing (see the crate docs, "Topologies").
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     // Any of the nodes: the rest is discovered.
    ///     .cluster(["redis://10.0.0.5:7000", "redis://10.0.0.6:7000"])
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster<I, S>(self, seed_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.choose(Source::Cluster(
            seed_urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// Use the primary that the sentinels at `sentinel_urls` name for `master_name`, and follow
    /// it across failovers (on `READONLY`, a broken connection or `+switch-master`). Credentials
    /// and database in the sentinel URLs are the sentinels'; the primary is reached with the
    /// first URL's user, password and database too (so that user must exist, with that
    /// password, on the sentinels and on the data servers), and over TLS, with the same
    /// certificates, exactly when the first URL is a `rediss://` one.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.7:26379", "redis://10.0.0.8:26379"])
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel<I, S>(self, master_name: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.choose(Source::Sentinel {
            master: master_name.into(),
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
        })
    }

    /// Use a Redlock quorum over the independent primaries at `node_urls` (an odd number, 3 or
    /// more): a lock is held when a majority granted it (see the crate docs, "Topologies").
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let nodes: Vec<String> = (1..=5).map(|n| format!("redis://lock-{n}:6379")).collect();
    /// let locks = distlock_runtime::LockManager::builder().quorum(nodes).build()?;
    /// # Ok(()) }
    /// ```
    pub fn quorum<I, S>(self, node_urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.choose(Source::Quorum(
            node_urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// An acquire or extend counts only once `n` replicas acknowledged it (`WAIT n`, within
    /// [`replica_timeout`](Self::replica_timeout)); otherwise it is undone and fails with
    /// [`LockError::Replication`]. Default 0. For one server with replicas, a Sentinel primary
    /// or a cluster's primaries; not for a quorum. Fair requests are refused with it (nothing
    /// confirms a fair hand-off on the replicas before the next holder's body starts).
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// // A lock counts once a replica has it too, so a failover does not lose it.
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.7:26379"])
    ///     .min_replicas(1)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn min_replicas(mut self, n: usize) -> Self {
        self.replicas.count = n;
        self
    }

    /// How long an acquire or extend waits for [`min_replicas`](Self::min_replicas)
    /// acknowledgements. Default 1 s. An attempt of a request that waits never waits for them
    /// past half a response timeout after the request's deadline, so the wait still ends by its
    /// deadline plus one response timeout; a try-lock's attempt waits the whole replica timeout.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://10.0.0.5:6379")
    ///     .min_replicas(1)
    ///     .replica_timeout(Duration::from_millis(250))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn replica_timeout(mut self, timeout: Duration) -> Self {
        self.replicas.timeout = timeout;
        self
    }

    fn choose(mut self, source: Source) -> Self {
        self.sources.push(source);
        self
    }

    /// Use an existing deadpool-redis pool. Replaces a [`url`](Self::url) given before;
    /// [`pool_size`](Self::pool_size) and [`connect_timeout`](Self::connect_timeout) then do not
    /// apply to the pool, but every call is still bounded by this builder's timeouts. A pool
    /// does not say where it connects, so such a manager cannot subscribe to release
    /// notifications: its waiters poll with backoff (1 to 50 ms). Prefer [`url`](Self::url).
    ///
    /// ```no_run
    /// use distlock_runtime::deadpool_redis::{Config, Runtime};
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // The application's own pool; distlock takes one connection from it.
    /// let pool = Config::from_url("redis://127.0.0.1:6379").create_pool(Some(Runtime::Tokio1))?;
    /// let locks = distlock_runtime::LockManager::builder().pool(pool.clone()).build()?;
    /// # Ok(()) }
    /// ```
    pub fn pool(self, pool: Pool) -> Self {
        self.choose(Source::Pool(pool))
    }

    /// Prefix of every Redis key the manager writes. Default `"distlock:"`.
    ///
    /// ```
    /// # fn main() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .prefix("billing:")
    ///     .build()?;
    /// assert_eq!(locks.redis_key("invoice:7"), "billing:lock:{invoice:7}");
    /// # Ok(()) }
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease length of requests that do not set one. Default 30 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .default_ttl(Duration::from_secs(10))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// How long requests that do not set a wait wait for a held lock. Default 10 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// // Request handlers answer "busy" quickly rather than queue for long.
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .default_wait(Duration::from_millis(500))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = wait;
        self
    }

    /// Whether single-key requests that do not say are fair (see
    /// [`LockRequest::fair`](crate::LockRequest::fair)). Default: fair wherever the topology
    /// serves fair requests, which is everywhere but a quorum and a manager with
    /// [`min_replicas`](Self::min_replicas) (those default to unfair; asking for
    /// `default_fair(true)` there is [`LockError::InvalidConfig`]). Requests for several keys
    /// are never fair by default. The crate docs, "Fair locks", say why fair is the default.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// // Every request of this manager is unfair unless it says `fair(true)`: whoever asks
    /// // first after a release gets the lock.
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .default_fair(false)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn default_fair(mut self, fair: bool) -> Self {
        self.default_fair = Some(fair);
        self
    }

    /// What the manager does when a task nests lock classes in the order opposite to one some
    /// task of it took them in before, which deadlocks the two until their waits run out:
    /// [`LockOrder::Warn`] (the default) logs the first inversion of each pair of classes and
    /// counts every one; [`LockOrder::Fail`] (the testing helpers' managers) makes the nested
    /// call fail at once with [`LockError::LockOrderInversion`]; [`LockOrder::Off`] checks
    /// nothing. A key's class is its attribute template with the placeholders blanked
    /// (`acct:{a}` is `acct:{}`), or, for a key given to [`LockManager::lock`], the key itself.
    /// The check asks Redis nothing and runs only for nested requests; see [`LockOrder`].
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// use distlock_runtime::LockOrder;
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .lock_order(LockOrder::Fail)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn lock_order(mut self, order: LockOrder) -> Self {
        self.lock_order = order;
        self
    }

    /// A label for this manager's leases, such as the host and process id, which
    /// [`LockManager::inspect`] and the `distlock` command-line tool show as the holder, so
    /// "who holds it?" has an answer. It travels inside each owner token, so anyone who may read
    /// the lock keys sees it: no secrets. Whitespace becomes `_`; at most 64 bytes are kept.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let host = std::env::var("HOSTNAME").unwrap_or_default();
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .holder_label(format!("{host}/{}", std::process::id()))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn holder_label(mut self, label: impl Into<String>) -> Self {
        self.holder_label = Some(crate::inspect::clean_label(&label.into()));
        self
    }

    /// Trust the CA certificates in `pem` (PEM text: one or more `-----BEGIN CERTIFICATE-----`
    /// blocks) to sign the servers' certificates, on every `rediss://` connection the manager
    /// opens: to the server, every cluster node, the sentinels and the primary they name, every
    /// quorum node. Called again, the CAs given before stay trusted too.
    ///
    /// The CAs given here are then the only ones trusted, as with `redis-cli --cacert`: the
    /// system's root certificates are not. Without this call they are, which suits a server
    /// whose certificate a public CA signed. The server's certificate must name the host of the
    /// URL (a DNS name, or an IP address in its subject alternative names).
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_ca_pem(std::fs::read("/etc/redis/tls/ca.crt")?)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`build`](Self::build) fails with [`LockError::InvalidConfig`] when `pem` holds no
    /// certificate or a broken one, and when none of the manager's URLs is a `rediss://` one
    /// (the connections would not be encrypted).
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.add_ca(pem.into());
        self
    }

    /// Present this client certificate on every `rediss://` connection the manager opens, for
    /// servers that check their clients' certificates (mutual TLS: `tls-auth-clients yes`).
    /// `cert_chain_pem` holds the certificate, then any intermediate CA certificates, as PEM;
    /// `key_pem` its private key (PEM: PKCS#8 `PRIVATE KEY`, `RSA PRIVATE KEY` or
    /// `EC PRIVATE KEY`, unencrypted). Replaces a certificate given before. The key is never
    /// shown in `Debug` output or errors.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_ca_pem(std::fs::read("/etc/redis/tls/ca.crt")?)
    ///     .tls_client_cert_pem(
    ///         std::fs::read("/etc/app/tls/client.crt")?,
    ///         std::fs::read("/etc/app/tls/client.key")?,
    ///     )
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// [`build`](Self::build) fails with [`LockError::InvalidConfig`] when the certificate or
    /// the key cannot be read, when they do not belong together, and when none of the
    /// manager's URLs is a `rediss://` one.
    pub fn tls_client_cert_pem(
        mut self,
        cert_chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.set_client(cert_chain_pem.into(), key_pem.into());
        self
    }

    /// Most connections the created pool opens. Default 8.
    ///
    /// ```no_run
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .pool_size(2)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Longest time to open a connection (TCP connect and handshake). Default 2 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://redis.internal:6379")
    ///     .connect_timeout(Duration::from_millis(500))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// Longest time to wait for Redis to answer one call. Default 1 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .response_timeout(Duration::from_millis(200))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.response = timeout;
        self
    }

    /// Longest time to wait for a free connection from the pool. Default 1 s.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .pool_wait_timeout(Duration::from_millis(100))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn pool_wait_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.pool_wait = timeout;
        self
    }

    /// Asks the server at `url` what it is, with one `HELLO` on a connection of its own that
    /// uses this builder's TLS settings and timeouts (and `url`'s user and password): one
    /// server, a Redis Cluster node, or a Sentinel (with the names of the primaries it
    /// monitors). The builder is not changed: choose the topology from the answer. For a URL
    /// that comes from outside (an operator's `REDIS_URL`), so that a cluster node or a
    /// Sentinel is not taken for one server. A server that will not say (an ACL user without
    /// `+hello`, a server older than 6.2) is [`ServerKind::Standalone`](crate::ServerKind).
    ///
    /// ```no_run
    /// use distlock_runtime::{LockManager, ServerKind};
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = std::env::var("REDIS_URL")?;
    /// let builder = LockManager::builder();
    /// let locks = match builder.probe(&url).await? {
    ///     ServerKind::ClusterNode => builder.cluster([url]),
    ///     ServerKind::Sentinel { primaries } if primaries.len() == 1 => {
    ///         builder.sentinel(primaries[0].clone(), [url])
    ///     }
    ///     _ => builder.url(url),
    /// }
    /// .build()?;
    /// # let _ = locks; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidUrl`] for a URL that is not a Redis one; otherwise what the first
    /// lock would meet: [`LockError::Redis`] / [`LockError::RedisTimeout`] when the server
    /// cannot be reached in time, [`LockError::Misconfigured`] for refused credentials or
    /// certificates.
    pub async fn probe(&self, url: &str) -> Result<crate::ServerKind, LockError> {
        self.tls.check()?;
        let (info, _) = crate::topology::parse_url(url, &self.tls)?;
        let client = crate::topology::client(info)?;
        crate::topology::probe(&client, self.timeouts).await
    }

    /// Builds the manager. Makes no network connection.
    ///
    /// ```
    /// use distlock_runtime::{LockError, LockManager};
    ///
    /// // Settings are checked here, without a connection: no topology is an error.
    /// assert!(matches!(LockManager::builder().build(), Err(LockError::InvalidConfig { .. })));
    /// let locks = LockManager::builder().url("redis://127.0.0.1:6379").build();
    /// assert!(locks.is_ok());
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when neither a URL nor a pool was given, a timeout is zero,
    /// the pool size is zero, the default ttl is outside [`MIN_TTL`](crate::MIN_TTL)..=[`MAX_TTL`](crate::MAX_TTL),
    /// or the TLS certificates are unusable or given without a `rediss://` URL;
    /// [`LockError::InvalidUrl`] when the URL is unusable.
    pub fn build(mut self) -> Result<LockManager, LockError> {
        self.check()?;
        let Some(source) = self.sources.pop() else {
            return Err(invalid(
                "topology",
                "give the builder one of .url(..), .pool(..), .cluster(..), .sentinel(..) or \
                 .quorum(..)",
            ));
        };
        let redis = Arc::new(self.deploy(source)?);
        let default_fair = match (self.default_fair, redis.fair().err()) {
            (Some(true), Some(reason)) => return Err(invalid("default_fair", reason)),
            (Some(fair), _) => fair,
            (None, refused) => refused.is_none(),
        };
        let notifications = redis
            .subscriber
            .clone()
            .map(|subscriber| Notifications::new(subscriber, self.timeouts, &self.prefix));
        let forced = notifications.as_ref().map(Notifications::forced);
        Ok(LockManager::new(Context {
            id: crate::ids::next_id(),
            renewals: Renewals::new(Arc::clone(&redis), forced),
            background: Default::default(),
            notifications,
            redis,
            prefix: self.prefix,
            default_ttl: self.default_ttl,
            default_wait: self.default_wait,
            default_fair,
            holder_label: self.holder_label,
            orders: Orders::new(self.lock_order),
            stats: Counters::default(),
            servers_seen: Default::default(),
        }))
    }

    /// The deployment `source` names, with these settings.
    fn deploy(&self, source: Source) -> Result<Deployment, LockError> {
        let (tls, timeouts) = (&self.tls, self.timeouts);
        let replicas = (self.replicas.count > 0).then_some(self.replicas);
        Ok(match source {
            Source::Pool(pool) => {
                let endpoint = "(caller's pool)".to_owned();
                one::server(pool, None, timeouts, false, endpoint, replicas)
            }
            Source::Url(url) => {
                let (info, endpoint) = crate::topology::parse_url(&url, tls)?;
                let client = crate::topology::client(info.clone())?;
                let pool = crate::topology::create_pool(info, self.pool_size, timeouts)?;
                one::server(pool, Some(client), timeouts, true, endpoint, replicas)
            }
            Source::Sentinel { master, urls } => {
                sentinel::primary(master, &urls, tls, timeouts, replicas)?
            }
            Source::Cluster(urls) => Cluster::new(&urls, tls, timeouts, replicas)?.into(),
            Source::Quorum(_) if replicas.is_some() => {
                return Err(invalid(
                    "min_replicas",
                    "a quorum's nodes are independent primaries; a majority of them is its \
                     redundancy",
                ));
            }
            Source::Quorum(urls) => quorum::primaries(&urls, tls, timeouts)?,
        })
    }

    /// The settings [`build`](Self::build) refuses, without a connection.
    fn check(&self) -> Result<(), LockError> {
        let unbounded = "must be greater than zero: every Redis call needs a bound";
        for (what, value) in [
            ("connect_timeout", self.timeouts.connect),
            ("response_timeout", self.timeouts.response),
            ("pool_wait_timeout", self.timeouts.pool_wait),
        ] {
            if value.is_zero() {
                return Err(invalid(what, unbounded));
            }
        }
        if self.pool_size == 0 {
            return Err(invalid("pool_size", "must be at least 1"));
        }
        check_ttl(self.default_ttl)?;
        let methods = self.sources.iter().map(Source::method);
        let mut changes = methods.clone().zip(methods.skip(1));
        if let Some((first, second)) = changes.find(|(a, b)| a != b) {
            return Err(invalid(
                "topology",
                format!(
                    "both {first} and {second} were given; a manager uses exactly one topology"
                ),
            ));
        }
        if self.tls.is_set() {
            self.tls.check()?;
            let urls = self.sources.last().map_or(&[][..], Source::urls);
            if !urls.iter().any(|url| crate::tls::is_tls_url(url)) {
                return Err(invalid(
                    "tls",
                    "TLS certificates were given, but none of the manager's URLs is a rediss:// \
                     one (and a caller's pool has TLS settings of its own): use \
                     rediss://host:port for a server that speaks TLS",
                ));
            }
        }
        if self.replicas.timeout.is_zero() && self.replicas.count > 0 {
            return Err(invalid("replica_timeout", unbounded));
        }
        Ok(())
    }
}

/// The error of a setting `build` refuses.
fn invalid(what: &'static str, reason: impl Into<String>) -> LockError {
    LockError::InvalidConfig {
        what,
        reason: reason.into(),
    }
}
