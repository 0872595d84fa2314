//! A script call, and what its failure tells: the unit every layer above `topology/` speaks in.
//!
//! The request logic describes each Redis operation as a [`ScriptCall`] (a [`Lua`] script, its
//! keys and arguments, and what `min_replicas` asks of it); the deployment (`topology/`) runs
//! it; a call that fails says how far its request got ([`Failed`](crate::failed::Failed),
//! [`Reached`](crate::failed::Reached)), which decides whether what it would have written may
//! be there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::{Arg, Cmd, ToRedisArgs};

use crate::keys::LockKeys;
use crate::scripts::flags::Announce;
use crate::scripts::lua::Lua;

/// A boxed future, as the object-safe traits of `topology/` return.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What `min_replicas` asks of a call (see `topology/replicas.rs`): whether it counts only
/// once replicas confirmed it.
pub(crate) enum Confirm {
    /// Writes nothing a lease relies on (a read, a release): sent alone.
    No,
    /// `LockManager::ping`'s check (`scripts/check.lua`): with a `WAIT 0 0`, which waits for
    /// no replica: the server (or a proxy in front of it) shows that it takes `WAIT`, which
    /// every replicated write needs.
    Shown,
    /// Prolongs a lease, raises a fencing counter or takes a fair queue's key: counts once
    /// replicas confirmed it.
    Write,
    /// Takes the keys `Taking` names: as [`Write`](Self::Write), but an acquire that found a
    /// key held took nothing, and its answer stands (with what the replicas confirmed); one
    /// that took the keys unconfirmed is undone at once.
    Acquire(Arc<Taking>),
}

/// What one acquire call takes: the keys of `keys` at `indices` (which share a shard) by
/// `token`, for `ttl`. A quorum writes the greatest fencing token back to their counters
/// ([`raise_call`](crate::fence::raise_call)); a failed or unconfirmed acquire is undone
/// ([`undo`](Self::undo), announced with `publish` as `announce` says), built only when needed: most
/// acquires never use it.
pub(crate) struct Taking {
    pub(crate) keys: Arc<[LockKeys]>,
    pub(crate) indices: Vec<usize>,
    pub(crate) token: Arc<str>,
    pub(crate) ttl: Duration,
    pub(crate) publish: &'static str,
    pub(crate) announce: Announce,
}

impl Taking {
    /// The fencing counters of the keys taken.
    pub(crate) fn fences(&self) -> impl Iterator<Item = &str> {
        self.indices.iter().map(|&i| self.keys[i].fence())
    }
}

/// One script call: the script, its keys and arguments, and what `min_replicas` asks of it.
pub(crate) struct ScriptCall {
    /// What it does, for errors and logs.
    pub(crate) op: &'static str,
    lua: &'static Lua,
    /// The `EVALSHA` command itself, built as the keys and arguments are added: sending the
    /// call copies nothing but its encoding. Its first three parts are `EVALSHA`, the hash and
    /// the key count.
    evalsha: Cmd,
    /// How many keys the call declared, and how many were added so far.
    key_count: usize,
    keys_added: usize,
    pub(crate) confirm: Confirm,
    /// When the wait this call is part of ends, for an attempt of a request that waits (its
    /// acquire, and its fencing write-back): with `min_replicas`, its `WAIT` ends by then
    /// plus half a response timeout (see `topology/replicas.rs`).
    pub(crate) deadline: Option<tokio::time::Instant>,
}

/// Where the keys start among an `EVALSHA` command's parts.
const FIRST_KEY: usize = 3;

impl ScriptCall {
    /// A call of `lua` with `key_count` keys, added with [`key`](Self::key) before any
    /// argument (Redis takes the count first).
    pub(crate) fn new(
        op: &'static str,
        lua: &'static Lua,
        confirm: Confirm,
        key_count: usize,
    ) -> Self {
        let mut evalsha = Cmd::with_capacity(FIRST_KEY + key_count + 6, 128 + 64 * key_count);
        evalsha.arg("EVALSHA").arg(lua.hash()).arg(key_count);
        Self {
            op,
            lua,
            evalsha,
            key_count,
            keys_added: 0,
            confirm,
            deadline: None,
        }
    }

    /// Adds the next key; every key goes before the first argument.
    pub(crate) fn key(&mut self, key: &str) -> &mut Self {
        debug_assert!(
            self.keys_added < self.key_count,
            "{}: more keys than declared",
            self.op
        );
        debug_assert_eq!(
            self.evalsha.args_iter().count(),
            FIRST_KEY + self.keys_added,
            "{}: a key after an argument",
            self.op
        );
        self.evalsha.arg(key);
        self.keys_added += 1;
        self
    }

    /// Adds the next argument, after every key.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        debug_assert_eq!(
            self.keys_added, self.key_count,
            "{}: an argument before every key was added",
            self.op
        );
        self.evalsha.arg(arg);
        self
    }

    /// An owned copy of the call, for the nodes of a quorum (whose replicas nobody waits for).
    pub(crate) fn detached(&self) -> Self {
        Self {
            op: self.op,
            lua: self.lua,
            evalsha: self.evalsha.clone(),
            key_count: self.key_count,
            keys_added: self.keys_added,
            confirm: Confirm::No,
            deadline: self.deadline,
        }
    }

    /// [`detached`](Self::detached), with one more argument (a quorum's proposed fencing
    /// token).
    pub(crate) fn with_arg(&self, arg: impl ToRedisArgs) -> Self {
        let mut call = self.detached();
        call.arg(arg);
        call
    }

    /// The script's source.
    pub(crate) fn source(&self) -> &str {
        self.lua.code()
    }

    /// The call's keys, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.evalsha
            .args_iter()
            .skip(FIRST_KEY)
            .take(self.keys_added)
            .filter_map(|arg| match arg {
                Arg::Simple(key) => Some(key),
                _ => None,
            })
    }

    /// The first key, if any.
    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        if self.key_count == 0 {
            return None;
        }
        match self.evalsha.args_iter().nth(FIRST_KEY) {
            Some(Arg::Simple(key)) => Some(key),
            _ => None,
        }
    }

    /// `EVALSHA`: the script by its hash.
    pub(crate) fn evalsha(&self) -> &Cmd {
        &self.evalsha
    }

    /// `EVAL`: the whole script, which also loads it (for a server that lost it: a restart, a
    /// `SCRIPT FLUSH`, a promoted replica). Built when needed: it is rare.
    pub(crate) fn eval(&self) -> Cmd {
        let mut eval = Cmd::with_capacity(0, 0);
        eval.arg("EVAL").arg(self.lua.code());
        for part in self.evalsha.args_iter().skip(2) {
            if let Arg::Simple(part) = part {
                eval.arg(part);
            }
        }
        eval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static ECHO: std::sync::LazyLock<Lua> =
        std::sync::LazyLock::new(|| Lua::new("return {KEYS, ARGV}"));

    #[test]
    fn a_call_is_its_evalsha_command_and_falls_back_to_eval_with_the_same_parts() {
        let mut call = ScriptCall::new("test", &ECHO, Confirm::No, 2);
        call.key("k1").key("k2").arg("a1").arg(7).arg("a2");
        // `name script 2 k1 k2 a1 7 a2`, as a hand-built command.
        let by_hand = |name: &str, script: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(script)
                .arg(2)
                .arg("k1")
                .arg("k2")
                .arg("a1")
                .arg(7)
                .arg("a2");
            cmd.get_packed_command()
        };
        let expected = by_hand("EVALSHA", ECHO.hash());
        assert_eq!(call.evalsha().get_packed_command(), expected);
        assert_eq!(call.first_key(), Some(&b"k1"[..]));
        assert_eq!(call.detached().evalsha().get_packed_command(), expected);
        assert_eq!(
            call.eval().get_packed_command(),
            by_hand("EVAL", ECHO.code())
        );
        assert_eq!(
            ScriptCall::new("none", &ECHO, Confirm::No, 0).first_key(),
            None
        );
    }

    #[test]
    #[should_panic(expected = "an argument before every key was added")]
    #[cfg(debug_assertions)]
    fn an_argument_before_the_last_key_is_refused() {
        let mut call = ScriptCall::new("test", &ECHO, Confirm::No, 2);
        call.key("k1").arg("a1").key("k2");
    }
}
