//! What can go wrong starting or driving a test server, and what to do about it.

use std::time::Duration;

use super::program::PROGRAM_ENV;

/// Why a test server or topology did not start, or did not do what was asked of it.
///
/// Each message says what to do: install Redis, point [`PROGRAM_ENV`] at a newer one, or what a
/// topology was still missing when its wait ran out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestRedisError {
    /// The program was not found: neither Redis nor Valkey is installed, or not on `PATH`.
    #[error(
        "`{program}` was not found: install Redis {min} or newer (`apt-get install redis-server` \
         on Debian and Ubuntu, `brew install redis` on macOS), which brings `redis-server` and \
         `redis-cli`, or Valkey (`apt-get install valkey-server`, `brew install valkey`), which \
         brings `valkey-server` and `valkey-cli`, and put them on PATH, or set {PROGRAM_ENV} to \
         the path of a `redis-server` or `valkey-server`",
        min = super::program::MIN_VERSION_TEXT
    )]
    NotInstalled {
        /// The program looked for: `redis-server` when neither it nor `valkey-server` is on
        /// `PATH`, the path given, or the CLI (`redis-cli` when neither it nor `valkey-cli` is).
        program: String,
    },
    /// The installed `redis-server` is older than distlock supports.
    #[error(
        "`{program}` is Redis {version}, older than Redis {min}, distlock's minimum: install a \
         newer one (`apt-get install redis-server` on Debian 12 or Ubuntu 24.04 and later, \
         `brew install redis`, or a release from redis.io) and put it on PATH, or set \
         {PROGRAM_ENV} to its path",
        min = super::program::MIN_VERSION_TEXT
    )]
    TooOld {
        /// The program asked (`redis-server --version`).
        program: String,
        /// The version it reported.
        version: String,
    },
    /// A program could not be run, or a file it needs could not be written.
    #[error("could not {what}: {source}")]
    Io {
        /// What was being done (`run redis-server --version`, `write a sentinel config file`).
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The server was started but never answered as the process started (it exited at once,
    /// or its port was taken by another process meanwhile, on every port tried).
    #[error(
        "`{program}` did not start: {reason}; run it by hand with the same arguments to see \
         why: {program} {arguments}"
    )]
    Startup {
        /// The program started.
        program: String,
        /// Its arguments, the last time.
        arguments: String,
        /// What happened, the last time.
        reason: String,
    },
    /// A server, or `redis-cli`, refused a step of setting a topology up or changing it.
    #[error("{step} failed: {reason}")]
    Refused {
        /// The step (`redis-cli --cluster create ...`, `CLUSTER SETSLOT ...` on node 2).
        step: String,
        /// What it answered.
        reason: String,
    },
    /// A wait ran out: a topology did not become ready, or did not fail over, in time.
    #[error("{what}: not done after {within:?}: {missing}")]
    NotReady {
        /// What was waited for.
        what: String,
        /// How long.
        within: Duration,
        /// What was still missing at the end.
        missing: String,
    },
    /// A test server could not be asked anything: it is stopped, paused or gone.
    #[error("the test server on port {port} did not answer {command}: {source}")]
    Unreachable {
        /// The server's port.
        port: u16,
        /// The command sent.
        command: String,
        /// Why no answer came.
        #[source]
        source: std::io::Error,
    },
}
