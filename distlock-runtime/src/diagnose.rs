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

use std::sync::LazyLock;

use redis::Value;

use crate::call::{Kind, ScriptCall};
use crate::context::Context;
use crate::error::{LockError, Misconfiguration};
use crate::scripts::Lua;

/// Checks what a manager needs on one server, writing nothing: `scripts/check.lua` (see the
/// module docs).
pub(crate) static CHECK: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(crate::scripts::lua!("#!lua"; "scripts/check.lua")));

/// The commands distlock's scripts run (a unit test holds [`CHECK`] to this list).
#[cfg(test)]
const SCRIPT_COMMANDS: [&str; 24] = [
    "DEL",
    "EXISTS",
    "GET",
    "HDEL",
    "HGET",
    "HSET",
    "LINDEX",
    "LLEN",
    "LPOP",
    "LREM",
    "PEXPIRE",
    "PTTL",
    "RPUSH",
    "SET",
    "TIME",
    "ZADD",
    "ZCARD",
    "ZCOUNT",
    "ZRANGE",
    "ZREM",
    "ZREMRANGEBYSCORE",
    "ZSCORE", // read by inspection only, through pcall: not required
    "HLEN",
    "publish",
];

/// `LockManager::ping`: the check on every server (see the module docs).
pub(crate) async fn ping(context: &Context) -> Result<(), LockError> {
    let route = context.redis();
    let probe = context.lock_keys("ping");
    let mut call = ScriptCall::new("ping", &CHECK, Kind::Read, 0);
    call.arg(probe.lock())
        .arg(probe.fence())
        .arg(probe.queue())
        .arg(probe.waiters())
        .arg(probe.holders());
    let (publish, subscribe, unsubscribe) = route.channel_commands();
    call.arg(publish).arg(subscribe).arg(unsubscribe);
    for command in route.commands() {
        call.arg(command);
    }
    let answers = route.run_on_every_server(&call).await;
    let servers = answers.len();
    let mut answered = 0;
    let mut outage = None;
    for (server, answer) in answers {
        let value = match answer {
            Ok(value) => value,
            Err(failed) => {
                let probe = |types: ScriptCall| async move { route.invoke(&types).await };
                let error = crate::refusal::explain(&call, failed, probe).await.error;
                if error.is_misconfigured() {
                    return Err(error);
                }
                outage.get_or_insert((server, error));
                continue;
            }
        };
        answered += 1;
        if let Some(error) = refused_rights(context, &server, value, route.subscriber().is_some()) {
            return Err(error);
        }
    }
    match outage {
        Some((_, error)) if answered < route.servers_needed(servers) => Err(error),
        _ => Ok(()),
    }
}

/// What the check's answer `value` on `server` says is missing, as the error to report.
fn refused_rights(
    context: &Context,
    server: &str,
    value: Value,
    notifies: bool,
) -> Option<LockError> {
    let (missing, publish, subscribe): (Vec<String>, i64, i64) =
        match redis::FromRedisValue::from_redis_value(value) {
            Ok(answer) => answer,
            Err(parse) => {
                return Some(LockError::Redis {
                    op: "ping",
                    source: parse.into(),
                })
            }
        };
    let prefix = &context.prefix;
    let mut missing = missing;
    if notifies && subscribe == 1 && publish == 0 {
        // Subscribed waiters would sleep through every release until the holder's expiry.
        missing.push("PUBLISH (on the locks' channels)".to_owned());
    }
    if missing.is_empty() {
        return None;
    }
    let grants: Vec<String> = {
        let mut grants: Vec<String> = missing
            .iter()
            .map(|check| {
                let words: Vec<&str> = check.split(' ').collect();
                let command = words[0].to_lowercase();
                match words.get(1) {
                    Some(sub) if command == "cluster" => format!("+cluster|{}", sub.to_lowercase()),
                    _ if command.starts_with("publish") => "+publish".to_owned(),
                    _ => format!("+{command}"),
                }
            })
            .collect();
        grants.sort();
        grants.dedup();
        grants
    };
    let channels = if missing.iter().any(|m| m.starts_with("PUBLISH")) {
        format!(" &{prefix}*")
    } else {
        String::new()
    };
    let detail = format!(
        "on {server} it may not run {}; grant what is missing: ACL SETUSER <user> ~{prefix}*{channels} {}",
        missing.join(", "),
        grants.join(" ")
    );
    let source = redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
        "the ACL user lacks rights a lock needs",
        detail.clone(),
    ));
    Some(LockError::Misconfigured {
        op: "ping",
        problem: Misconfiguration::Permissions,
        detail,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::commands_on;

    /// Every command a script runs is one the check asks about (or one it leaves out on
    /// purpose), so `ping` cannot pass a user a lock then fails.
    #[test]
    fn the_check_covers_every_command_every_script_runs() {
        let scripts: [&Lua; 8] = [
            &crate::scripts::ACQUIRE,
            &crate::scripts::RELEASE,
            &crate::scripts::EXTEND,
            &crate::fair::ACQUIRE_FAIR,
            &crate::fair::REFRESH_FAIR,
            &crate::fence::RAISE,
            &crate::inspect::INSPECT,
            &crate::inspect::FORCE_RELEASE,
        ];
        let check = CHECK.code();
        for script in scripts {
            for line in script.code().lines() {
                for command in commands_on(line) {
                    let name = command.split(' ').next().unwrap_or_default();
                    let known = SCRIPT_COMMANDS.iter().any(|c| c.eq_ignore_ascii_case(name))
                        || name == "PUBLISH";
                    assert!(known, "{command} (in `{line}`) is not in SCRIPT_COMMANDS");
                    let checked = name == "PUBLISH"
                        || name == "HLEN"
                        || check.contains(&format!("{{'{name}'"));
                    assert!(checked, "{command} (in `{line}`) is not checked by CHECK");
                }
            }
        }
    }
}
