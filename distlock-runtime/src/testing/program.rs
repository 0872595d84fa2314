//! Which server and CLI run (`redis-server` or `valkey-server`, `redis-cli` or `valkey-cli`),
//! and whether the server is new enough.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::TestRedisError;

/// The environment variable naming the server to run (a path, or a name looked up on `PATH`)
/// when [`TestRedisBuilder::program`](super::TestRedisBuilder::program) names none; without it,
/// `redis-server` on `PATH`, else `valkey-server`. Topologies run the CLI beside the server (in
/// the same directory: `redis-cli`, else `valkey-cli`) when there is one, else the one on
/// `PATH`.
pub const PROGRAM_ENV: &str = "DISTLOCK_REDIS_SERVER";

/// The servers looked for on `PATH`, in this order, when none is named.
pub(crate) const SERVERS: [&str; 2] = ["redis-server", "valkey-server"];

/// The CLIs looked for beside the server, then on `PATH`, in this order.
const CLIS: [&str; 2] = ["redis-cli", "valkey-cli"];

/// The oldest Redis distlock supports, as (major, minor). (Every Valkey is newer: Valkey forked
/// from Redis 7.2.)
const MIN_VERSION: (u32, u32) = (7, 0);

/// [`MIN_VERSION`] for messages.
pub(crate) const MIN_VERSION_TEXT: &str = "7.0";

/// The server to run when the caller named none: [`PROGRAM_ENV`], else the first of
/// [`SERVERS`] on `PATH`, else `redis-server` (whose start then fails, saying how to install
/// either).
pub(crate) fn default_server() -> PathBuf {
    if let Some(program) = std::env::var_os(PROGRAM_ENV).filter(|program| !program.is_empty()) {
        return PathBuf::from(program);
    }
    SERVERS
        .iter()
        .find(|name| on_path(name).is_some())
        .map_or_else(|| PathBuf::from(SERVERS[0]), PathBuf::from)
}

/// The CLI that goes with the server `program`: the first of [`CLIS`] beside it when `program`
/// is a path with a directory, else the first on `PATH`, else `redis-cli` (whose run then fails,
/// saying how to install it).
pub(crate) fn cli_beside(program: &Path) -> PathBuf {
    let beside = program
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .and_then(|dir| {
            CLIS.iter()
                .map(|cli| dir.join(cli))
                .find(|cli| cli.is_file())
        });
    beside
        .or_else(|| {
            CLIS.iter()
                .find(|cli| on_path(cli).is_some())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(CLIS[0]))
}

/// Where `name` is on `PATH`, if it is.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `program` for messages.
pub(crate) fn shown(program: &Path) -> String {
    program.display().to_string()
}

/// The error for a program that could not be run: not installed, or another reason.
pub(crate) fn run_error(program: &Path, error: std::io::Error) -> TestRedisError {
    if error.kind() == std::io::ErrorKind::NotFound {
        TestRedisError::NotInstalled {
            program: shown(program),
        }
    } else {
        TestRedisError::Io {
            what: format!("run {}", shown(program)),
            source: error,
        }
    }
}

/// Checks once per program (per process) that `program` runs and is Redis 7.0 or newer (any
/// Valkey is), from its `--version` (`Redis server v=7.0.15 sha=...`, `Valkey server v=8.1.8
/// ...`). A version it cannot read passes: the server's own startup then says what is wrong.
pub(crate) fn check_server(program: &Path) -> Result<(), TestRedisError> {
    static CHECKED: Mutex<Vec<OsString>> = Mutex::new(Vec::new());
    if crate::sync::lock(&CHECKED).contains(&program.as_os_str().to_owned()) {
        return Ok(());
    }
    let output = Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| run_error(program, e))?;
    let text = String::from_utf8_lossy(&output.stdout);
    if let Some(version) = reported_version(&text) {
        if parse_version(version).is_some_and(|found| found < MIN_VERSION) {
            return Err(TestRedisError::TooOld {
                program: shown(program),
                version: version.to_owned(),
            });
        }
    }
    crate::sync::lock(&CHECKED).push(program.as_os_str().to_owned());
    Ok(())
}

/// The `v=` word of `redis-server --version`'s line.
fn reported_version(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
}

/// `7.0.15` as (7, 0).
fn parse_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_the_version_line() {
        let line = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d";
        assert_eq!(reported_version(line), Some("7.0.15"));
        let line =
            "Valkey server v=8.1.8 sha=00000000:1 malloc=libc bits=64 build=7eb4ebc9d7e91f4e";
        assert_eq!(reported_version(line), Some("8.1.8"));
        assert_eq!(parse_version("7.0.15"), Some((7, 0)));
        assert!(parse_version("6.2.14").is_some_and(|v| v < MIN_VERSION));
        assert!(parse_version("7.2.4").is_some_and(|v| v >= MIN_VERSION));
        assert!(parse_version("10.0.0").is_some_and(|v| v >= MIN_VERSION));
        assert_eq!(reported_version("something else"), None);
    }
}
