//! [`LockError`]: every way a lock operation can fail.

use std::time::Duration;

use crate::retry::Redirect;

/// Why a lock operation failed.
///
/// Each variant's message says what happened and what to do about it. Match on the variant to
/// react in code: [`LockError::NotAcquired`] and [`LockError::Timeout`] mean somebody else holds
/// the lock (retry later or answer "busy"); [`LockError::LeaseLost`] means the body may have
/// run without exclusion for part of its run; [`LockError::Redis`] and
/// [`LockError::RedisTimeout`] mean Redis could not be asked (down, hung or erroring: retry
/// later); [`LockError::Misconfigured`] means Redis refused the manager's settings (fix them:
/// retrying will not help). [`LockError::is_contention`], [`LockError::is_unavailable`] and
/// [`LockError::is_misconfigured`] sort them.
///
/// ```no_run
/// use distlock_runtime::LockError;
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), LockError> {
/// match locks.try_lock("report:daily").acquire().await {
///     Ok(lease) => lease.release().await?,
///     Err(LockError::NotAcquired { key }) => println!("{key} is busy; skipping this run"),
///     Err(e) if e.is_unavailable() => println!("Redis is down, try later: {e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock was still held by another owner when the caller's `wait` ran out. (With
    /// [`min_replicas`](crate::LockManagerBuilder::min_replicas), a wait whose last attempt the
    /// replicas did not confirm ends with [`LockError::Replication`] instead.)
    #[error(
        "timed out after {waited:?} waiting for lock `{key}`: another owner still holds it; \
         raise `wait`, or shorten the holder's critical section"
    )]
    Timeout {
        /// The first key of the request that was still held.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// [`LockRequest::acquire`](crate::LockRequest::acquire) was called, inside a `run` body (or
    /// an annotated fn), for a key that body's task already holds: the call would wait for
    /// itself until its `wait` ran out, so it fails at once. A nested
    /// [`run`](crate::LockRequest::run) (or annotated call) re-enters the held key instead.
    #[error(
        "lock `{key}` is already held by this task (an enclosing `run` or #[distributed_lock] \
         body), so acquire() would wait for itself; lock it with `run` or an annotated fn, which \
         re-enter a held key, or take the lease before entering the body"
    )]
    HeldByThisTask {
        /// The first key of the request this task holds.
        key: String,
    },

    /// A body holding a key shared (or as a permit) asked for it exclusively: an upgrade, which
    /// distlock refuses at once rather than wait, since two readers that both asked would wait
    /// for each other for good.
    #[error(
        "lock `{key}` is held shared (or as a permit) by an enclosing body on this task, and an \
         exclusive lock on it cannot be taken inside: two readers upgrading at once would wait \
         for each other for ever; take the key exclusively in the outer call, or release the \
         shared lock first"
    )]
    UpgradeNotSupported {
        /// The key asked for exclusively.
        key: String,
    },

    /// A task holding a key of class `held` asked for one of class `wanted`, where some task of
    /// this manager took them the other way round before (or `wanted` is `held`: another key of
    /// a class it holds). Two tasks doing so wait for each other until their waits run out.
    /// Returned at once, before Redis is asked, under
    /// [`LockOrder::Fail`](crate::LockOrder::Fail); see
    /// [`LockManagerBuilder::lock_order`](crate::LockManagerBuilder::lock_order).
    #[error(
        "lock order inversion: a key of class `{wanted}` was asked for while this task holds \
         one of class `{held}`, and this manager has seen them taken the other way round (or \
         the two are keys of one class): two tasks nesting them in opposite orders deadlock \
         until their waits run out; take the classes in one order everywhere, or take both keys \
         in one request (all or nothing)"
    )]
    LockOrderInversion {
        /// The class held (a key template with its placeholders blanked, or a key).
        held: String,
        /// The class asked for.
        wanted: String,
    },

    /// A try-lock (`wait = 0`) found the lock held and did not wait. (With
    /// [`min_replicas`](crate::LockManagerBuilder::min_replicas), one whose attempt the replicas
    /// did not confirm fails with [`LockError::Replication`] instead.)
    #[error(
        "lock `{key}` is held by another owner and this call does not wait (wait = 0); \
         try again later, or give the call a `wait`"
    )]
    NotAcquired {
        /// The first key of the request that was held.
        key: String,
    },

    /// The lease ended while the body was running: an operator force-released it
    /// ([`LockManager::force_release`](crate::LockManager::force_release), told at once),
    /// renewal found the lock gone or owned by someone else, renewal kept failing until the
    /// lease expired, or a lease without renewal reached its ttl. The body was stopped at its
    /// next await point.
    #[error(
        "lease on {keys:?} was lost while the body ran (deleted, force-released or taken over \
         in Redis, or expired before it could be renewed); the body was stopped and its effects \
         may be partial: use the fencing token to reject its late writes, and raise `ttl` or \
         enable `renew` if bodies outlive their lease"
    )]
    LeaseLost {
        /// The keys of the lost lease.
        keys: Vec<String>,
    },

    /// Redis granted the lock, but its answer arrived after the lease it granted had already
    /// expired (counted from before the request was sent, less the drift margin): Redis, or
    /// the way to it, was slower than the ttl. The keys are released; the body did not run.
    #[error(
        "Redis answered the acquire of {keys:?} after {after:?}, when the lease it granted \
         (ttl {ttl:?}) had already expired; the keys are released: give the lock a ttl well \
         above Redis's response time, or find out why Redis is slow"
    )]
    AnsweredTooLate {
        /// The keys of the request.
        keys: Vec<String>,
        /// How long the answer took.
        after: Duration,
        /// The lease's ttl.
        ttl: Duration,
    },

    /// Redis could not be reached, or answered with an error that retrying later may cure
    /// (out of memory, loading its data, busy with a script, a cluster or replica without its
    /// primary). The message says which, and what to check.
    #[error("Redis {op} failed: {source}; {}", advice(source))]
    Redis {
        /// What distlock was doing.
        op: &'static str,
        /// The error from the Redis client.
        #[source]
        source: redis::RedisError,
    },

    /// Redis (or the connection pool) did not answer within the configured timeout.
    #[error(
        "Redis {op} got no answer within {after:?}: the server is down, overloaded or \
         unreachable; check it, or raise the manager's timeouts"
    )]
    RedisTimeout {
        /// What distlock was doing.
        op: &'static str,
        /// The timeout that ran out.
        after: Duration,
    },

    /// Redis refused the manager's settings: wrong credentials, an ACL user without a right
    /// distlock needs, a database the server does not have, or a server older than 7.0; or a
    /// TLS connection could not be opened because a certificate was refused, the server's or
    /// this client's. Retrying does not help: fix what [`Misconfiguration`] names. Check
    /// settings at startup with [`LockManager::ping`](crate::LockManager::ping).
    #[error(
        "{}",
        if problem.is_tls() {
            format!("distlock's {op} could not open a TLS connection: {problem}; the TLS error: {source}")
        } else if detail.is_empty() {
            format!("Redis refused distlock's {op}: {problem}; Redis said: {source}")
        } else {
            format!("Redis refused distlock's {op}: {problem}; {detail}; Redis said: {source}")
        }
    )]
    Misconfigured {
        /// What distlock was doing.
        op: &'static str,
        /// What is wrong, and what to fix.
        problem: Misconfiguration,
        /// What exactly, when distlock can tell (empty otherwise): for an ACL user, the
        /// commands it may not run and the `ACL SETUSER` line that grants them.
        detail: String,
        /// The error from Redis.
        #[source]
        source: redis::RedisError,
    },

    /// A Redis key where distlock keeps a lock's data holds a value of another type: another
    /// program wrote it under the manager's prefix. Retrying does not help, and Redis is fine:
    /// delete the key, or give distlock a prefix of its own
    /// ([`LockManagerBuilder::prefix`](crate::LockManagerBuilder::prefix)).
    #[error(
        "distlock's {op} found {}, not distlock's data: another program wrote it under \
         distlock's prefix; delete it, or give distlock a prefix of its own \
         (LockManagerBuilder::prefix)",
        if key.is_empty() {
            "one of the lock's Redis keys holding a value of another type".to_owned()
        } else {
            format!("the Redis key `{key}` holding {found}")
        }
    )]
    WrongType {
        /// What distlock was doing.
        op: &'static str,
        /// The Redis key (with the prefix); empty when Redis would not say which.
        key: String,
        /// What it holds instead (`a list`, `a hash`, ...).
        found: String,
    },

    /// No [`LockManager`](crate::LockManager) was given and none was installed with
    /// [`set_default_manager`](crate::set_default_manager).
    #[error(
        "no lock manager configured: call distlock_runtime::set_default_manager(manager) at \
         startup, or pass one with `manager = ...`"
    )]
    NotConfigured,

    /// A quorum manager could not get a majority of its nodes to answer (or to grant an
    /// acquire that no other owner holds): too many nodes are down, hung or refusing. Nothing is
    /// left held.
    #[error(
        "distlock's {op} got {granted} of the {needed} nodes it needs (a majority of {nodes}); \
         check that a majority of the quorum's Redis nodes are up and reachable{}",
        first_failure.as_ref().map(|e| format!("; first failure: {e}")).unwrap_or_default()
    )]
    NoQuorum {
        /// What was being done.
        op: &'static str,
        /// How many nodes answered (or granted, for an acquire).
        granted: usize,
        /// A majority.
        needed: usize,
        /// How many nodes the quorum has.
        nodes: usize,
        /// The first node failure, if any.
        first_failure: Option<Box<LockError>>,
    },

    /// `min_replicas` was set and fewer replicas than that confirmed an acquire or extend
    /// (`WAIT`) within the replica timeout. An acquire was undone (no lock is left behind); an
    /// extension stays applied on the primary but is not counted (renewal tries again).
    ///
    /// An acquire that fails while the replicas confirm nothing says so, never contention: one
    /// that took its keys fails with this at once, and a wait (or a try-lock) whose last
    /// attempt found a key held, and whose `WAIT` too few replicas answered, ends with this
    /// too, not with [`LockError::Timeout`] (or [`LockError::NotAcquired`]). While the
    /// replicas confirm nothing no acquire can count, and the holder it found may itself be an
    /// acquire waiting for its replicas (which it then undoes), so "busy" would send the caller
    /// to wait for nothing. A wait that found the key held by a holder the replicas confirmed
    /// ends with `Timeout` as usual.
    #[error(
        "Redis applied distlock's {op}, but only {acked} of the {needed} replicas required \
         (min_replicas) confirmed it within {within:?}, so it does not count (an acquire was \
         undone); check the replicas (INFO replication: are they connected, how far behind?), \
         or raise replica_timeout"
    )]
    Replication {
        /// What was being done (`acquire`, `renew`, `extend`).
        op: &'static str,
        /// How many replicas confirmed it.
        acked: usize,
        /// How many were required.
        needed: usize,
        /// How long they were waited for: the replica timeout, or less for an attempt near
        /// the end of a wait (which ends by its deadline plus one response timeout).
        within: Duration,
    },

    /// A lock key is unusable (empty, for example).
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A duration or size given to a lock or to the builder is out of range.
    #[error("invalid {what}: {reason}")]
    InvalidConfig {
        /// Which setting (`ttl`, `response_timeout`, ...).
        what: &'static str,
        /// What is wrong, and what range is accepted.
        reason: String,
    },

    /// The Redis URL could not be used. The message never contains the URL's password.
    #[error("invalid Redis URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it (without the URL's credentials).
        reason: String,
    },
}

impl LockError {
    /// Which of the four kinds of failure this is: each variant is in exactly one, and a
    /// service answers each kind the same way whatever the variant (see [`ErrorClass`]).
    ///
    /// ```no_run
    /// use distlock_runtime::ErrorClass;
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// if let Err(e) = locks.lock("order:42").run(async { /* ... */ }).await {
    ///     let status = match e.class() {
    ///         ErrorClass::Contention => 409,
    ///         ErrorClass::Unavailable => 503,
    ///         _ => 500, // misconfigured, or a bug in the caller: retrying will not help
    ///     };
    ///     println!("{status}: {e}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Timeout { .. } | Self::NotAcquired { .. } => ErrorClass::Contention,
            Self::LeaseLost { .. }
            | Self::AnsweredTooLate { .. }
            | Self::Redis { .. }
            | Self::RedisTimeout { .. }
            | Self::NoQuorum { .. }
            | Self::Replication { .. } => ErrorClass::Unavailable,
            Self::Misconfigured { .. }
            | Self::WrongType { .. }
            | Self::NotConfigured
            | Self::InvalidConfig { .. }
            | Self::InvalidUrl { .. } => ErrorClass::Misconfigured,
            Self::HeldByThisTask { .. }
            | Self::UpgradeNotSupported { .. }
            | Self::LockOrderInversion { .. }
            | Self::InvalidKey { .. } => ErrorClass::CallerBug,
        }
    }

    /// True when the error says the lock is held by someone else (a try-lock that failed or a
    /// wait that timed out): the caller may answer "busy" and try again later
    /// ([`ErrorClass::Contention`]).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// match locks.lock("order:42").run(async { /* ... */ }).await {
    ///     Err(e) if e.is_contention() => println!("busy, try again later"), // HTTP 409
    ///     other => other?,
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_contention(&self) -> bool {
        self.class() == ErrorClass::Contention
    }

    /// True when Redis could not be asked (unreachable, erroring or not answering in time, a
    /// quorum without a majority, replicas that did not confirm in time), or could not keep
    /// the lease while the body ran ([`LockError::LeaseLost`]): worth retrying later
    /// ([`ErrorClass::Unavailable`]). Not for a refusal ([`LockError::Misconfigured`],
    /// [`LockError::WrongType`]): Redis answered, and retrying will not help.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// match locks.lock("order:42").run(async { /* ... */ }).await {
    ///     Err(e) if e.is_unavailable() => println!("Redis unavailable: {e}"), // HTTP 503
    ///     other => other?,
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_unavailable(&self) -> bool {
        self.class() == ErrorClass::Unavailable
    }

    /// True when the manager's settings, or the deployment, are wrong for its Redis
    /// ([`LockError::Misconfigured`], [`LockError::WrongType`]), or were refused before any
    /// request ([`LockError::InvalidUrl`], [`LockError::InvalidConfig`],
    /// [`LockError::NotConfigured`]): retrying will not help ([`ErrorClass::Misconfigured`]).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), distlock_runtime::LockError> {
    /// let locks = distlock_runtime::LockManager::from_url("redis://app:secret@127.0.0.1:6379/2")?;
    /// if let Err(e) = locks.ping().await {
    ///     if e.is_misconfigured() {
    ///         eprintln!("fix the lock settings, retrying will not help: {e}");
    ///     }
    ///     return Err(e);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_misconfigured(&self) -> bool {
        self.class() == ErrorClass::Misconfigured
    }

    /// True when the calling code used the lock wrongly: an `acquire` that would wait for a key
    /// its own task holds ([`LockError::HeldByThisTask`]), an exclusive call inside a shared
    /// hold of its key ([`LockError::UpgradeNotSupported`]), a nesting in a lock order that
    /// deadlocks ([`LockError::LockOrderInversion`]), an unusable key
    /// ([`LockError::InvalidKey`]). A bug to fix ([`ErrorClass::CallerBug`]).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// if let Err(e) = locks.lock("").acquire().await {
    ///     assert!(e.is_caller_bug()); // an empty key
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_caller_bug(&self) -> bool {
        self.class() == ErrorClass::CallerBug
    }

    /// The same error, told of `op` (a failure shared by calls doing different things: a
    /// dial several calls waited for).
    pub(crate) fn with_op(mut self, op: &'static str) -> Self {
        match &mut self {
            Self::Redis { op: at, .. }
            | Self::RedisTimeout { op: at, .. }
            | Self::Misconfigured { op: at, .. }
            | Self::WrongType { op: at, .. }
            | Self::NoQuorum { op: at, .. }
            | Self::Replication { op: at, .. } => *at = op,
            _ => {}
        }
        self
    }

    /// The Redis error behind this one, if Redis (or the client) reported one.
    pub(crate) fn redis_source(&self) -> Option<&redis::RedisError> {
        match self {
            Self::Redis { source, .. } | Self::Misconfigured { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The error for `source`, a failed request of `op`, by its [`Reply`]:
    /// [`LockError::Misconfigured`] when Redis refused the manager's settings,
    /// [`LockError::WrongType`] for a key of another type (named by the caller, which knows the
    /// keys: see `refusal.rs`), else [`LockError::Redis`].
    pub(crate) fn from_redis(op: &'static str, source: redis::RedisError) -> Self {
        match Reply::of(&source) {
            Reply::Refused(problem) => Self::Misconfigured {
                op,
                problem,
                detail: String::new(),
                source,
            },
            // Which key, the caller finds out (see `refusal.rs`).
            Reply::WrongType => Self::WrongType {
                op,
                key: String::new(),
                found: String::new(),
            },
            _ => Self::Redis { op, source },
        }
    }
}

/// The four kinds of [`LockError`], from [`LockError::class`]: what a caller does about a
/// failure depends on its kind alone.
///
/// | class | variants | what to do | HTTP |
/// |---|---|---|---|
/// | `Contention` | `Timeout`, `NotAcquired` | somebody else holds the lock: try again later | 409 Conflict |
/// | `Unavailable` | `Redis`, `RedisTimeout`, `NoQuorum`, `Replication`, `LeaseLost`, `AnsweredTooLate` | Redis could not be asked, or could not keep the lease: try again later | 503 Service Unavailable |
/// | `Misconfigured` | `Misconfigured`, `WrongType`, `InvalidUrl`, `InvalidConfig`, `NotConfigured` | the settings or the deployment are wrong: retrying never helps, an operator must fix them | 500 Internal Server Error |
/// | `CallerBug` | `HeldByThisTask`, `UpgradeNotSupported`, `LockOrderInversion`, `InvalidKey` | the calling code used the lock wrongly: fix the code | 500 Internal Server Error |
///
/// With the cargo feature `axum`, `LockError`'s `IntoResponse` answers with these statuses (its
/// docs say which headers and bodies go with them, and what is logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Somebody else holds the lock.
    Contention,
    /// Redis could not be asked, or could not keep the lease while the body ran.
    Unavailable,
    /// The settings or the deployment are wrong; retrying never helps.
    Misconfigured,
    /// The calling code used the lock wrongly.
    CallerBug,
}

/// What a Redis error means to distlock: the one classification of every error reply (and of
/// the client's own errors), for a command and for a script alike, which says which
/// [`LockError`] it becomes and, through the retry policy (`retry.rs`), whether it is sent
/// again. The crate docs' table ("Redis errors") lists each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The connection broke, timed out, or could not be opened: an outage. A request on a
    /// connection that had died while idle is sent again on a fresh one (see `topology/link.rs`).
    Connection,
    /// `MOVED`, `ASK`: the cluster router follows it. On a link that does not route (one
    /// server, a quorum node, a Sentinel primary) it means the URL names a cluster node:
    /// [`Misconfiguration::ClusterNode`].
    Redirect(Redirect),
    /// `CROSSSLOT`: a call's keys are in several slots, which only a cluster node refuses (the
    /// cluster router never sends such a call): [`Misconfiguration::ClusterNode`] on a link
    /// that does not route, an outage on one that does.
    CrossSlot,
    /// `TRYAGAIN`, `CLUSTERDOWN`: a cluster re-sharding or failing over refused it before
    /// running it; the cluster router sends it again within the response timeout.
    Resharding,
    /// `LOADING`, `BUSY`, `MASTERDOWN`: a server loading its data, busy with a script, or a
    /// replica cut off from its primary refused it before running it; sent again, 20 ms
    /// apart, within the response timeout.
    Passing,
    /// `READONLY`: a replica refused a write. Followed on Sentinel and Cluster (the primary is
    /// found again); elsewhere sent once more on a fresh connection, then
    /// [`Misconfiguration::Replica`].
    ReadOnly,
    /// `NOSCRIPT`: the script is sent again whole (`EVAL`).
    NoScript,
    /// Settings Redis refused: credentials, an ACL right (`NOPERM`, also raised inside a
    /// script), a database, the server's version, a TLS certificate.
    Refused(Misconfiguration),
    /// `WRONGTYPE`: a key distlock writes holds another type.
    WrongType,
    /// `OOM` and anything else: an outage, not sent again.
    Other,
}

impl Reply {
    /// Classifies `error`.
    pub(crate) fn of(error: &redis::RedisError) -> Self {
        if let Some(problem) = Misconfiguration::of(error) {
            return Self::Refused(problem);
        }
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_timeout()
            || error.is_connection_refusal()
        {
            return Self::Connection;
        }
        match error.code() {
            Some(code @ ("MOVED" | "ASK")) => {
                let (to, _) = error.redirect_node().unwrap_or_default();
                let address =
                    |(host, port): (&str, &str)| Some((host.to_owned(), port.parse().ok()?));
                match to.rsplit_once(':').and_then(address) {
                    Some(to) if code == "MOVED" => Self::Redirect(Redirect::Moved(to)),
                    Some(to) => Self::Redirect(Redirect::Ask(to)),
                    None => Self::Other,
                }
            }
            Some("CROSSSLOT") => Self::CrossSlot,
            Some("TRYAGAIN" | "CLUSTERDOWN") => Self::Resharding,
            Some("LOADING" | "BUSY" | "MASTERDOWN") => Self::Passing,
            Some("READONLY") => Self::ReadOnly,
            Some("NOSCRIPT") => Self::NoScript,
            Some("WRONGTYPE") => Self::WrongType,
            _ if error.is_unrecoverable_error() => Self::Connection,
            _ => Self::Other,
        }
    }
}

/// What to check for a [`LockError::Redis`] caused by `source`.
fn advice(source: &redis::RedisError) -> &'static str {
    match source.code() {
        Some("OOM") => {
            "Redis is over its maxmemory and refuses writes: free memory, raise maxmemory, or \
             use a maxmemory-policy that evicts (volatile-*: every distlock key has a ttl)"
        }
        Some("LOADING") => "Redis is loading its data after a restart: it serves again once done",
        Some("BUSY") => {
            "a script is running too long on Redis and blocks every other command: end it \
             (SCRIPT KILL) or wait for it"
        }
        Some("MASTERDOWN") => {
            "the server is a replica that lost its primary (replica-serve-stale-data no): \
             point the manager at the primary"
        }
        Some("CLUSTERDOWN" | "TRYAGAIN") => {
            "the cluster is failing over or re-sharding the key's slot: it serves again once \
             done (check CLUSTER INFO if it does not)"
        }
        Some("READONLY") => {
            "a failover is under way: the primary the manager reached has become a replica"
        }
        _ => {
            "check that Redis is up, reachable at the manager's URL (rediss:// if the port \
             serves TLS), and a writable primary"
        }
    }
}

/// What is wrong with the manager's settings, in a [`LockError::Misconfigured`]. Its message says
/// what to fix.
///
/// ```no_run
/// use distlock_runtime::{LockError, Misconfiguration};
/// # async fn demo(locks: distlock_runtime::LockManager) {
/// if let Err(LockError::Misconfigured { problem, .. }) = locks.ping().await {
///     match problem {
///         Misconfiguration::Credentials => eprintln!("check REDIS_URL's user and password"),
///         other => eprintln!("Redis refused the lock settings: {other}"),
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Misconfiguration {
    /// The user name or password is wrong, or Redis wants one and none was given. (redis-rs
    /// reports every refused `AUTH` so, also one refused because the server is at its client
    /// limit; a background release therefore keeps retrying through it.)
    Credentials,
    /// The ACL user may not run a command, or touch a key, that distlock needs.
    Permissions,
    /// The database index in the URL is not one the server has.
    Database,
    /// The server is older than Redis 7.0.
    ServerVersion,
    /// This client does not trust the server's TLS certificate: signed by a CA it does not
    /// trust, issued for another host name, or expired.
    ServerCertificate,
    /// The server refused this client's TLS certificate, or wanted one and got none (mutual
    /// TLS).
    ClientCertificate,
    /// The URL names a read-only replica: a lock must be written to a primary.
    Replica,
    /// The URL names a Redis Cluster node, but the manager was built for one server: the node
    /// redirects (`MOVED`, `ASK`) or refuses (`CROSSSLOT`) the keys of the slots it does not
    /// serve.
    ClusterNode,
    /// The server, or a proxy in front of it, does not offer a command the manager's settings
    /// need (`ERR unknown command`): a managed service's limits, such as a proxy in front of a
    /// cluster that offers no `CLUSTER` command (build the manager with
    /// [`LockManagerBuilder::url`](crate::LockManagerBuilder::url) for it), or a serverless
    /// service without `WAIT` (build it without
    /// [`min_replicas`](crate::LockManagerBuilder::min_replicas)). The message names the command
    /// and what to configure instead.
    Unsupported,
}

impl Misconfiguration {
    /// Whether it is about TLS certificates (rather than something Redis refused).
    fn is_tls(self) -> bool {
        matches!(self, Self::ServerCertificate | Self::ClientCertificate)
    }

    /// Recognizes a refusal of the manager's settings among Redis errors.
    fn of(error: &redis::RedisError) -> Option<Self> {
        // What the server says of a client certificate (TLS alerts, as rustls shows them).
        const CLIENT_ALERTS: [&str; 7] = [
            "CertificateRequired",
            "BadCertificate",
            "UnknownCA",
            "CertificateUnknown",
            "UnsupportedCertificate",
            "CertificateExpired",
            "CertificateRevoked",
        ];
        let text = error.to_string();
        let code = error.code().unwrap_or_default();
        let said = |words: &[&str]| words.iter().any(|w| code == *w || text.contains(w));
        let (_, alert) = text
            .split_once("received fatal alert: ")
            .unwrap_or_default();
        if text.contains("invalid peer certificate") {
            Some(Self::ServerCertificate)
        } else if CLIENT_ALERTS.iter().any(|name| alert.starts_with(name)) {
            Some(Self::ClientCertificate)
        } else if error.kind() == redis::ErrorKind::AuthenticationFailed
            // The cluster client reports a refused AUTH inside an IO error of its own.
            || said(&["AuthenticationFailed", "WRONGPASS", "NOAUTH"])
        {
            Some(Self::Credentials)
        } else if said(&[
            "NOPERM",
            // Refused inside a script, the servers say so with `ERR`, each in its own words:
            // Redis 7.0 "The user executing the script can't run this command" ("... can't
            // access at least one of the keys", "... can't publish to the channel"); Redis 7.2
            // and later and Valkey "ACL failure in script: User u has no permissions to run
            // the 'time' command" ("...: No permissions to access a key", "... a channel").
            "The user executing the script can't",
            "ACL failure in script",
        ]) {
            Some(Self::Permissions)
        } else if unknown_command(&text) {
            Some(Self::Unsupported)
        } else if text.contains("DB index is out of range") {
            Some(Self::Database)
        } else if text.contains("not allowed in cluster mode") {
            // `SELECT 2` (a URL's database) on a cluster node.
            Some(Self::ClusterNode)
        } else if text.contains("Error compiling script") && text.contains("'#'") {
            // Redis before 7.0 cannot compile a script that declares itself with `#!lua`.
            Some(Self::ServerVersion)
        } else {
            None
        }
    }
}

/// Whether a server's `text` says it does not know a command: `ERR unknown command 'WAIT',
/// with args beginning with: ...` from a proxy or a managed service that does not offer it (or
/// a server that renamed it away); inside a script, Redis's `ERR Unknown Redis command called
/// from script`, Valkey's `ERR Unknown command called from script`.
fn unknown_command(text: &str) -> bool {
    let text = text.to_lowercase();
    text.contains("unknown command") || text.contains("unknown redis command")
}

impl std::fmt::Display for Misconfiguration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Credentials => {
                "wrong or missing credentials: check the user and password in the manager's URL \
                 (redis://user:password@host:port)"
            }
            Self::Permissions => {
                "the ACL user lacks a right distlock needs: grant the commands and the keys under \
                 the manager's prefix given in the crate docs (\"Least-privilege ACL user\")"
            }
            Self::Database => {
                "the database index in the URL does not exist on this server: use one below its \
                 `databases` setting (16 by default)"
            }
            Self::ServerVersion => "distlock needs Redis 7.0 or newer: upgrade the server",
            Self::ServerCertificate => {
                "this client does not trust the server's certificate: give the CA that signed it \
                 with LockManagerBuilder::tls_ca_pem (without it, the system's root CAs are \
                 trusted), and check that the certificate names the host in the URL and has not \
                 expired"
            }
            Self::ClientCertificate => {
                "the server wants a client certificate (mutual TLS) and refused this one, or got \
                 none: give one its CA signed, with its key, with \
                 LockManagerBuilder::tls_client_cert_pem"
            }
            Self::Replica => {
                "the server at the manager's URL is a read-only replica: point the manager at \
                 the primary, or let it find the primary (LockManagerBuilder::sentinel, \
                 LockManagerBuilder::cluster)"
            }
            Self::ClusterNode => {
                "the server at the manager's URL is a Redis Cluster node, which serves only the \
                 keys of its own slots: build the manager with \
                 LockManagerBuilder::cluster([its URL, ...]) (the distlock tool: --cluster URL), \
                 which routes each key to its node"
            }
            Self::Unsupported => {
                "the server, or a proxy or managed service in front of it, does not offer a \
                 command distlock sends (renamed away, or refused by a proxy): if a setting of \
                 the manager needs it, configure the manager without it, as said below; else \
                 distlock cannot run on this deployment as it is"
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant is in exactly one class; a variant added later must be given one here too
    /// (the list is checked to name every variant by an exhaustive match).
    #[test]
    fn every_variant_is_in_exactly_one_class() {
        let source = || redis::RedisError::from((redis::ErrorKind::Io, "test"));
        let key = || "k".to_owned();
        let cases = [
            (
                LockError::Timeout {
                    key: key(),
                    waited: Duration::ZERO,
                },
                ErrorClass::Contention,
            ),
            (
                LockError::NotAcquired { key: key() },
                ErrorClass::Contention,
            ),
            (
                LockError::HeldByThisTask { key: key() },
                ErrorClass::CallerBug,
            ),
            (
                LockError::UpgradeNotSupported { key: key() },
                ErrorClass::CallerBug,
            ),
            (
                LockError::LockOrderInversion {
                    held: "a:{}".to_owned(),
                    wanted: "b:{}".to_owned(),
                },
                ErrorClass::CallerBug,
            ),
            (
                LockError::InvalidKey {
                    key: key(),
                    reason: "empty",
                },
                ErrorClass::CallerBug,
            ),
            (
                LockError::LeaseLost { keys: vec![key()] },
                ErrorClass::Unavailable,
            ),
            (
                LockError::AnsweredTooLate {
                    keys: vec![key()],
                    after: Duration::ZERO,
                    ttl: Duration::ZERO,
                },
                ErrorClass::Unavailable,
            ),
            (
                LockError::Redis {
                    op: "t",
                    source: source(),
                },
                ErrorClass::Unavailable,
            ),
            (
                LockError::RedisTimeout {
                    op: "t",
                    after: Duration::ZERO,
                },
                ErrorClass::Unavailable,
            ),
            (
                LockError::NoQuorum {
                    op: "t",
                    granted: 1,
                    needed: 2,
                    nodes: 3,
                    first_failure: None,
                },
                ErrorClass::Unavailable,
            ),
            (
                LockError::Replication {
                    op: "t",
                    acked: 0,
                    needed: 1,
                    within: Duration::ZERO,
                },
                ErrorClass::Unavailable,
            ),
            (
                LockError::Misconfigured {
                    op: "t",
                    problem: Misconfiguration::Permissions,
                    detail: String::new(),
                    source: source(),
                },
                ErrorClass::Misconfigured,
            ),
            (
                LockError::WrongType {
                    op: "t",
                    key: key(),
                    found: "a list".to_owned(),
                },
                ErrorClass::Misconfigured,
            ),
            (LockError::NotConfigured, ErrorClass::Misconfigured),
            (
                LockError::InvalidConfig {
                    what: "ttl",
                    reason: String::new(),
                },
                ErrorClass::Misconfigured,
            ),
            (
                LockError::InvalidUrl {
                    reason: String::new(),
                },
                ErrorClass::Misconfigured,
            ),
        ];
        let mut named = std::collections::HashSet::new();
        for (error, class) in &cases {
            assert_eq!(error.class(), *class, "{error:?}");
            let predicates = [
                error.is_contention(),
                error.is_unavailable(),
                error.is_misconfigured(),
                error.is_caller_bug(),
            ];
            assert_eq!(predicates.iter().filter(|&&p| p).count(), 1, "{error:?}");
            // No wildcard: a new variant fails to compile here until it is listed above.
            named.insert(match error {
                LockError::Timeout { .. } => "Timeout",
                LockError::NotAcquired { .. } => "NotAcquired",
                LockError::HeldByThisTask { .. } => "HeldByThisTask",
                LockError::UpgradeNotSupported { .. } => "UpgradeNotSupported",
                LockError::LockOrderInversion { .. } => "LockOrderInversion",
                LockError::InvalidKey { .. } => "InvalidKey",
                LockError::LeaseLost { .. } => "LeaseLost",
                LockError::AnsweredTooLate { .. } => "AnsweredTooLate",
                LockError::Redis { .. } => "Redis",
                LockError::RedisTimeout { .. } => "RedisTimeout",
                LockError::NoQuorum { .. } => "NoQuorum",
                LockError::Replication { .. } => "Replication",
                LockError::Misconfigured { .. } => "Misconfigured",
                LockError::WrongType { .. } => "WrongType",
                LockError::NotConfigured => "NotConfigured",
                LockError::InvalidConfig { .. } => "InvalidConfig",
                LockError::InvalidUrl { .. } => "InvalidUrl",
            });
        }
        assert_eq!(named.len(), cases.len(), "each variant listed once");
    }

    #[test]
    fn errors_inside_and_outside_scripts_are_classified_alike() {
        // As the client reads them off the wire.
        let server = |code: &str, text: &str| {
            let reply = format!("-{code} {text}\r\n");
            let value = redis::parse_redis_value(reply.as_bytes()).unwrap();
            value.extract_error().unwrap_err()
        };
        let cases = [
            (
                server(
                    "NOPERM",
                    "this user has no permissions to run the 'time' command",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            (
                server(
                    "ERR",
                    "The user executing the script can't run this command or subcommand script: \
                     4959c9, on @user_script:3.",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            // Refused inside a script, in the words of Redis 7.2 and later and Valkey (the
            // lines below are theirs, read off Redis 8.2.3 and Valkey 8.1.8), and outside one.
            (
                server(
                    "ERR",
                    "ACL failure in script: User u has no permissions to run the 'time' command \
                     script: 104ae6, on @user_script:1.",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            (
                server(
                    "ERR",
                    "ACL failure in script: No permissions to access a key script: cbaa9c, on \
                     @user_script:1.",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            (
                server(
                    "ERR",
                    "ACL failure in script: No permissions to access a channel script: 8f9536, \
                     on @user_script:1.",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            (
                server(
                    "NOPERM",
                    "User u has no permissions to run the 'set' command",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            (
                server("NOPERM", "No permissions to access a key"),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            // Redis 7.0's words for a key and a channel refused inside a script.
            (
                server(
                    "ERR",
                    "The user executing the script can't access at least one of the keys \
                     mentioned in the command arguments script: cbaa9c, on @user_script:1.",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            (
                server(
                    "ERR",
                    "The user executing the script can't publish to the channel mentioned in \
                     the command script: 8f9536, on @user_script:1.",
                ),
                Reply::Refused(Misconfiguration::Permissions),
            ),
            (
                server(
                    "WRONGTYPE",
                    "Operation against a key holding the wrong kind of value",
                ),
                Reply::WrongType,
            ),
            (
                server(
                    "WRONGTYPE",
                    "Operation against a key holding the wrong kind of value script: 4959c9, on \
                     @user_script:1.",
                ),
                Reply::WrongType,
            ),
            (
                server("LOADING", "Redis is loading the dataset in memory"),
                Reply::Passing,
            ),
            (
                server("BUSY", "Redis is busy running a script."),
                Reply::Passing,
            ),
            (
                server("MASTERDOWN", "Link with MASTER is down"),
                Reply::Passing,
            ),
            (
                server("READONLY", "You can't write against a read only replica."),
                Reply::ReadOnly,
            ),
            (server("NOSCRIPT", "No matching script."), Reply::NoScript),
            (
                server("NOSCRIPT", "No matching script. Please use EVAL."),
                Reply::NoScript,
            ),
            (
                server("TRYAGAIN", "Multiple keys request during rehashing of slot"),
                Reply::Resharding,
            ),
            (
                server("CLUSTERDOWN", "The cluster is down"),
                Reply::Resharding,
            ),
            (
                server("MOVED", "3999 127.0.0.1:6381"),
                Reply::Redirect(Redirect::Moved(("127.0.0.1".to_owned(), 6381))),
            ),
            (
                server("ASK", "3999 127.0.0.1:6381"),
                Reply::Redirect(Redirect::Ask(("127.0.0.1".to_owned(), 6381))),
            ),
            (
                server("CROSSSLOT", "Keys in request don't hash to the same slot"),
                Reply::CrossSlot,
            ),
            (
                server("ERR", "SELECT is not allowed in cluster mode"),
                Reply::Refused(Misconfiguration::ClusterNode),
            ),
            (
                server("OOM", "command not allowed when used memory > 'maxmemory'."),
                Reply::Other,
            ),
            (
                server("WRONGPASS", "invalid username-password pair"),
                Reply::Refused(Misconfiguration::Credentials),
            ),
            // What proxies and managed services answer for a command they do not offer.
            (
                server(
                    "ERR",
                    "unknown command 'WAIT', with args beginning with: '1' '500' ",
                ),
                Reply::Refused(Misconfiguration::Unsupported),
            ),
            (
                server("ERR", "unknown command 'cluster'"),
                Reply::Refused(Misconfiguration::Unsupported),
            ),
            // A command renamed away, called from a script: Redis's words, then Valkey's.
            (
                server(
                    "ERR",
                    "Unknown Redis command called from script script: 104ae6, on \
                     @user_script:1.",
                ),
                Reply::Refused(Misconfiguration::Unsupported),
            ),
            (
                server(
                    "ERR",
                    "Unknown command called from script script: 104ae6, on @user_script:1.",
                ),
                Reply::Refused(Misconfiguration::Unsupported),
            ),
            (
                server("NOAUTH", "Authentication required."),
                Reply::Refused(Misconfiguration::Credentials),
            ),
        ];
        for (error, reply) in cases {
            assert_eq!(Reply::of(&error), reply, "{error}");
        }
        let io =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(Reply::of(&io), Reply::Connection);
    }
}
