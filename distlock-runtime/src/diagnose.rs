//! Saying what is wrong: [`LockManager::ping`](crate::LockManager::ping)'s check of everything
//! a lock needs, on every server, before the first lock needs it; and the refusals Redis words
//! vaguely made specific (the command an ACL user may not run inside a script, the key that
//! holds another type).
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

use crate::call::{Failed, Kind, Lua, ScriptCall};
use crate::context::Context;
use crate::error::{LockError, Misconfiguration};
use crate::keys::LockKeys;
use crate::topology::Route;

/// Checks what a manager needs on one server; see the module docs.
///
/// KEYS: none (it runs on every server alike; the keys it checks are arguments).
/// ARGV[1..4]: a lock's keys under the manager's prefix: lock, fencing counter, queue, queue
/// entries. ARGV[5], ARGV[6], ARGV[7]: the commands that publish on, subscribe to and
/// unsubscribe from a lock's channel (the lock key's name). ARGV[8...]: the other commands the
/// manager sends, each one argument with its words apart (`SELECT 0`, `CLUSTER SLOTS`).
/// Returns `{missing, publish, subscribe}`: the checks the user fails, each as the command and
/// the key it was checked on (`GET distlock:lock:{...}`), and 1 or 0 for whether it may
/// publish, and subscribe, on the channel.
pub(crate) static CHECK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"#!lua
local L, F, Q, W = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local checks = {
  {'EVAL', 'return 1', '0'},
  {'GET', L}, {'SET', L, 'x'}, {'DEL', L}, {'EXISTS', L}, {'PTTL', L}, {'PEXPIRE', L, '1'},
  {'GET', F}, {'SET', F, '1'},
  {'EXISTS', Q}, {'LPOP', Q}, {'LREM', Q, '0', 'x'}, {'RPUSH', Q, 'x'}, {'PEXPIRE', Q, '1'},
  {'HGET', W, 'x'}, {'HSET', W, 'x', 'y'}, {'HDEL', W, 'x'}, {'PEXPIRE', W, '1'},
  {'TIME'},
}
for i = 8, #ARGV do
  local words = {}
  for word in string.gmatch(ARGV[i], '%S+') do words[#words + 1] = word end
  checks[#checks + 1] = words
end
local missing = {}
for _, check in ipairs(checks) do
  if not redis.acl_check_cmd(unpack(check)) then
    missing[#missing + 1] = check[1] .. (check[2] and (' ' .. check[2]) or '')
  end
end
local publish = redis.acl_check_cmd(ARGV[5], L, '') and 1 or 0
local subscribe = (redis.acl_check_cmd(ARGV[6], L) and redis.acl_check_cmd(ARGV[7], L)) and 1 or 0
return {missing, publish, subscribe}
",
    )
});

/// The commands distlock's scripts run (a unit test holds [`CHECK`] to this list).
#[cfg(test)]
const SCRIPT_COMMANDS: [&str; 15] = [
    "DEL", "EXISTS", "GET", "HDEL", "HGET", "HSET", "LPOP", "LREM", "PEXPIRE", "PTTL", "RPUSH",
    "SET", "TIME", // read by inspection only, through pcall: not required
    "HLEN", "publish",
];

/// `LockManager::ping`: the check on every server (see the module docs).
pub(crate) async fn ping(context: &Context) -> Result<(), LockError> {
    let route = context.redis();
    let probe = context.lock_keys("ping");
    let mut call = ScriptCall::new("ping", &CHECK, Kind::Read, 0);
    call.arg(probe.lock())
        .arg(probe.fence())
        .arg(probe.queue())
        .arg(probe.waiters());
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
                let error = explain(route, &call, failed).await.error;
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

/// Says more about a refusal of `call` than Redis did: which command an ACL user may not run
/// (from the line of the script Redis names), which key holds another type (asked of Redis,
/// with the commands distlock has the rights for).
pub(crate) async fn explain(route: &dyn Route, call: &ScriptCall, failed: Failed) -> Failed {
    let error = match failed.error {
        LockError::Misconfigured {
            op,
            problem: Misconfiguration::Permissions,
            detail,
            source,
        } if detail.is_empty() => LockError::Misconfigured {
            op,
            problem: Misconfiguration::Permissions,
            detail: refused_command(call.source(), &source.to_string()),
            source,
        },
        LockError::WrongType { op, key, .. } if key.is_empty() => {
            let (key, found) = Box::pin(wrong_type(route, call)).await.unwrap_or_default();
            LockError::WrongType { op, key, found }
        }
        error => error,
    };
    Failed { error, ..failed }
}

/// What an ACL user may not run, from a refusal's text `error` of a script whose source is
/// `code`, with the `ACL SETUSER` words that grant it.
fn refused_command(code: &str, error: &str) -> String {
    // Refused before the script ran: `... no permissions to run the 'evalsha' command`.
    if let Some(command) = error
        .split("permissions to run the '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
    {
        return format!("it may not run {command}; grant it: ACL SETUSER <user> +{command}");
    }
    if error.contains("keys") {
        return "it may not touch the keys under distlock's prefix; grant them: \
                ACL SETUSER <user> ~<prefix>* (the manager's prefix, `distlock:` by default)"
            .to_owned();
    }
    // Refused inside the script: `... script: <sha>, on @user_script:<line>.`
    let line = error
        .split("@user_script:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<usize>().ok());
    let commands: Vec<String> = line
        .and_then(|n| code.lines().nth(n.checked_sub(1)?))
        .map(commands_on)
        .unwrap_or_default();
    if commands.is_empty() {
        return String::new();
    }
    let grants: Vec<String> = commands
        .iter()
        .map(|c| format!("+{}", c.to_lowercase()))
        .collect();
    format!(
        "it may not run {} (line {} of distlock's script); grant it: ACL SETUSER <user> {}",
        commands.join(" or "),
        line.unwrap_or_default(),
        grants.join(" ")
    )
}

/// The Redis commands a line of Lua calls (`redis.call('SET', ...)`, `redis.pcall(publish, ...)`).
fn commands_on(line: &str) -> Vec<String> {
    let mut commands = Vec::new();
    for call in line.split("redis.").skip(1) {
        let Some(args) = call
            .strip_prefix("call(")
            .or_else(|| call.strip_prefix("pcall("))
        else {
            continue;
        };
        if let Some(quoted) = args.strip_prefix('\'') {
            if let Some(command) = quoted.split('\'').next() {
                commands.push(command.to_uppercase());
            }
        } else if args.starts_with("publish") {
            commands.push("PUBLISH (or SPUBLISH on a cluster)".to_owned());
        }
    }
    commands.dedup();
    commands
}

/// Which of `call`'s keys holds a value of another type than distlock keeps there, and what it
/// holds; `None` when it cannot be told.
async fn wrong_type(route: &dyn Route, call: &ScriptCall) -> Option<(String, String)> {
    let keys: Vec<String> = call
        .keys()
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .collect();
    let mut probe = ScriptCall::new("diagnose", &TYPES, Kind::Read, keys.len());
    for key in &keys {
        probe.key(key);
    }
    let types: Vec<String> = route.invoke(&probe).await.ok()?;
    // A counter of another type is taken over by the scripts (see `fence.rs`): named last.
    let mismatched = keys
        .iter()
        .zip(&types)
        .filter(|(key, found)| {
            *found != "none" && LockKeys::kind_of(key).is_some_and(|kind| kind.holds() != *found)
        })
        .min_by_key(|(key, _)| LockKeys::kind_of(key).is_some_and(|kind| kind.is_fence()));
    let (key, found) = mismatched?;
    let found = match found.as_str() {
        "string" => "a string",
        "list" => "a list",
        "hash" => "a hash",
        _ => "a set, sorted set or stream",
    };
    Some((key.clone(), found.to_owned()))
}

/// Probes the type of each key with the commands distlock has the rights for (`TYPE` is not
/// among them): `GET` fails but on a string, `HGET` but on a hash, `LREM` (of a value no list of
/// distlock holds, so it removes nothing) but on a list.
///
/// KEYS: the keys. Returns for each `none`, `string`, `hash`, `list` or `other`.
static TYPES: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"#!lua
local types = {}
for i, key in ipairs(KEYS) do
  local t = 'other'
  if redis.call('EXISTS', key) == 0 then t = 'none'
  elseif type(redis.pcall('GET', key)) ~= 'table' then t = 'string'
  elseif type(redis.pcall('HGET', key, '~')) ~= 'table' then t = 'hash'
  elseif type(redis.pcall('LREM', key, 0, '~')) ~= 'table' then t = 'list'
  end
  types[i] = t
end
return types
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_inside_a_script_names_the_command_on_the_line_redis_names() {
        let code = "#!lua\nlocal a = 1\nlocal t = redis.call('TIME')\nreturn t";
        let error = "ERR The user executing the script can't run this command or subcommand \
                     script: 4959c9, on @user_script:3.";
        let detail = refused_command(code, error);
        assert!(detail.contains("may not run TIME"), "{detail}");
        assert!(detail.contains("ACL SETUSER <user> +time"), "{detail}");
        // Before the script ran: Redis names the command itself.
        let detail = refused_command(
            code,
            "NOPERM User app has no permissions to run the 'evalsha' command",
        );
        assert!(detail.contains("+evalsha"), "{detail}");
        // A line without a command: nothing made up.
        assert_eq!(refused_command(code, "ERR ... on @user_script:2."), "");
    }

    #[test]
    fn commands_on_a_line_are_read_with_their_publish_variable() {
        assert_eq!(
            commands_on("if redis.pcall('HDEL', W, t) == 1 then redis.call('LREM', Q, 1, t) end"),
            ["HDEL", "LREM"]
        );
        assert_eq!(
            commands_on("  redis.pcall(publish, L, '')"),
            ["PUBLISH (or SPUBLISH on a cluster)"]
        );
    }

    /// Every command a script runs is one the check asks about (or one it leaves out on
    /// purpose), so `ping` cannot pass a user a lock then fails.
    #[test]
    fn the_check_covers_every_command_every_script_runs() {
        let scripts: [&Lua; 7] = [
            &crate::scripts::ACQUIRE,
            &crate::scripts::RELEASE,
            &crate::scripts::EXTEND,
            &crate::fair::ACQUIRE_FAIR,
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
