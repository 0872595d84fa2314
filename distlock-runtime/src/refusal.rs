//! What a refusal Redis words vaguely means exactly: the command an ACL user may not run inside a
//! script (from the script line Redis names), the key that holds another type (asked of Redis
//! with the commands distlock has the rights for). Applied to every failed script call by the
//! deployment (`topology/`: `Serial::call`, the quorum's operations), and to `LockManager::ping`'s
//! check.

use std::future::Future;
use std::sync::LazyLock;

use crate::call::{Confirm, ScriptCall};
use crate::error::{LockError, Misconfiguration};
use crate::failed::Failed;
use crate::keys::LockKeys;
use crate::scripts::Lua;

/// Says more about a refusal of `call` than Redis did: which command an ACL user may not run
/// (from the line of the script Redis names), which key holds another type (asked of Redis,
/// with the commands distlock has the rights for).
///
/// `probe` runs a script call on the same servers as `call` and reads its answer: this module
/// sits below `topology/`.
pub(crate) async fn explain<F, Fut>(call: &ScriptCall, mut failed: Failed, probe: F) -> Failed
where
    F: FnOnce(ScriptCall) -> Fut,
    Fut: Future<Output = Result<Vec<String>, LockError>>,
{
    match &mut failed.error {
        LockError::Misconfigured {
            problem,
            detail,
            source,
            ..
        } if detail.is_empty() => {
            let said = source.to_string();
            *detail = match problem {
                Misconfiguration::Permissions => refused_command(call.source(), &said),
                Misconfiguration::Unsupported => unoffered_command(call.source(), &said),
                _ => String::new(),
            };
        }
        LockError::WrongType { key, found, .. } if key.is_empty() => {
            (*key, *found) = wrong_type(call, probe).await.unwrap_or_default();
        }
        _ => {}
    }
    failed
}

/// What an ACL user may not run, from a refusal's text `error` of a script whose source is
/// `code`, with the `ACL SETUSER` words that grant it. Each server words a refusal its own way
/// (see `error.rs`): Redis 7.2 and later and Valkey name the command, inside a script and
/// outside; Redis 7.0 names it outside a script only, and inside one names the script's line.
fn refused_command(code: &str, error: &str) -> String {
    // `... no permissions to run the 'evalsha' command` (`'cluster|slots'` for a subcommand);
    // first, as the user's name in the text may hold any of the words looked for below.
    if let Some(command) = quoted(error, "permissions to run the '") {
        let shown = command.replace('|', " ").to_uppercase();
        let (_, at_line) = commands_at(code, error);
        let grant = grant(&shown);
        return format!("it may not run {shown}{at_line}; grant it: ACL SETUSER <user> {grant}");
    }
    // Redis 7.0: `... access at least one of the keys`, `... access one of the keys`; later:
    // `No permissions to access a key`.
    if error.contains("of the keys") || error.contains("access a key") {
        return "it may not touch the keys under distlock's prefix; grant them: \
                ACL SETUSER <user> ~<prefix>* (the manager's prefix, `distlock:` by default)"
            .to_owned();
    }
    // Redis 7.0: `... can't publish to the channel`, `... access one of the channels`; later:
    // `No permissions to access a channel`.
    if error.contains("channel") {
        return "it may not use the locks' channels (release notifications); grant them: \
                ACL SETUSER <user> &<prefix>* (the manager's prefix, `distlock:` by default)"
            .to_owned();
    }
    // Redis 7.0 inside a script: the commands on the line it names (`PUBLISH (or SPUBLISH on a
    // cluster)` granted as said).
    let (commands, at_line) = commands_at(code, error);
    if commands.is_empty() {
        return String::new();
    }
    let grants: Vec<String> = commands
        .iter()
        .map(|c| format!("+{}", c.to_lowercase()))
        .collect();
    format!(
        "it may not run {}{at_line}; grant it: ACL SETUSER <user> {}",
        commands.join(" or "),
        grants.join(" ")
    )
}

/// What a server that does not know a command says it lacks, from its answer `error` to a
/// script whose source is `code`: the command it names (`ERR unknown command 'WAIT'`), else,
/// refused inside the script (`ERR Unknown Redis command called from script`), the commands on
/// the line it names.
fn unoffered_command(code: &str, error: &str) -> String {
    let (commands, at_line) = match quoted(error, "command '") {
        Some(command) => (vec![command.to_uppercase()], String::new()),
        None => commands_at(code, error),
    };
    if commands.is_empty() {
        return String::new();
    }
    not_offered(&commands, &at_line)
}

/// `it does not offer WAIT`, for `commands` a server or proxy does not offer (`at_line`: where
/// in distlock's script, if it said), with what to configure instead where there is a way.
pub(crate) fn not_offered(commands: &[String], at_line: &str) -> String {
    let detail = format!("it does not offer {}{at_line}", commands.join(" or "));
    and_instead(detail, commands, "; ")
}

/// `detail`, then what to configure instead of each of `commands` that has a way (see
/// [`instead`]), each after `then`.
pub(crate) fn and_instead(detail: String, commands: &[String], then: &str) -> String {
    let ways = commands.iter().filter_map(|command| instead(command));
    ways.fold(detail, |detail, way| format!("{detail}{then}{way}"))
}

/// The commands on the line of the script (source `code`) that an error raised inside it names
/// (`... script: <sha>, on @user_script:<line>.`), and ` (line N of distlock's script)` for
/// messages; nothing for an error raised outside a script.
fn commands_at(code: &str, error: &str) -> (Vec<String>, String) {
    let (_, rest) = error.split_once("@user_script:").unwrap_or_default();
    let digits = rest.split(|c: char| !c.is_ascii_digit()).next();
    let Some(n) = digits.and_then(|n| n.parse::<usize>().ok()) else {
        return (Vec::new(), String::new());
    };
    let line = n.checked_sub(1).and_then(|i| code.lines().nth(i));
    let commands = line.map(commands_on).unwrap_or_default();
    (commands, format!(" (line {n} of distlock's script)"))
}

/// The first non-empty text between `before` and the next `'` in `error`: the command a
/// server names (`... run the 'time' command`, `unknown command 'WAIT'`).
fn quoted<'a>(error: &'a str, before: &str) -> Option<&'a str> {
    let (_, rest) = error.split_once(before)?;
    let command = rest.split('\'').next()?;
    (!command.is_empty()).then_some(command)
}

/// The `ACL SETUSER` word that grants a command as the messages show it (`WAIT`,
/// `CLUSTER SLOTS`, or a check's `GET distlock:lock:{k}`, whose key is not part of it):
/// `+wait`, `+cluster|slots`, `+get`.
pub(crate) fn grant(command: &str) -> String {
    let mut words = command.split(' ');
    let name = words.next().unwrap_or_default().to_lowercase();
    match words.next() {
        Some(sub) if name == "cluster" => format!("+cluster|{}", sub.to_lowercase()),
        _ => format!("+{name}"),
    }
}

/// What to configure instead of granting `command` (`WAIT`, `CLUSTER SLOTS`), which a setting
/// of the manager needs and some managed services refuse; `None` for a command every
/// deployment offers.
pub(crate) fn instead(command: &str) -> Option<&'static str> {
    let name = command.split([' ', '|']).next().unwrap_or_default();
    match name.to_uppercase().as_str() {
        "WAIT" => Some(
            "min_replicas needs WAIT (each acquire and extension waits for its replicas with \
             it): where the service refuses WAIT (serverless offerings, some proxies), build \
             the manager without min_replicas",
        ),
        "CLUSTER" => Some(
            "a cluster manager needs CLUSTER SLOTS (to find each slot's primary): behind a \
             proxy that offers no CLUSTER command (as some managed services present a \
             cluster), build the manager with LockManagerBuilder::url(the proxy's URL) (the \
             distlock tool: --url), and the proxy routes each key",
        ),
        _ => None,
    }
}

/// The detail of a refusal of `command` (`WAIT`, `CLUSTER SLOTS`), a command the manager sends
/// itself rather than from a script: an ACL rule's ([`Misconfiguration::Permissions`]) says
/// what grants it, a server's or proxy's that does not offer it
/// ([`Misconfiguration::Unsupported`]) says so; both say what to configure instead, where
/// there is something.
pub(crate) fn refused_own_command(command: &str, problem: Misconfiguration) -> String {
    let commands = [command.to_owned()];
    if problem != Misconfiguration::Permissions {
        return not_offered(&commands, "");
    }
    let refusal = format!(
        "it may not run {command}; grant it: ACL SETUSER <user> {}",
        grant(command)
    );
    and_instead(refusal, &commands, "; ")
}

/// The Redis commands a line of Lua calls (`redis.call('SET', ...)`, `redis.pcall(publish, ...)`).
pub(crate) fn commands_on(line: &str) -> Vec<String> {
    let calls = line.split("redis.").skip(1);
    let mut commands: Vec<String> = calls
        .filter_map(|call| {
            let args = call
                .strip_prefix("call(")
                .or_else(|| call.strip_prefix("pcall("))?;
            match args.strip_prefix('\'') {
                Some(quoted) => quoted.split('\'').next().map(str::to_uppercase),
                None => args
                    .starts_with("publish")
                    .then(|| "PUBLISH (or SPUBLISH on a cluster)".to_owned()),
            }
        })
        .collect();
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
    let keys: Vec<_> = call.keys().map(String::from_utf8_lossy).collect();
    let mut types_of = ScriptCall::new("diagnose", &TYPES, Confirm::No, keys.len());
    for key in &keys {
        types_of.key(key);
    }
    let types = probe(types_of).await.ok()?;
    // A counter of another type is taken over by the scripts (see `scripts/draw.lua`): named
    // last.
    let (key, found) = keys
        .iter()
        .zip(&types)
        .filter(|(key, found)| {
            *found != "none" && LockKeys::kind_of(key).is_some_and(|(_, holds)| holds != *found)
        })
        .min_by_key(|(key, _)| LockKeys::kind_of(key).is_some_and(|(kind, _)| kind == "fence:"))?;
    let found = match found.as_str() {
        found @ ("string" | "list" | "hash") => format!("a {found}"),
        _ => "a set, sorted set or stream".to_owned(),
    };
    Some((key.to_string(), found))
}

/// Probes the type of each key with the commands distlock has the rights for:
/// `scripts/key_types.lua`.
pub(crate) static TYPES: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(crate::scripts::lua!("#!lua"; "scripts/key_types.lua")));

#[cfg(test)]
mod tests {
    use super::*;

    /// Each server's words for each refusal (read off Redis 7.0.15, Redis 8.2.3 and Valkey
    /// 8.1.8, which words them as Redis 8.2 does), and what distlock makes of them.
    #[test]
    fn every_servers_words_for_a_refusal_name_what_to_grant() {
        let code = "#!lua\nlocal a = 1\nlocal t = redis.call('TIME')\nreturn t";
        let cases = [
            // A command inside a script: Redis 7.0 names the line, the others the command.
            (
                "ERR The user executing the script can't run this command or subcommand \
                 script: 4959c9, on @user_script:3.",
                "may not run TIME (line 3 of distlock's script); grant it: ACL SETUSER <user> \
                 +time",
            ),
            (
                "ERR ACL failure in script: User u has no permissions to run the 'time' command \
                 script: 4959c9, on @user_script:3.",
                "may not run TIME (line 3 of distlock's script); grant it: ACL SETUSER <user> \
                 +time",
            ),
            // A command outside a script.
            (
                "NOPERM this user has no permissions to run the 'evalsha' command",
                "may not run EVALSHA; grant it: ACL SETUSER <user> +evalsha",
            ),
            (
                "NOPERM User u has no permissions to run the 'evalsha' command",
                "may not run EVALSHA; grant it: ACL SETUSER <user> +evalsha",
            ),
            (
                "NOPERM User u has no permissions to run the 'cluster|slots' command",
                "may not run CLUSTER SLOTS; grant it: ACL SETUSER <user> +cluster|slots",
            ),
            // A user whose name holds words the key and channel refusals use.
            (
                "NOPERM User channel-svc-of the keys has no permissions to run the 'evalsha' \
                 command",
                "may not run EVALSHA; grant it: ACL SETUSER <user> +evalsha",
            ),
            // A key, inside a script and outside.
            (
                "ERR The user executing the script can't access at least one of the keys \
                 mentioned in the command arguments script: cbaa9c, on @user_script:3.",
                "may not touch the keys under distlock's prefix; grant them: ACL SETUSER <user> \
                 ~<prefix>*",
            ),
            (
                "ERR ACL failure in script: No permissions to access a key script: cbaa9c, on \
                 @user_script:3.",
                "may not touch the keys under distlock's prefix",
            ),
            (
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                "may not touch the keys under distlock's prefix",
            ),
            (
                "NOPERM No permissions to access a key",
                "may not touch the keys under distlock's prefix",
            ),
            // A channel, inside a script and outside.
            (
                "ERR The user executing the script can't publish to the channel mentioned in \
                 the command script: 8f9536, on @user_script:3.",
                "may not use the locks' channels (release notifications); grant them: ACL \
                 SETUSER <user> &<prefix>*",
            ),
            (
                "ERR ACL failure in script: No permissions to access a channel script: 8f9536, \
                 on @user_script:3.",
                "may not use the locks' channels",
            ),
            (
                "NOPERM No permissions to access a channel",
                "may not use the locks' channels",
            ),
        ];
        for (error, said) in cases {
            let detail = refused_command(code, error);
            assert!(
                detail.contains(said),
                "{error}\n  gave: {detail}\n  not: {said}"
            );
        }
        // A line without a command: nothing made up.
        assert_eq!(refused_command(code, "ERR ... on @user_script:2."), "");
    }

    #[test]
    fn a_command_the_server_does_not_offer_is_named_with_what_to_do_instead() {
        let code = "#!lua\nlocal a = 1\nlocal t = redis.call('TIME')\nreturn t";
        // Renamed away, called from a script: Redis's words, then Valkey's.
        for error in [
            "ERR Unknown Redis command called from script script: 4959c9, on @user_script:3.",
            "ERR Unknown command called from script script: 4959c9, on @user_script:3.",
        ] {
            assert_eq!(
                unoffered_command(code, error),
                "it does not offer TIME (line 3 of distlock's script)"
            );
        }
        // Named by the server or a proxy: with what to configure instead, where there is a way.
        let detail = unoffered_command(
            code,
            "ERR unknown command 'WAIT', with args beginning with: '1'",
        );
        assert!(detail.starts_with("it does not offer WAIT; "), "{detail}");
        assert!(detail.contains("without min_replicas"), "{detail}");
        let detail = unoffered_command(code, "ERR unknown command 'cluster'");
        assert!(detail.contains("LockManagerBuilder::url"), "{detail}");
        assert_eq!(unoffered_command(code, "ERR unknown"), "");
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
        // Redis 7.0, refused on that line: both commands granted as said.
        let code = "#!lua\nlocal publish = ARGV[1]\nredis.pcall(publish, KEYS[1], '')";
        let detail = refused_command(
            code,
            "ERR The user executing the script can't run this command or subcommand script: \
             8f9536, on @user_script:3.",
        );
        assert!(
            detail.ends_with("+publish (or spublish on a cluster)"),
            "{detail}"
        );
    }
}
