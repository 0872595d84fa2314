//! One throwaway `redis-server` process: started on a free loopback port, stopped (by its pid)
//! when dropped, and paused, killed or restarted on demand.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::program::{check_server, default_server, run_error, shown};
use super::{free_port_or_error, off_the_runtime, resp, wait_for, TestRedisError};
use crate::{LockManager, LockManagerBuilder};

/// How many free ports [`TestRedisBuilder::start`] tries before it gives up.
const TRIES: usize = 20;

/// How long a process has to answer after it was started.
const UP_WITHIN: Duration = Duration::from_secs(5);

/// How long a restart may keep trying its port (which the old process may hold for a moment).
const RESTART_WITHIN: Duration = Duration::from_secs(10);

/// How long a replica has to catch up with its primary.
const SYNC_WITHIN: Duration = Duration::from_secs(10);

/// A throwaway `redis-server` on a free loopback port, stopped when dropped.
///
/// It runs with persistence off (no snapshot, no append-only file) and `--bind 127.0.0.1`, so
/// it starts empty and serves this machine only. [`TestRedis::start`] waits until it answers,
/// and checks that it is the process started (not another test's server that took the port
/// meanwhile). Dropping the value kills the process by its pid and waits for it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use distlock_runtime::testing::TestRedis;
///
/// let redis = TestRedis::start().await?;
/// let locks = redis.manager();
/// let lease = locks.lock("report").acquire().await?;
/// assert!(lease.fencing_token() > 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TestRedis {
    /// `None` once killed.
    child: Option<Child>,
    port: u16,
    /// How it was started, for restarts.
    launch: Launch,
    paused: bool,
}

/// The program and arguments a [`TestRedis`] runs with, apart from its port.
#[derive(Debug, Clone)]
struct Launch {
    program: PathBuf,
    config_file: Option<PathBuf>,
    args: Vec<OsString>,
}

/// Starts a [`TestRedis`] other than the default one: another program, more arguments, a
/// config file, a port of the caller's, or a replica of another server.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use distlock_runtime::testing::TestRedis;
///
/// let primary = TestRedis::start_blocking()?;
/// let replica = TestRedis::builder().replica_of(&primary).start_blocking()?;
/// let locks = primary.manager_builder().min_replicas(1).build()?;
/// # let _ = (replica, locks);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until started"]
pub struct TestRedisBuilder {
    program: Option<PathBuf>,
    config_file: Option<PathBuf>,
    args: Vec<OsString>,
    port: Option<u16>,
    /// The port of the primary to replicate, and wait for.
    replica_of: Option<u16>,
    /// How many free ports to try; [`TRIES`] unless set by a topology.
    tries: Option<usize>,
}

impl TestRedisBuilder {
    /// Runs `program` (a path, or a name looked up on `PATH`) instead of
    /// [`PROGRAM_ENV`](super::PROGRAM_ENV) or `redis-server`.
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// Adds `arg` after the test server's own arguments (which set the port, the bind address,
    /// persistence off and diskless replication): `--maxmemory 10mb`, say.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds each of `args`, as [`arg`](Self::arg) does.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    /// Gives `path` to the server as its config file, which it reads before the arguments (a
    /// sentinel, started with the argument `--sentinel`, needs one: it rewrites it).
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_file = Some(path.into());
        self
    }

    /// Starts on `port` rather than on a free port of its choosing; the start fails if the port
    /// is taken.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Makes the server a replica of `primary` (`--replicaof`); the start then also waits (at
    /// most 10 s) until the replica has synchronised and receives the primary's writes.
    pub fn replica_of(mut self, primary: &TestRedis) -> Self {
        self.replica_of = Some(primary.port);
        self
    }

    /// Tries at most `tries` free ports.
    pub(crate) fn tries(mut self, tries: usize) -> Self {
        self.tries = Some(tries);
        self
    }

    /// Starts the server, and waits until it answers (and, for a replica, until it is in sync);
    /// the waiting is done off the async runtime's threads.
    ///
    /// # Errors
    /// As [`start_blocking`](Self::start_blocking).
    pub async fn start(self) -> Result<TestRedis, TestRedisError> {
        off_the_runtime(move || self.start_blocking()).await
    }

    /// [`start`](Self::start), blocking the calling thread meanwhile (for tests without an
    /// async runtime, or that start servers synchronously).
    ///
    /// # Errors
    /// [`TestRedisError::NotInstalled`] when the program is not found,
    /// [`TestRedisError::TooOld`] when it is older than Redis 7.0, [`TestRedisError::Startup`]
    /// when it did not come up on any port tried (or on the port given), and
    /// [`TestRedisError::NotReady`] when a replica did not catch up within 10 s.
    pub fn start_blocking(self) -> Result<TestRedis, TestRedisError> {
        let program = self.program.unwrap_or_else(default_server);
        check_server(&program)?;
        let mut launch = Launch {
            program,
            config_file: self.config_file,
            args: vec![],
        };
        if let Some(primary) = self.replica_of {
            launch
                .args
                .extend(["--replicaof", "127.0.0.1", &primary.to_string()].map(OsString::from));
        }
        launch.args.extend(self.args);
        let tries = match self.port {
            Some(_) => 1,
            None => self.tries.unwrap_or(TRIES).max(1),
        };
        let mut failure = (0, String::new());
        for _ in 0..tries {
            let port = match self.port {
                Some(port) => port,
                None => free_port_or_error()?,
            };
            match launch.spawn_on(port)? {
                Ok(child) => {
                    let server = TestRedis {
                        child: Some(child),
                        port,
                        launch,
                        paused: false,
                    };
                    if let Some(primary) = self.replica_of {
                        server.wait_in_sync_with(primary)?;
                    }
                    return Ok(server);
                }
                Err(reason) => failure = (port, reason),
            }
        }
        let (port, reason) = failure;
        Err(launch.startup_error(port, reason))
    }
}

impl Launch {
    /// The server's arguments on `port`.
    ///
    /// A server loads its snapshot file at startup if it finds one, persistence off or not, so
    /// each has a file name of its own ([`dbfilename`]) rather than the temp dir's shared
    /// `dump.rdb` (which any replica of the default configuration writes there). And
    /// replication never writes one: a primary streams its snapshot at once
    /// (`repl-diskless-sync-delay 0`, instead of waiting 5 s for more replicas to come) and a
    /// replica loads it from the socket (`repl-diskless-load swapdb`).
    fn arguments(&self, port: u16) -> Vec<OsString> {
        let mut arguments: Vec<OsString> = vec![];
        if let Some(config_file) = &self.config_file {
            arguments.push(config_file.clone().into_os_string());
        }
        let dbfilename = dbfilename(port);
        let port = port.to_string();
        let dir = std::env::temp_dir();
        let own = [
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir.to_string_lossy(),
            "--dbfilename",
            &dbfilename,
            "--loglevel",
            "warning",
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-load",
            "swapdb",
        ];
        arguments.extend(own.map(OsString::from));
        arguments.extend(self.args.iter().cloned());
        arguments
    }

    /// Starts the program on `port`: the running child once it answers as itself, or (inner
    /// `Err`) what went wrong when it did not come up (the port was taken, say). The outer
    /// `Err` is for a program that could not be run at all.
    fn spawn_on(&self, port: u16) -> Result<Result<Child, String>, TestRedisError> {
        let child = Command::new(&self.program)
            .args(self.arguments(port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| run_error(&self.program, e))?;
        Ok(ours_when_up(child, port))
    }

    /// The error for a server that did not come up on `port` (the last port tried).
    fn startup_error(&self, port: u16, reason: String) -> TestRedisError {
        let arguments: Vec<String> = self
            .arguments(port)
            .iter()
            .map(|arg| match arg.to_string_lossy() {
                arg if arg.is_empty() => "''".to_owned(),
                arg => arg.into_owned(),
            })
            .collect();
        TestRedisError::Startup {
            program: shown(&self.program),
            arguments: arguments.join(" "),
            reason,
        }
    }
}

/// The snapshot file name of the test server on `port`: its own, in the shared temp dir.
fn dbfilename(port: u16) -> String {
    format!("distlock-{}-{port}.rdb", std::process::id())
}

/// Waits (at most 5 s) until the just-spawned `child` answers on `port`; what went wrong, with
/// the child killed and reaped, if it exits first (the port was taken, say) or never answers.
fn ours_when_up(mut child: Child, port: u16) -> Result<Child, String> {
    let deadline = Instant::now() + UP_WITHIN;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited at once ({status}) on port {port}"));
        }
        // Ours, not a server another test started on the same port meanwhile.
        let pid_line = format!("process_id:{}", child.id());
        if resp::command(port, &["INFO", "server"]).is_ok_and(|info| info.contains(&pid_line)) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!(
        "it did not answer on port {port} within {UP_WITHIN:?}"
    ))
}

/// Sends `signal` (`STOP`, `CONT`) to the process `pid`, one started here.
fn send_signal(pid: u32, signal: &str) -> Result<(), TestRedisError> {
    let what = format!("kill -{signal} {pid}");
    let status = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .stdin(Stdio::null())
        .status()
        .map_err(|source| TestRedisError::Io {
            what: format!("run {what}"),
            source,
        })?;
    if status.success() {
        Ok(())
    } else {
        Err(TestRedisError::Refused {
            step: what,
            reason: status.to_string(),
        })
    }
}

impl TestRedis {
    /// Starts a `redis-server` (from [`PROGRAM_ENV`](super::PROGRAM_ENV), else `redis-server`
    /// on `PATH`) on a free loopback port, with persistence off, and waits until it answers;
    /// the waiting is done off the async runtime's threads.
    ///
    /// # Errors
    /// [`TestRedisError::NotInstalled`] (its message says how to install Redis) when there is
    /// no `redis-server`, [`TestRedisError::TooOld`] when it is older than Redis 7.0, and
    /// [`TestRedisError::Startup`] when it did not come up on any of 20 free ports.
    pub async fn start() -> Result<Self, TestRedisError> {
        Self::builder().start().await
    }

    /// [`start`](Self::start), blocking the calling thread until the server answers (a few
    /// milliseconds): for tests without an async runtime.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_blocking() -> Result<Self, TestRedisError> {
        Self::builder().start_blocking()
    }

    /// A builder for a server other than the default one: another program, more arguments, a
    /// replica.
    pub fn builder() -> TestRedisBuilder {
        TestRedisBuilder::default()
    }

    /// The server's port, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's process id, while it runs (`None` after [`kill`](Self::kill)).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A manager for this server, with 2 s connect, response and pool-wait timeouts (short
    /// enough to fail a test quickly, long enough never to fire on a loaded CI machine), and
    /// [`LockOrder::Fail`](crate::LockOrder::Fail): a lock order inversion fails the call.
    ///
    /// # Panics
    /// Never in practice: the builder of [`manager_builder`](Self::manager_builder) is valid.
    pub fn manager(&self) -> LockManager {
        build(self.manager_builder())
    }

    /// The builder behind [`manager`](Self::manager), to adjust before building (a prefix, a
    /// default ttl, `min_replicas`).
    pub fn manager_builder(&self) -> LockManagerBuilder {
        with_test_timeouts(LockManager::builder().url(self.url()))
    }

    /// Runs one command on a fresh blocking connection and returns its raw RESP reply
    /// (`+OK\r\n`, `:1\r\n`, `$-1\r\n`): to look inside the server without a client library.
    /// Blocks until the reply, or 2 s of silence.
    ///
    /// A fresh connection has written nothing, so a `WAIT` sent this way returns at once: send
    /// it after the writes it is to wait for, with [`commands`](Self::commands).
    ///
    /// # Errors
    /// [`TestRedisError::Unreachable`] when the server cannot be reached or does not answer.
    pub fn command(&self, args: &[&str]) -> Result<String, TestRedisError> {
        resp::command(self.port, args).map_err(|source| self.unreachable(args, source))
    }

    /// Runs `commands` in order on one fresh blocking connection (`SET` then `WAIT 1 1000`,
    /// say) and returns their raw RESP replies.
    ///
    /// # Errors
    /// [`TestRedisError::Unreachable`] when the server cannot be reached or does not answer.
    pub fn commands(&self, commands: &[&[&str]]) -> Result<Vec<String>, TestRedisError> {
        resp::commands(self.port, commands)
            .map_err(|source| self.unreachable(commands.first().copied().unwrap_or(&[]), source))
    }

    fn unreachable(&self, args: &[&str], source: std::io::Error) -> TestRedisError {
        TestRedisError::Unreachable {
            port: self.port,
            command: args.join(" "),
            source,
        }
    }

    /// Stops the process with `SIGSTOP`: its connections stay open and new ones are accepted,
    /// but nothing is answered (a hung server), until [`resume`](Self::resume). A paused server
    /// is resumed before it is dropped.
    ///
    /// # Errors
    /// [`TestRedisError::Io`] or [`TestRedisError::Refused`] when `kill -STOP` fails.
    pub fn pause(&mut self) -> Result<(), TestRedisError> {
        self.signal("STOP")?;
        self.paused = true;
        Ok(())
    }

    /// Continues a paused server (`SIGCONT`).
    ///
    /// # Errors
    /// [`TestRedisError::Io`] or [`TestRedisError::Refused`] when `kill -CONT` fails.
    pub fn resume(&mut self) -> Result<(), TestRedisError> {
        self.signal("CONT")?;
        self.paused = false;
        Ok(())
    }

    /// Kills the server with `SIGKILL` (a crash: no clean shutdown) and waits for it to exit;
    /// nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// Kills the server (if it runs) and starts an empty one on the same port, with the same
    /// arguments, blocking until it answers (usually a few milliseconds; up to 10 s while the
    /// port is still held).
    ///
    /// # Errors
    /// [`TestRedisError::Startup`] when no server came up on the port within 10 s.
    pub fn restart(&mut self) -> Result<(), TestRedisError> {
        self.kill();
        let deadline = Instant::now() + RESTART_WITHIN;
        loop {
            match self.launch.spawn_on(self.port)? {
                Ok(child) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(reason) if Instant::now() >= deadline => {
                    return Err(self.launch.startup_error(self.port, reason))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Whether the server runs and is not paused: whether it can be asked anything.
    pub(crate) fn answers(&self) -> bool {
        self.child.is_some() && !self.paused
    }

    pub(crate) fn signal(&self, signal: &str) -> Result<(), TestRedisError> {
        match self.pid() {
            Some(pid) => send_signal(pid, signal),
            None => Ok(()),
        }
    }

    /// Waits until this replica's link to the primary on `primary` is up and a write to the
    /// primary shows here.
    fn wait_in_sync_with(&self, primary: u16) -> Result<(), TestRedisError> {
        let deadline = Instant::now() + SYNC_WITHIN;
        let what = format!("replica {} of {primary}", self.port);
        wait_for(SYNC_WITHIN, &what, Duration::from_millis(20), || {
            let info = resp::command(self.port, &["INFO", "replication"]).unwrap_or_default();
            if info.contains("master_link_status:up") {
                Ok(())
            } else {
                Err("its link to the primary is not up".to_owned())
            }
        })?;
        // "up" can come a few seconds before the replication stream flows (seen with diskless
        // loading): wait until a write to the primary shows on the replica.
        let probe = format!("distlock-testing-probe:{}", self.port);
        let mut n = 0u64;
        let left = deadline.saturating_duration_since(Instant::now());
        wait_for(left, &what, Duration::from_millis(10), || {
            n += 1;
            let value = n.to_string();
            let _ = resp::command(primary, &["SET", &probe, &value, "PX", "2000"]);
            std::thread::sleep(Duration::from_millis(10));
            let seen = resp::command(self.port, &["GET", &probe]).unwrap_or_default();
            if seen.ends_with(&format!("\r\n{value}\r\n")) {
                Ok(())
            } else {
                Err("the primary's writes do not reach it".to_owned())
            }
        })?;
        let _ = resp::command(primary, &["DEL", &probe]);
        Ok(())
    }

    /// The program this server runs: the one given to
    /// [`TestRedisBuilder::program`], else [`PROGRAM_ENV`](super::PROGRAM_ENV)'s, else
    /// `redis-server` or `valkey-server` from `PATH`.
    pub fn program(&self) -> &Path {
        &self.launch.program
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        if self.paused {
            let _ = self.signal("CONT");
        }
        self.kill();
        // Only there if a test asked for a SAVE.
        let _ = std::fs::remove_file(std::env::temp_dir().join(dbfilename(self.port)));
    }
}

/// `builder` with the test servers' 2 s connect, response and pool-wait timeouts, and the lock
/// order check failing a nested call at once ([`LockOrder::Fail`](crate::LockOrder::Fail)).
pub(crate) fn with_test_timeouts(builder: LockManagerBuilder) -> LockManagerBuilder {
    let timeout = Duration::from_secs(2);
    builder
        .lock_order(crate::LockOrder::Fail)
        .connect_timeout(timeout)
        .response_timeout(timeout)
        .pool_wait_timeout(timeout)
}

/// Builds a test manager, whose builder is valid by construction.
pub(crate) fn build(builder: LockManagerBuilder) -> LockManager {
    builder
        .build()
        .unwrap_or_else(|e| panic!("a test server's manager: {e}"))
}
