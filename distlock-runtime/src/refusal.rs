//! What a refusal Redis words vaguely means exactly: the command an ACL user may not run inside a
//! script (from the script line Redis names), the key that holds another type (asked of Redis
//! with the commands distlock has the rights for). Applied to every failed script call by the
//! route layer (`Route::call`), and to `LockManager::ping`'s check.

use std::future::Future;
use std::sync::LazyLock;

use crate::call::{Kind, ScriptCall};
use crate::error::{LockError, Misconfiguration};
use crate::failed::Failed;
use crate::keys::LockKeys;
use crate::scripts::Lua;

/// Says more about a refusal of `call` than Redis did: which command an ACL user may not run
/// (from the line of the script Redis names), which key holds another type (asked of Redis,
/// with the commands distlock has the rights for).
///
/// `probe` runs a script call on the same servers as `call` and reads its answer (the route's
/// `invoke`): this module sits below the routes.
pub(crate) async fn explain<F, Fut>(call: &ScriptCall, failed: Failed, probe: F) -> Failed
where
    F: FnOnce(ScriptCall) -> Fut,
    Fut: Future<Output = Result<Vec<String>, LockError>>,
{
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
            let (key, found) = wrong_type(call, probe).await.unwrap_or_default();
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
pub(crate) fn commands_on(line: &str) -> Vec<String> {
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
async fn wrong_type<F, Fut>(call: &ScriptCall, probe: F) -> Option<(String, String)>
where
    F: FnOnce(ScriptCall) -> Fut,
    Fut: Future<Output = Result<Vec<String>, LockError>>,
{
    let keys: Vec<String> = call
        .keys()
        .map(|key| String::from_utf8_lossy(key).into_owned())
        .collect();
    let mut types_of = ScriptCall::new("diagnose", &TYPES, Kind::Read, keys.len());
    for key in &keys {
        types_of.key(key);
    }
    let types = probe(types_of).await.ok()?;
    // A counter of another type is taken over by the scripts (see `scripts/draw.lua`): named
    // last.
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

/// Probes the type of each key with the commands distlock has the rights for:
/// `scripts/key_types.lua`.
pub(crate) static TYPES: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(crate::scripts::lua!("#!lua"; "scripts/key_types.lua")));

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
}
