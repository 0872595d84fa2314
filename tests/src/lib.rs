//! Test harness: real `redis-server` processes on free loopback ports, one per test.
//!
//! The servers and topologies are the runtime's `testing` module (the helper distlock's users
//! test with), so every run of this suite exercises it; the harness makes their errors panics
//! and adds what only distlock's own tests need. A [`RedisServer`] runs with persistence off,
//! can be paused (SIGSTOP), resumed, killed and restarted on the same port, and is stopped (by
//! its pid) when dropped. Tests never touch the machine's shared Redis. [`topology`] starts
//! several of them as a Redis Cluster, a Sentinel group or a set of independent servers;
//! [`tls`] makes certificates and starts servers that serve TLS with them.

pub mod history;
pub mod partition;
pub mod stays;
pub mod tls;
pub mod topology;

use std::time::{Duration, Instant};

use distlock_runtime::testing::{TestRedis, TestRedisError};
use distlock_runtime::LockManager;
use ref_cast::RefCast;

/// The commands distlock's scripts run inside them, and `INFO`: [`RedisServer::requests`]
/// counts every other command of `INFO commandstats` as a client request, so each distlock
/// request counts once (the benchmark program counts the same way).
pub const NOT_REQUESTS: [&str; 26] = [
    "get",
    "set",
    "pttl",
    "del",
    "pexpire",
    "pexpireat",
    "publish",
    "info",
    "exists",
    "time",
    "hdel",
    "hget",
    "hset",
    "hexists",
    "lrem",
    "lpop",
    "lindex",
    "llen",
    "rpush",
    "zadd",
    "zcard",
    "zcount",
    "zrange",
    "zrem",
    "zremrangebyscore",
    "zscore",
];

/// A test's `redis-server`: the runtime's [`TestRedis`] (so distlock's own suite runs on the
/// helper its users test with), whose fallible methods panic with the error's message, as a
/// test wants, and which adds counters for assertions. It dereferences to the [`TestRedis`].
#[derive(RefCast)]
#[repr(transparent)]
pub struct RedisServer(TestRedis);

/// The value of `result`, or a panic with its error's message (which says what to do).
#[track_caller]
fn ok<T>(result: Result<T, TestRedisError>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers (as itself: its
    /// `INFO server` names its pid).
    ///
    /// # Panics
    /// When `redis-server` is not on PATH or no server could be started.
    pub fn start() -> Self {
        Self(ok(TestRedis::start_blocking()))
    }

    /// Starts a server with `extra` arguments after the harness's own (`--maxmemory 1mb`,
    /// say), and waits until it answers.
    ///
    /// # Panics
    /// When `redis-server` is not on PATH or no server could be started.
    pub fn start_with(extra: &[&str]) -> Self {
        Self(ok(TestRedis::builder().args(extra).start_blocking()))
    }

    /// A replica of `primary`, once its first synchronisation has finished.
    ///
    /// # Panics
    /// When the replica does not come up or does not catch up within 10 s.
    pub fn start_replica_of(primary: &RedisServer) -> Self {
        Self(ok(TestRedis::builder()
            .replica_of(primary)
            .start_blocking()))
    }

    /// A view of the runtime's server as the harness's.
    pub fn of(server: &TestRedis) -> &Self {
        Self::ref_cast(server)
    }

    /// A view of the runtime's server as the harness's, to kill, pause or restart it.
    pub fn of_mut(server: &mut TestRedis) -> &mut Self {
        Self::ref_cast_mut(server)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.0.port()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.0.url()
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.0.pid()
    }

    /// A manager with 2 s timeouts: short enough to fail a test quickly, long enough never to
    /// fire on a loaded CI machine.
    pub fn manager(&self) -> LockManager {
        self.0.manager()
    }

    /// A manager whose holder label is `label` (a candidate's name, as observers see it).
    ///
    /// # Panics
    /// If the builder rejects the URL (it never should).
    pub fn labelled(&self, label: &str) -> LockManager {
        self.manager_builder()
            .holder_label(label)
            .build()
            .expect("a labelled manager")
    }

    /// The builder behind [`RedisServer::manager`], to adjust before building.
    pub fn manager_builder(&self) -> distlock_runtime::LockManagerBuilder {
        self.0.manager_builder()
    }

    /// A builder whose connect, response and pool-wait timeouts are all `timeout`.
    pub fn manager_with_timeouts(&self, timeout: Duration) -> distlock_runtime::LockManagerBuilder {
        manager_at(&self.url(), timeout)
    }

    /// A plain async client connection, for assertions and for meddling with keys.
    ///
    /// # Panics
    /// If the server cannot be reached.
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// Runs one command on a fresh blocking connection and returns its raw RESP reply.
    ///
    /// A fresh connection has written nothing, so a `WAIT` sent this way returns at once: send
    /// it after the writes it is to wait for, with [`RedisServer::commands`].
    ///
    /// # Panics
    /// If the server cannot be reached.
    pub fn command(&self, args: &[&str]) -> String {
        ok(self.0.command(args))
    }

    /// Runs `commands` in order on one fresh blocking connection (`SET` then `WAIT 1 1000`, say)
    /// and returns their raw RESP replies.
    ///
    /// # Panics
    /// If the server cannot be reached.
    pub fn commands(&self, commands: &[&[&str]]) -> Vec<String> {
        ok(self.0.commands(commands))
    }

    /// Field `name` of the server's `INFO server` (`redis_version`, and Valkey's
    /// `valkey_version`), if it has it.
    ///
    /// # Panics
    /// If the server cannot be reached.
    pub fn info_field(&self, name: &str) -> Option<String> {
        let info = self.command(&["INFO", "server"]);
        let prefix = format!("{name}:");
        info.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .map(|value| value.trim().to_owned())
    }

    /// How many requests clients sent, from `INFO commandstats`: every command counts except
    /// INFO itself and those that run inside distlock's scripts (`GET`, `SET`, `PTTL`, `TIME`,
    /// the fair queue's commands and the rest), so each distlock request counts once. A test's
    /// own commands of those kinds are not counted either.
    pub fn requests(&self) -> u64 {
        let info = self.command(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|line| {
                let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                if NOT_REQUESTS.contains(&name) {
                    return None;
                }
                let calls = stats.split("calls=").nth(1)?;
                calls.split(',').next()?.parse::<u64>().ok()
            })
            .sum()
    }

    /// How many script calls (`EVALSHA`: acquires, releases, extensions, renewals) clients sent,
    /// from `INFO commandstats`.
    pub fn script_calls(&self) -> u64 {
        let info = self.command(&["INFO", "commandstats"]);
        info.lines()
            .find_map(|line| {
                let stats = line.strip_prefix("cmdstat_evalsha:")?;
                stats
                    .split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// How many error replies of kind `code` (`MOVED`, `NOPERM`: the reply's first word) the
    /// server has sent since it started, from `INFO errorstats`.
    pub fn errors_replied(&self, code: &str) -> u64 {
        let info = self.command(&["INFO", "errorstats"]);
        let prefix = format!("errorstat_{code}:count=");
        info.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str())?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Stops the process with SIGSTOP: connections stay open, nothing is answered.
    pub fn pause(&mut self) {
        ok(self.0.pause());
    }

    /// Continues a paused server.
    pub fn resume(&mut self) {
        ok(self.0.resume());
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        self.0.kill();
    }

    /// Kills the server and starts an empty one on the same port.
    ///
    /// # Panics
    /// If the new server does not come up.
    pub fn restart(&mut self) {
        ok(self.0.restart());
    }
}

impl From<TestRedis> for RedisServer {
    fn from(server: TestRedis) -> Self {
        Self(server)
    }
}

impl std::ops::Deref for RedisServer {
    type Target = TestRedis;

    fn deref(&self) -> &TestRedis {
        &self.0
    }
}

impl std::ops::DerefMut for RedisServer {
    fn deref_mut(&mut self) -> &mut TestRedis {
        &mut self.0
    }
}

/// A builder for the Redis at `url` (a [`Proxy`], a stand-in server) whose connect, response and
/// pool-wait timeouts are all `timeout`.
pub fn manager_at(url: &str, timeout: Duration) -> distlock_runtime::LockManagerBuilder {
    LockManager::builder()
        .url(url)
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .pool_wait_timeout(timeout)
}

/// `builder` set to the deployment a worker process's `TOPOLOGY` argument names:
/// `url=URL`, `cluster=URL,URL,...`, `sentinel=NAME@URL,URL,...` or `quorum=URL,URL,...`.
///
/// # Errors
/// A `TOPOLOGY` of another form, with the forms it takes.
pub fn with_topology(
    builder: distlock_runtime::LockManagerBuilder,
    topology: &str,
) -> Result<distlock_runtime::LockManagerBuilder, String> {
    let (kind, spec) = topology
        .split_once('=')
        .ok_or("topology: url=, cluster=, sentinel= or quorum=")?;
    let urls = |list: &str| list.split(',').map(str::to_owned).collect::<Vec<_>>();
    Ok(match kind {
        "url" => builder.url(spec),
        "cluster" => builder.cluster(urls(spec)),
        "quorum" => builder.quorum(urls(spec)),
        "sentinel" => {
            let (name, list) = spec.split_once('@').ok_or("sentinel=NAME@URL,...")?;
            builder.sentinel(name, urls(list))
        }
        other => return Err(format!("unknown topology {other}")),
    })
}

/// Tests in one binary run in parallel. Those that assert tight timings hold [`timed`] and
/// those that load both cores hold [`heavy`], so a timing is never measured while another test
/// of the same binary saturates the machine. Light tests take neither.
static LOAD: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Held by a test that asserts tight timings (they may run together).
pub async fn timed() -> tokio::sync::RwLockReadGuard<'static, ()> {
    LOAD.read().await
}

/// Held by a test that loads the machine (many tasks or processes): it runs alone.
pub async fn heavy() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    LOAD.write().await
}

/// Two leases on `key`, one after the other: the first (`stale`, 50 ms, no renewal) runs out,
/// then the second (`current`, 5 s, no renewal) takes the lock. The stale one's owner still has
/// its `Lease` value: what it may no longer do is what the ownership tests check.
pub async fn outlived(
    locks: &LockManager,
    key: &str,
) -> (distlock_runtime::Lease, distlock_runtime::Lease) {
    let stale = locks
        .lock(key)
        .ttl(Duration::from_millis(50))
        .renew(false)
        .acquire()
        .await
        .expect("first lease");
    tokio::time::sleep(Duration::from_millis(80)).await;
    let current = locks
        .lock(key)
        .ttl(Duration::from_secs(5))
        .renew(false)
        .acquire()
        .await
        .expect("second lease");
    (stale, current)
}

/// The `ACL SETUSER` lines of the crate docs (section "Least-privilege ACL user"): their one
/// home, which the tests run as they stand. The first is all a lock needs; the second adds
/// release notifications.
pub fn documented_acl_lines() -> Vec<String> {
    include_str!("../../distlock-runtime/src/lib.rs")
        .lines()
        .filter_map(|line| line.strip_prefix("//! "))
        .filter(|line| line.starts_with("ACL SETUSER"))
        .map(str::to_owned)
        .collect()
}

/// The documented least-privilege line (the first of [`documented_acl_lines`]) as the words
/// of a command that sets up `user` with `password`, with `extra` words after it (a topology's
/// rights, channels) and without the word `left_out` (`+hlen`, say; anything else to leave
/// nothing out).
///
/// # Panics
/// If the crate docs give no `ACL SETUSER` line.
pub fn documented_acl_user(
    user: &str,
    password: &str,
    extra: &[&str],
    left_out: &str,
) -> Vec<String> {
    let line = documented_acl_lines()
        .into_iter()
        .next()
        .expect("the crate docs give an ACL SETUSER line");
    let mut words: Vec<String> = line
        .split_whitespace()
        .enumerate()
        .map(|(i, word)| match (i, word) {
            (2, _) => user.to_owned(),
            (_, ">CHANGE-ME") => format!(">{password}"),
            (_, word) => word.to_owned(),
        })
        .collect();
    words.extend(extra.iter().map(|word| (*word).to_owned()));
    words.retain(|word| word != left_out);
    words
}

/// A loopback port nothing listens on now.
///
/// # Panics
/// When no loopback port can be bound.
pub fn free_port() -> u16 {
    distlock_runtime::testing::free_port().expect("bind a free loopback port")
}

/// Polls `check` every 5 ms until it is true or `within` has passed; returns how long it took,
/// or `None` on time-out.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() <= within {
        if check().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Waits until `key` exists; how long it took, or `None` after `within`.
pub async fn until_exists(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    within: Duration,
) -> Option<Duration> {
    until_key(conn, key, true, within).await
}

/// Waits until `key` is gone; how long it took, or `None` after `within`.
pub async fn until_gone(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    within: Duration,
) -> Option<Duration> {
    until_key(conn, key, false, within).await
}

async fn until_key(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    present: bool,
    within: Duration,
) -> Option<Duration> {
    eventually(within, || {
        let mut conn = conn.clone();
        async move { exists(&mut conn, key).await == present }
    })
    .await
}

/// Waits (at most 2 s) until the lock key `key` (its Redis name) holds a value marked as waited
/// on (`~` in front of the owner token: see the runtime's `scripts/mod.rs`); returns that value.
///
/// # Panics
/// If no waiter marked it in time.
pub async fn until_marked(conn: &redis::aio::MultiplexedConnection, key: &str) -> String {
    let marked = eventually(Duration::from_secs(2), || {
        let mut conn = conn.clone();
        async move {
            let value: Option<String> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("GET");
            value.is_some_and(|v| v.starts_with('~'))
        }
    })
    .await;
    assert!(marked.is_some(), "no waiter marked {key} as waited on");
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn.clone())
        .await
        .expect("GET")
}

/// Whether `key` exists, asked on `conn`.
pub async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

/// Runs `count` copies of the program `exe` with `args` at once, and waits (at most 120 s) for
/// all of them to exit successfully.
///
/// # Panics
/// When a copy cannot be started, fails, or overruns.
pub async fn run_processes(exe: &str, args: &[&str], count: usize) {
    let children: Vec<_> = (0..count)
        .map(|_| {
            tokio::process::Command::new(exe)
                .args(args)
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("start {exe}: {e}"))
        })
        .collect();
    for mut child in children {
        let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
            .await
            .expect("worker process finished in time")
            .expect("wait for worker process");
        assert!(status.success(), "worker process failed: {status}");
    }
}

/// Starts `exe` (the `lock_worker` binary) with `args`, a command that takes a lock and holds
/// it until killed, and returns the process once it printed `acquired`.
///
/// # Panics
/// If it cannot be started, or says anything else first, or nothing within 10 s.
pub async fn holder_process(exe: &str, args: &[&str]) -> tokio::process::Child {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(exe)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {exe}: {e}"));
    let stdout = child.stdout.take().expect("the child's stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the child acquired in time")
        .expect("the child's output")
        .expect("a line from the child");
    assert!(line.starts_with("acquired"), "{line}");
    child
}

/// How many fair waiters are queued in Redis for `key` (default prefix).
///
/// # Panics
/// If Redis cannot be asked.
pub async fn queued(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    redis::cmd("LLEN")
        .arg(format!("distlock:queue:{{{key}}}"))
        .query_async(conn)
        .await
        .expect("LLEN")
}

/// Waits (at most 5 s) until `n` fair waiters are queued for `key`.
///
/// # Panics
/// If they are not.
pub async fn until_queued(conn: &redis::aio::MultiplexedConnection, key: &str, n: usize) {
    let found = eventually(Duration::from_secs(5), || {
        let mut conn = conn.clone();
        async move { queued(&mut conn, key).await == n }
    })
    .await;
    assert!(found.is_some(), "{n} waiters queued for {key}");
}

/// Waits (at most 5 s) until some client subscribes to the release channel of `key` (default
/// prefix), and a little more so the attempt a waiter makes right after subscribing has been
/// answered.
///
/// # Panics
/// If nobody subscribes.
pub async fn until_subscribed(conn: &redis::aio::MultiplexedConnection, key: &str) {
    until_subscribed_on_any(std::slice::from_ref(conn), key).await;
}

/// Waits until some client is subscribed to `key`'s release channel on one of the servers of
/// `conns` (a quorum's subscriber connection goes to whichever node answers first).
///
/// # Panics
/// If nobody subscribes.
pub async fn until_subscribed_on_any(conns: &[redis::aio::MultiplexedConnection], key: &str) {
    let channel = format!("distlock:lock:{{{key}}}");
    let found = eventually(Duration::from_secs(5), || {
        let (conns, channel) = (conns.to_vec(), channel.clone());
        async move {
            for mut conn in conns {
                let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query_async(&mut conn)
                    .await
                    .expect("PUBSUB NUMSUB");
                if counts.first().is_some_and(|(_, n)| *n > 0) {
                    return true;
                }
            }
            false
        }
    })
    .await;
    assert!(found.is_some(), "a manager subscribed to {channel}");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// The channels matching `pattern` that some client is subscribed to (`PUBSUB CHANNELS`).
///
/// # Panics
/// If Redis cannot be asked.
pub async fn channels(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(pattern)
        .query_async(conn)
        .await
        .expect("PUBSUB CHANNELS")
}

/// Waits until `locks` has sent `n` acquire requests in all.
///
/// # Panics
/// If it has not within 5 s.
pub async fn until_attempts(locks: &LockManager, n: u64) {
    let sent = eventually(Duration::from_secs(5), || async {
        locks.stats().acquire_requests >= n
    })
    .await;
    assert!(sent.is_some(), "{n} acquire requests sent");
}

/// Takes and releases the lock on `key`.
///
/// # Panics
/// If either fails.
pub async fn lock_once(locks: &LockManager, key: &str) {
    locks
        .lock(key)
        .acquire()
        .await
        .unwrap_or_else(|e| panic!("acquire {key}: {e}"))
        .release()
        .await
        .unwrap_or_else(|e| panic!("release {key}: {e}"));
}

/// What a spawned waiter returns: when it got the lock, and the lease (or why not).
pub type Waiting = tokio::task::JoinHandle<(
    Instant,
    Result<distlock_runtime::Lease, distlock_runtime::LockError>,
)>;

/// Starts a task that waits up to `wait` for the lock on `key` and says when it got it (or
/// why not): for tests that time a waiter's wake-up after a release.
pub fn spawn_waiter(locks: &LockManager, key: &str, wait: Duration) -> Waiting {
    spawn_waiter_with(locks, key, wait, None)
}

/// [`spawn_waiter`], for an unfair waiter.
pub fn spawn_unfair_waiter(locks: &LockManager, key: &str, wait: Duration) -> Waiting {
    spawn_waiter_with(locks, key, wait, Some(false))
}

fn spawn_waiter_with(
    locks: &LockManager,
    key: &str,
    wait: Duration,
    fair: Option<bool>,
) -> Waiting {
    let (locks, key) = (locks.clone(), key.to_owned());
    tokio::spawn(async move {
        let mut request = locks.lock(key).wait(wait);
        if let Some(fair) = fair {
            request = request.fair(fair);
        }
        let lease = request.acquire().await;
        (Instant::now(), lease)
    })
}

/// Takes and releases one lock, so the manager's connection is open and its scripts loaded
/// before a test counts requests or times calls.
pub async fn warm_up(locks: &LockManager) {
    lock_once(locks, "warm-up").await;
}

/// distlock's log lines, captured while the guard of [`Logs::capture`] lives.
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

thread_local! {
    /// Where this thread's log lines go, while a [`Logs::capture`] guard lives.
    static CAPTURE: std::cell::RefCell<Option<Logs>> = const { std::cell::RefCell::new(None) };
}

/// Ends a [`Logs::capture`] when dropped.
pub struct CaptureGuard(());

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURE.with(|capture| capture.borrow_mut().take());
    }
}

/// The one global subscriber of a test binary: it writes each event to the capture of the thread
/// it happens on, if any. (Per-thread subscribers, `set_default`, lose events when tests run in
/// parallel: tracing caches whether a call site is wanted across threads.)
#[derive(Clone, Copy)]
struct ThreadCapture;

impl std::io::Write for ThreadCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|capture| {
            if let Some(logs) = capture.borrow_mut().as_mut() {
                logs.0.lock().unwrap().extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for ThreadCapture {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

impl Logs {
    /// Captures every event at `DEBUG` and above on this thread (a `#[tokio::test]` runs its
    /// spawned tasks on its own thread) until the guard is dropped.
    pub fn capture() -> (Self, CaptureGuard) {
        static INSTALL: std::sync::Once = std::sync::Once::new();
        INSTALL.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_writer(ThreadCapture)
                .with_max_level(tracing::Level::DEBUG)
                .with_ansi(false)
                .finish();
            // A binary whose tests never capture keeps no global subscriber at all.
            let _ = tracing::subscriber::set_global_default(subscriber);
        });
        let logs = Self::default();
        CAPTURE.with(|capture| *capture.borrow_mut() = Some(logs.clone()));
        (logs, CaptureGuard(()))
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// How many lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

/// What a [`Proxy`] does with the connections it accepts from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards both ways.
    Forward,
    /// Takes the connection and reads what comes, but never answers (a hung server).
    Silent,
    /// Forwards both ways until the client sends a `SUBSCRIBE`; from then on requests still
    /// reach Redis, but no answer comes back (a subscription applied whose reply is lost).
    MuteAfterSubscribe,
    /// Forwards requests at once, and everything Redis sends back this much later.
    Delay(Duration),
    /// Forwards both ways until this long after the client sent a `SUBSCRIBE`; from then on
    /// nothing passes either way, and the connection stays open (a network path that broke
    /// without closing anything).
    CutAfterSubscribe(Duration),
    /// Forwards both ways, but renames every `WAIT` on its way to the server (to `NOWAIT`,
    /// which the server does not know: `ERR unknown command`), as a proxy or a managed service
    /// that does not offer `WAIT` answers it; the server itself still has `WAIT`.
    RenameWait,
}

/// A loopback TCP proxy in front of a [`RedisServer`], whose mode for new connections can be
/// switched: to make the subscriber connection hang while the command connection works.
pub struct Proxy {
    port: u16,
    mode: std::sync::Arc<std::sync::Mutex<ProxyMode>>,
    /// While true, forwarding connections pass nothing on (a network partition).
    frozen: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `server`, forwarding. Must be called inside a Tokio runtime.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(server: &RedisServer) -> Self {
        Self::start_to(server.port()).await
    }

    /// A proxy to the server (or sentinel) on loopback port `upstream`, forwarding.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start_to(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = std::sync::Arc::new(std::sync::Mutex::new(ProxyMode::Forward));
        let shared = std::sync::Arc::clone(&mode);
        let (frozen, thawed) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mode = *shared.lock().unwrap();
                tokio::spawn(serve(client, upstream, mode, thawed.clone()));
            }
        });
        Self {
            port,
            mode,
            frozen,
            task,
        }
    }

    /// Cuts every forwarding connection, open or new, off from Redis: nothing passes either way
    /// (bytes sent meanwhile wait) until [`Proxy::thaw`]. Redis itself keeps running, and expires
    /// keys on time.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Ends a [`Proxy::freeze`]: what waited is passed on.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// The URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// What connections accepted from now on get.
    pub fn set_mode(&self, mode: ProxyMode) {
        *self.mode.lock().unwrap() = mode;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, holding what it read while the proxy is frozen.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut thawed: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if thawed.wait_for(|frozen| !*frozen).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Passes requests from `from` to `to` with each `WAIT` command renamed `NOWAIT` (its RESP
/// bulk string `$4\r\nWAIT\r\n` becomes `$6\r\nNOWAIT\r\n`), for [`ProxyMode::RenameWait`].
/// A request split between two reads right inside the name would pass unrenamed: the requests
/// of distlock's calls are far smaller than a read.
async fn rename_wait(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const WAIT: &[u8] = b"$4\r\nWAIT\r\n";
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut out = Vec::with_capacity(n + 16);
        let mut rest = &buf[..n];
        while let Some(at) = rest.windows(WAIT.len()).position(|w| w == WAIT) {
            out.extend_from_slice(&rest[..at]);
            out.extend_from_slice(b"$6\r\nNOWAIT\r\n");
            rest = &rest[at + WAIT.len()..];
        }
        out.extend_from_slice(rest);
        if to.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn serve(
    mut client: tokio::net::TcpStream,
    upstream: u16,
    mode: ProxyMode,
    thawed: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if mode == ProxyMode::Silent {
        let mut buf = [0u8; 4096];
        while client.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        return;
    }
    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    if mode == ProxyMode::RenameWait {
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::select! {
            () = rename_wait(client_read, server_write) => {}
            () = pump(server_read, client_write, thawed) => {}
        }
        return;
    }
    if mode == ProxyMode::Forward {
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        // Either side closing ends both (dropping the halves closes the sockets).
        tokio::select! {
            () = pump(client_read, server_write, thawed.clone()) => {}
            () = pump(server_read, client_write, thawed) => {}
        }
        return;
    }
    if let ProxyMode::Delay(delay) = mode {
        let (mut client_read, mut client_write) = client.into_split();
        let (mut server_read, mut server_write) = server.into_split();
        let requests = async move {
            let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        };
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let read = async move {
            let mut buf = [0u8; 16 * 1024];
            while let Ok(n) = server_read.read(&mut buf).await {
                if n == 0
                    || sender
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                {
                    return;
                }
            }
        };
        let write = async move {
            while let Some((at, bytes)) = receiver.recv().await {
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                if client_write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = requests => {}
            ((), ()) = async { tokio::join!(read, write) } => {}
        }
        return;
    }
    // MuteAfterSubscribe: answers stop at the first SUBSCRIBE. CutAfterSubscribe: everything
    // stops some time after it.
    let muted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cut_at: std::sync::Arc<std::sync::Mutex<Option<Instant>>> = Default::default();
    let cut = {
        let cut_at = std::sync::Arc::clone(&cut_at);
        move || {
            cut_at
                .lock()
                .unwrap()
                .is_some_and(|at| Instant::now() >= at)
        }
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = {
        let (muted, cut) = (std::sync::Arc::clone(&muted), cut.clone());
        async move {
            let mut buf = [0u8; 16 * 1024];
            loop {
                let n = match client_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if buf[..n]
                    .windows(9)
                    .any(|w| w.eq_ignore_ascii_case(b"SUBSCRIBE"))
                {
                    match mode {
                        ProxyMode::CutAfterSubscribe(after) => {
                            cut_at.lock().unwrap().get_or_insert(Instant::now() + after);
                        }
                        _ => muted.store(true, std::sync::atomic::Ordering::SeqCst),
                    }
                }
                if !cut() && server_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let answers = async move {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let passes = !muted.load(std::sync::atomic::Ordering::SeqCst) && !cut();
            if passes && client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either side closing ends both (dropping the halves closes the sockets).
    tokio::select! {
        () = requests => {}
        () = answers => {}
    }
}

/// Who is inside a critical section, per key: the in-process overlap detector. A body calls
/// [`Occupancy::enter`] with its keys first thing and keeps the guard until it ends; two bodies
/// inside at once on one key count as an overlap (unlike a lost-update counter, this catches an
/// overlap even when the two bodies' writes happen not to interleave).
#[derive(Default)]
pub struct Occupancy {
    inside: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    overlaps: std::sync::atomic::AtomicU64,
    entries: std::sync::atomic::AtomicU64,
}

/// A body's stay in [`Occupancy`]; leaving (drop) frees its keys.
pub struct Inside<'a> {
    occupancy: &'a Occupancy,
    keys: Vec<String>,
}

impl Occupancy {
    /// Marks `keys` occupied by the caller, counting an overlap for each one already occupied.
    pub fn enter<K: AsRef<str>>(&self, keys: &[K]) -> Inside<'_> {
        let mut inside = self.inside.lock().unwrap();
        for key in keys {
            let count = inside.entry(key.as_ref().to_owned()).or_default();
            if *count > 0 {
                self.overlaps
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            *count += 1;
        }
        self.entries
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Inside {
            occupancy: self,
            keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
        }
    }

    /// How many times a body entered a key someone else was inside.
    pub fn overlaps(&self) -> u64 {
        self.overlaps.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many bodies entered.
    pub fn entries(&self) -> u64 {
        self.entries.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether anyone is inside `key` now.
    pub fn is_inside(&self, key: &str) -> bool {
        self.inside
            .lock()
            .unwrap()
            .get(key)
            .is_some_and(|count| *count > 0)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        let mut inside = self.occupancy.inside.lock().unwrap();
        for key in &self.keys {
            if let Some(count) = inside.get_mut(key) {
                *count -= 1;
            }
        }
    }
}

/// When a future was dropped: give its body a [`DropClock::guard`] and read [`DropClock::at`]
/// afterwards, to check when a body was stopped rather than only that it stopped.
#[derive(Clone, Default)]
pub struct DropClock(std::sync::Arc<std::sync::Mutex<Option<Instant>>>);

/// Records the moment it is dropped into its [`DropClock`].
pub struct DropGuard(DropClock);

impl DropClock {
    /// A guard to move into the body.
    pub fn guard(&self) -> DropGuard {
        DropGuard(self.clone())
    }

    /// When the guard was dropped, if it was.
    pub fn at(&self) -> Option<Instant> {
        *self.0.lock().unwrap()
    }
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        *self.0 .0.lock().unwrap() = Some(Instant::now());
    }
}

/// A future that cancels the other branch of a `tokio::select! { biased; ... }` at one exact
/// moment: the next time its task is woken after it was armed, before that branch sees what
/// woke it (a release notification or a hand-off it was just given, say).
///
/// Pending until [`TripwireHandle::arm`]; arming wakes its task once, and
/// returns once that poll has set it; from then on the next poll (the task's next wake-up)
/// finds it ready. List it first in a `biased` select.
pub struct Tripwire {
    shared: std::sync::Arc<TripwireState>,
}

/// Arms a [`Tripwire`].
#[derive(Clone)]
pub struct TripwireHandle {
    shared: std::sync::Arc<TripwireState>,
}

#[derive(Default)]
struct TripwireState {
    /// 0: idle, 1: armed, 2: set (ready at the next poll), 3: fired.
    stage: std::sync::atomic::AtomicU8,
    waker: std::sync::Mutex<Option<std::task::Waker>>,
    set: tokio::sync::Notify,
}

impl Tripwire {
    /// A tripwire, and the handle that arms it.
    pub fn new() -> (Self, TripwireHandle) {
        let shared = std::sync::Arc::<TripwireState>::default();
        let handle = TripwireHandle {
            shared: std::sync::Arc::clone(&shared),
        };
        (Self { shared }, handle)
    }
}

impl TripwireHandle {
    /// Arms the tripwire and waits until its task has been polled once since, so that the
    /// task's next wake-up fires it.
    pub async fn arm(&self) {
        use std::sync::atomic::Ordering;
        self.shared.stage.store(1, Ordering::SeqCst);
        if let Some(waker) = self.shared.waker.lock().unwrap().take() {
            waker.wake();
        }
        self.shared.set.notified().await;
    }

    /// Whether the tripwire went off (was found ready).
    pub fn fired(&self) -> bool {
        self.shared.stage.load(std::sync::atomic::Ordering::SeqCst) == 3
    }
}

impl std::future::Future for Tripwire {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        use std::sync::atomic::Ordering;
        match self.shared.stage.load(Ordering::SeqCst) {
            0 => {
                *self.shared.waker.lock().unwrap() = Some(cx.waker().clone());
                // Armed between the load and storing the waker: look again at the next poll.
                if self.shared.stage.load(Ordering::SeqCst) != 0 {
                    cx.waker().wake_by_ref();
                }
                std::task::Poll::Pending
            }
            1 => {
                self.shared.stage.store(2, Ordering::SeqCst);
                self.shared.set.notify_one();
                std::task::Poll::Pending
            }
            _ => {
                self.shared.stage.store(3, Ordering::SeqCst);
                std::task::Poll::Ready(())
            }
        }
    }
}

/// The Rust examples of `docs/`, compiled as doc-tests, so the long-form docs cannot drift from
/// the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/topologies.md")]
#[doc = include_str!("../../docs/operations.md")]
#[doc = include_str!("../../docs/elections.md")]
#[doc = include_str!("../../docs/guarantees.md")]
#[doc = include_str!("../../docs/axum.md")]
pub struct DocsDoctests;
