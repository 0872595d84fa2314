//! [`LockManager::ping`](crate::LockManager::ping)'s check of everything a lock needs, on every
//! server, before the first lock needs it. (What a refusal means exactly: `refusal.rs`.)
//!
//! **The check** runs one script ([`CHECK`]) on every server that holds locks (the one server,
//! the primary Sentinel names, every primary of a cluster, every quorum node). Declared with
//! `#!lua` and without `no-writes`, it fails on a server older than 7.0 and on a replica
//! (`READONLY`) before it runs; it then asks `redis.acl_check_cmd` about every command any of
//! distlock's scripts may run, on the keys and the channel they run it on, and the commands the
//! manager sends itself (`EVAL`, `SELECT`, and its topology's: `WAIT`, `ROLE`,
//! `CLUSTER SLOTS`). It writes nothing.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use redis::Value;

use crate::call::{Confirm, ScriptCall};
use crate::context::Context;
use crate::error::{LockError, Misconfiguration};
use crate::refusal::{and_instead, grant, not_offered};
use crate::scripts::Lua;

/// Checks what a manager needs on one server, writing nothing: `scripts/check.lua` (see the
/// module docs).
pub(crate) static CHECK: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(crate::scripts::lua!("#!lua"; "scripts/check.lua")));

/// One server that holds a manager's locks, as it describes itself: which server software and
/// version answered. [`LockManager::servers`](crate::LockManager::servers) lists them.
///
/// ```no_run
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// for server in locks.servers().await? {
///     println!("{server}"); // Valkey 8.1.8 at 10.0.0.5:6379
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// Where it is, as the manager reaches it (`host:port`, without credentials).
    pub address: String,
    /// Which server software it is.
    pub product: ServerProduct,
    /// Its version (`8.1.8`): Valkey's own version for Valkey, not the Redis version it reports
    /// for compatibility.
    pub version: String,
    /// The Redis version it reports, read by the check script from `redis.REDIS_VERSION` (no
    /// `INFO` is sent): its own for Redis, the Redis version it is compatible with for Valkey
    /// (`7.2.4`).
    pub redis_version: String,
}

/// Which server software answered: [`ServerInfo::product`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerProduct {
    /// Redis.
    Redis,
    /// Valkey, the fork of Redis 7.2.
    Valkey,
}

impl std::fmt::Display for ServerProduct {
    /// Its name, as its variant's: `Redis`, `Valkey`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

impl std::fmt::Display for ServerInfo {
    /// `Valkey 8.1.8 at 10.0.0.5:6379`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} at {}", self.product, self.version, self.address)
    }
}

/// What the check found on one server: what it is, and the rights it lacks.
struct Checked {
    server: ServerInfo,
    /// The checks the user fails (`GET distlock:lock:{ping}`).
    missing: Vec<String>,
    /// Whether it may subscribe to a lock's channel, but not publish on it.
    subscribes_only: bool,
    /// The checks of commands the server does not know (renamed away, or disabled).
    unknown: Vec<String>,
}

/// `LockManager::ping`: the check on every server (see the module docs); the first ping, and
/// one that finds other servers or versions than the last (or other servers not answering),
/// logs which answered.
pub(crate) async fn ping(context: &Context) -> Result<(), LockError> {
    let (checked, unanswered) = check(context, Confirm::Shown).await?;
    let notifies = context.redis().subscriber.is_some();
    for checked in &checked {
        check_rights(context, checked, notifies)?;
    }
    let servers: Vec<String> = checked.iter().map(|c| c.server.to_string()).collect();
    let silent: Vec<&str> = unanswered.iter().map(|u| u.0.as_str()).collect();
    let (servers, silent) = (servers.join(", "), silent.join(", "));
    let seen_now = format!("{servers}; {silent}");
    let mut seen = crate::sync::lock(&context.servers_seen);
    if seen.as_deref() != Some(seen_now.as_str()) {
        match unanswered.first() {
            None => tracing::info!(
                %servers,
                "distlock: ping: every server grants every right a lock needs"
            ),
            Some((_, error)) => tracing::info!(
                %servers,
                unanswered = %silent,
                %error,
                "distlock: ping: the servers that answered grant every right a lock needs; \
                 the others did not answer (enough answered to serve)"
            ),
        }
        *seen = Some(seen_now);
    }
    Ok(())
}

/// `LockManager::servers`: what the check's servers say they are, whatever rights the user
/// has beyond running the check.
pub(crate) async fn servers(context: &Context) -> Result<Vec<ServerInfo>, LockError> {
    let (checked, _) = check(context, Confirm::No).await?;
    Ok(checked.into_iter().map(|checked| checked.server).collect())
}

/// Runs the check on every server (see the module docs) as a call that `confirm`s as said (`Confirm::Shown`
/// goes with a `WAIT` where the manager waits for replicas: see `call.rs`): what each server
/// that answered is, and lacks, in the order of their addresses, and the servers that did not
/// answer, with why. Fails on a refusal anywhere (what it refused said exactly, see
/// `refusal.rs`), and on an outage of more servers than the deployment can do without.
async fn check(
    context: &Context,
    confirm: Confirm,
) -> Result<(Vec<Checked>, Vec<(String, LockError)>), LockError> {
    let redis = context.redis();
    let probe = context.lock_keys("ping");
    let mut call = ScriptCall::new("ping", &CHECK, confirm, 0);
    call.arg(probe.lock())
        .arg(probe.fence())
        .arg(probe.queue())
        .arg(probe.waiters())
        .arg(probe.holders());
    // Each command a lock sends, one argument each.
    call.arg(redis.channel_commands()).arg(&redis.commands);
    let (answers, needed) = redis.run_on_every_server(&call).await;
    let (mut checked, mut unanswered) = (Vec::new(), Vec::new());
    for (server, answer) in answers {
        match answer {
            Ok(value) => checked.push(parse(server, value)?),
            Err(failed) => {
                let probe = |types: ScriptCall| async move { redis.read(&types).await };
                let error = crate::refusal::explain(&call, failed, probe).await.error;
                if error.is_misconfigured() {
                    return Err(error);
                }
                unanswered.push((server, error));
            }
        }
    }
    if let Some((_, error)) = unanswered.first().filter(|_| checked.len() < needed) {
        return Err(error.clone());
    }
    checked.sort_by(|a, b| a.server.address.cmp(&b.server.address));
    unanswered.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((checked, unanswered))
}

/// The check's answer `value` on `server` (see `scripts/check.lua`).
fn parse(server: String, value: Value) -> Result<Checked, LockError> {
    type Answer = (Vec<String>, i64, i64, String, String, String, Vec<String>);
    let (missing, publish, subscribe, product, version, redis_version, unknown): Answer =
        redis::FromRedisValue::from_redis_value(value).map_err(|parse| LockError::Redis {
            op: "ping",
            source: parse.into(),
        })?;
    Ok(Checked {
        server: ServerInfo {
            address: address(&server),
            product: match product.as_str() {
                "valkey" => ServerProduct::Valkey,
                _ => ServerProduct::Redis,
            },
            version,
            redis_version,
        },
        missing,
        subscribes_only: subscribe == 1 && publish != 1,
        unknown,
    })
}

/// Fails with what the check found `checked` lacks (`notifies`: whether the manager subscribes
/// to release notifications): a command the server does not offer
/// ([`Misconfiguration::Unsupported`]) first, then the rights the user lacks.
fn check_rights(context: &Context, checked: &Checked, notifies: bool) -> Result<(), LockError> {
    let server = &checked.server;
    let (address, product, version) = (&server.address, server.product, &server.version);
    let on = format!("on {address} ({product} {version})");
    if !checked.unknown.is_empty() {
        let commands: Vec<String> = checked.unknown.iter().map(|c| shown(c)).collect();
        let detail = format!("{on} {}", not_offered(&commands, ""));
        return Err(refusal(Misconfiguration::Unsupported, detail));
    }
    let mut missing: Vec<String> = checked.missing.iter().map(|c| shown(c)).collect();
    if notifies && checked.subscribes_only {
        // Subscribed waiters would sleep through every release until the holder's expiry.
        missing.push("PUBLISH (on the locks' channels)".to_owned());
    }
    if missing.is_empty() {
        return Ok(());
    }
    let prefix = &context.prefix;
    let grants: BTreeSet<String> = missing.iter().map(|c| grant(c)).collect();
    let channels = if missing.iter().any(|m| m.starts_with("PUBLISH")) {
        format!(" &{prefix}*")
    } else {
        String::new()
    };
    let detail = format!(
        "{on} it may not run {}; grant what is missing: ACL SETUSER <user> ~{prefix}*{channels} {}",
        missing.join(", "),
        Vec::from_iter(grants).join(" ")
    );
    let detail = and_instead(detail, &missing, "; or, ");
    Err(refusal(Misconfiguration::Permissions, detail))
}

/// `host:port` of a server as a route names it (`rediss://user:***@host:port/2`, or already
/// `host:port`).
fn address(server: &str) -> String {
    let rest = server.split_once("://").map_or(server, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// A check as the messages show it: the command and its first argument, a key
/// (`GET distlock:lock:{ping}`) or a subcommand (`CLUSTER SLOTS`), not a number (`WAIT`).
fn shown(check: &str) -> String {
    let mut words = check.split(' ');
    let command = words.next().unwrap_or_default();
    match words.next() {
        Some(first) if !first.chars().all(|c| c.is_ascii_digit()) => format!("{command} {first}"),
        _ => command.to_owned(),
    }
}

/// `ping`'s error for what the check found on a server, said in `detail`.
fn refusal(problem: Misconfiguration, detail: String) -> LockError {
    let source = redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
        "the server refuses what a lock needs",
        detail.clone(),
    ));
    LockError::Misconfigured {
        op: "ping",
        problem,
        detail,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::commands_on;

    /// The commands the scripts distlock sends run, read off their source (`PUBLISH` apart:
    /// the scripts call it through a variable, `PUBLISH` or `SPUBLISH`, and it is optional).
    fn script_commands() -> BTreeSet<String> {
        crate::catalog::all()
            .iter()
            .flat_map(|(_, lua)| lua.code().lines())
            .flat_map(commands_on)
            .filter_map(|command| {
                let name = command.split(' ').next().unwrap_or_default().to_owned();
                (name != "PUBLISH").then_some(name)
            })
            .collect()
    }

    /// The commands [`CHECK`] asks about: its `{'NAME', ...}` entries.
    fn checked_commands() -> BTreeSet<String> {
        CHECK
            .code()
            .split("{'")
            .skip(1)
            .filter_map(|entry| entry.split('\'').next())
            .map(str::to_owned)
            .collect()
    }

    /// The commands the crate docs' least-privilege line grants (its first `ACL SETUSER`
    /// line), upper case.
    fn documented_commands() -> BTreeSet<String> {
        let line = include_str!("lib.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("//! "))
            .find(|line| line.starts_with("ACL SETUSER"))
            .expect("the crate docs give an ACL SETUSER line");
        line.split_whitespace()
            .filter_map(|word| word.strip_prefix('+'))
            .map(str::to_uppercase)
            .collect()
    }

    /// The documented line is exactly what `ping` requires of a user on one server: every
    /// command every script runs (read off the scripts' source), no more, no fewer, each of
    /// them checked by `ping`'s script, and the commands the manager sends itself (`EVALSHA`,
    /// whose refusal fails the check's own call, `EVAL` and `SELECT`, which it checks). So a
    /// user set up by the docs never fails a lock that `ping` passed, nor is told to grant a
    /// command no script runs.
    #[test]
    fn the_documented_acl_line_is_exactly_what_the_scripts_run_and_ping_checks() {
        let scripts = script_commands();
        let own: BTreeSet<String> = ["EVALSHA", "EVAL", "SELECT"].map(str::to_owned).into();
        let needed: BTreeSet<String> = scripts.union(&own).cloned().collect();
        let documented = documented_commands();
        assert_eq!(
            documented.difference(&needed).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "the documented line grants commands no script runs"
        );
        assert_eq!(
            needed.difference(&documented).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "the scripts run commands the documented line does not grant"
        );
        // What ping checks with `redis.acl_check_cmd`, with `SELECT` (a one-server route's
        // command) and `EVALSHA` (the check's own call).
        let mut pinged = checked_commands();
        pinged.insert("SELECT".to_owned());
        pinged.insert("EVALSHA".to_owned());
        assert_eq!(
            pinged, documented,
            "ping checks other commands than the line grants"
        );
    }

    #[test]
    fn a_servers_address_is_its_host_and_port() {
        assert_eq!(address("redis://app:***@127.0.0.1:6379"), "127.0.0.1:6379");
        assert_eq!(address("rediss://10.0.0.5:6380/2"), "10.0.0.5:6380");
        assert_eq!(address("10.0.0.6:7000"), "10.0.0.6:7000");
    }

    #[test]
    fn checks_are_shown_with_a_key_or_subcommand_but_not_a_number() {
        assert_eq!(shown("WAIT 0"), "WAIT");
        assert_eq!(shown("CLUSTER SLOTS"), "CLUSTER SLOTS");
        assert_eq!(
            shown("GET distlock:lock:{ping}"),
            "GET distlock:lock:{ping}"
        );
        assert_eq!(shown("TIME"), "TIME");
    }

    /// The sets the test above compares are read right: a command of a script, one `ping`
    /// checks and one the line grants are found (and `PUBLISH`, called through a variable, is
    /// left to the optional line).
    #[test]
    fn commands_are_read_off_the_scripts_the_check_and_the_docs() {
        let scripts = script_commands();
        for command in ["SET", "TIME", "HLEN", "ZREMRANGEBYSCORE"] {
            assert!(scripts.contains(command), "{command} not in {scripts:?}");
        }
        assert!(!scripts.contains("PUBLISH"), "{scripts:?}");
        assert!(checked_commands().contains("HLEN"));
        assert!(checked_commands().contains("EVAL"));
        assert!(documented_commands().contains("EVALSHA"));
        assert!(!documented_commands().contains("PUBLISH"));
    }
}
