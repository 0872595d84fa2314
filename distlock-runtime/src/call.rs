//! A script call, and what its failure tells: the unit every layer above a route speaks in.
//!
//! The request logic describes each Redis operation as a [`ScriptCall`] (a [`Lua`] script, its
//! keys and arguments, and its [`Kind`]); a route (`topology/`) runs it; a call that fails says
//! how far its request got ([`Failed`], [`Reached`]), which decides whether what it would have
//! written may be there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::{Arg, Cmd, ToRedisArgs, Value};

use crate::error::LockError;
use crate::keys::LockKeys;
use crate::scripts::Announce;

/// A boxed future, as the object-safe [`Route`] returns.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A Lua script: its source (composed at compile time, see `scripts/`) and its SHA-1, which
/// `EVALSHA` names it by.
pub(crate) struct Lua {
    code: &'static str,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: &'static str) -> Self {
        let hash = sha1_smol::Sha1::from(code.as_bytes()).digest().to_string();
        Self { code, hash }
    }

    /// The script's source, as Redis runs it (line numbers in its errors count from here).
    pub(crate) fn code(&self) -> &'static str {
        self.code
    }

    /// The script's SHA-1 in hex, as `EVALSHA` names it.
    pub(crate) fn hash(&self) -> &str {
        &self.hash
    }
}

/// What a call does, which says how a quorum combines its nodes' answers (see `quorum.rs`).
pub(crate) enum Kind {
    /// Writes nothing; counts when a majority answers.
    Read,
    /// Takes lock keys: answers a fencing token, or who holds them (`scripts::Acquire`).
    Acquire(Taking),
    /// Releases by token: answers how many keys were released.
    Release,
    /// Releases whoever holds (`force_release`): answers how many keys were released; run to
    /// the end on every server before it counts.
    ForceRelease,
    /// Extends leases by token: answers one 0 or 1 per lease.
    Extend,
    /// Raises fencing counters: answers nothing of interest.
    Raise,
    /// A fair queue's call; a route that refuses fair requests never sees one.
    Fair,
}

/// What an acquire call takes, so a quorum can write the greatest fencing token back to the
/// keys' counters, and a failed or unconfirmed acquire can be undone. The undo is built only
/// when needed: most acquires never use it.
pub(crate) struct Taking {
    /// The request's keys; the call takes those at `indices`.
    pub(crate) keys: Arc<[LockKeys]>,
    pub(crate) indices: Vec<usize>,
    pub(crate) token: Arc<str>,
    /// The lease's ttl.
    pub(crate) ttl: Duration,
    /// How the route announces a release (see `Route::publish_command`).
    pub(crate) publish: &'static str,
    /// Which releases it announces (see `Route::announces`).
    pub(crate) announce: Announce,
    /// Builds the release that undoes the acquire (`release::undo_of`, passed in: releasing
    /// sits above this module).
    pub(crate) make_undo: fn(&Taking) -> ScriptCall,
}

impl Taking {
    /// The fencing counters of the keys taken.
    pub(crate) fn fences(&self) -> impl Iterator<Item = &str> {
        self.indices.iter().map(|&i| self.keys[i].fence())
    }

    /// The release that undoes this acquire.
    pub(crate) fn undo(&self) -> ScriptCall {
        (self.make_undo)(self)
    }
}

impl Kind {
    /// Whether, with `min_replicas`, the call counts only once replicas confirmed it: what takes
    /// or prolongs a lock, or raises a fencing counter.
    pub(crate) fn needs_replicas(&self) -> bool {
        matches!(
            self,
            Self::Acquire(_) | Self::Extend | Self::Raise | Self::Fair
        )
    }
}

/// With `min_replicas`: the answer of `call` sent in one pipeline with `WAIT` (`pipelined` is
/// `[answer, replicas that acknowledged]`). When fewer replicas than required did, an acquire is
/// undone at once (by `run`, its release) and the call fails with [`LockError::Replication`]; it
/// counts as having written (so the acquire also releases by token, in the background, whatever
/// the undo could not).
pub(crate) async fn confirmed<F, Fut>(
    call: &ScriptCall,
    pipelined: Value,
    replicas: Replicas,
    run: F,
) -> Result<Value, Failed>
where
    F: FnOnce(ScriptCall) -> Fut,
    Fut: Future<Output = Result<Value, Failed>>,
{
    let (answer, acked) = match pipelined {
        Value::Array(mut values) if values.len() == 2 => {
            let acked = match values.pop() {
                Some(Value::Int(n)) => usize::try_from(n).unwrap_or(0),
                _ => 0,
            };
            (values.pop().unwrap_or(Value::Nil), acked)
        }
        _ => {
            return Err(Failed {
                error: LockError::Redis {
                    op: call.op,
                    source: redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "unexpected answer to a write and WAIT",
                    )),
                },
                reached: Reached::Answered,
            })
        }
    };
    if acked >= replicas.count {
        return Ok(answer);
    }
    let mut undone = false;
    if let Some(undo) = call.undo() {
        // The acquire script answers a fencing token when it took the keys, an array when
        // they are held (see `scripts/acquire.lua`).
        let took = matches!(answer, Value::Int(_) | Value::BulkString(_));
        if !took {
            // Held by another owner: nothing was written, and the answer stands.
            return Ok(answer);
        }
        undone = run(undo).await.is_ok();
    }
    Err(Failed {
        error: LockError::Replication {
            op: call.op,
            acked,
            needed: replicas.count,
            within: replicas.timeout,
        },
        reached: if undone {
            Reached::Refused
        } else {
            Reached::Answered
        },
    })
}

/// One script call: the script, its keys and arguments, and its [`Kind`].
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
    pub(crate) kind: Kind,
}

/// Where the keys start among an `EVALSHA` command's parts.
const FIRST_KEY: usize = 3;

impl ScriptCall {
    /// A call of `lua` with `key_count` keys, added with [`key`](Self::key) before any
    /// argument (Redis takes the count first).
    pub(crate) fn new(op: &'static str, lua: &'static Lua, kind: Kind, key_count: usize) -> Self {
        let mut evalsha = Cmd::with_capacity(FIRST_KEY + key_count + 6, 128 + 64 * key_count);
        evalsha.arg("EVALSHA").arg(lua.hash()).arg(key_count);
        Self {
            op,
            lua,
            evalsha,
            key_count,
            keys_added: 0,
            kind,
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

    /// An owned copy of the call, for one server of a quorum (its kind is [`Kind::Read`]:
    /// the combining is the quorum's).
    pub(crate) fn detached(&self) -> Self {
        Self {
            op: self.op,
            lua: self.lua,
            evalsha: self.evalsha.clone(),
            key_count: self.key_count,
            keys_added: self.keys_added,
            kind: Kind::Read,
        }
    }

    /// [`detached`](Self::detached), with one more argument (a quorum's proposed fencing
    /// token).
    pub(crate) fn with_arg(&self, arg: impl ToRedisArgs) -> Self {
        let mut call = self.detached();
        call.arg(arg);
        call
    }

    /// The release that undoes an acquire (built from its kind).
    pub(crate) fn undo(&self) -> Option<ScriptCall> {
        match &self.kind {
            Kind::Acquire(taking) => Some(taking.undo()),
            _ => None,
        }
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
        eval.arg("EVAL").arg(self.lua.code);
        for part in self.evalsha.args_iter().skip(2) {
            if let Arg::Simple(part) = part {
                eval.arg(part);
            }
        }
        eval
    }

    /// Sends `EVALSHA` through `send`, and `EVAL` once if the server does not know the script.
    /// Every distlock script may run twice: an acquire that finds its own token takes the key
    /// as it is, release and extend are idempotent.
    pub(crate) async fn run_with<'a, F, Fut>(&'a self, mut send: F) -> Result<Value, Failed>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, Failed>> + 'a,
    {
        match send(self.evalsha().clone()).await {
            Err(failed) if failed.is_noscript() => send(self.eval()).await,
            answer => answer,
        }
    }
}

/// `min_replicas`: how many replicas must acknowledge an acquire or extend, and how long to
/// wait for them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replicas {
    pub(crate) count: usize,
    pub(crate) timeout: Duration,
}

/// A call that failed, and how far its request got.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: LockError,
    pub(crate) reached: Reached,
}

impl Failed {
    /// Whether a replica (a demoted primary) refused the write before running it.
    pub(crate) fn is_read_only(&self) -> bool {
        matches!(&self.error, LockError::Redis { source, .. }
            if source.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly))
    }

    /// Whether the server refused it for a passing reason (`LOADING`, `BUSY`, `MASTERDOWN`)
    /// before running it.
    pub(crate) fn is_passing(&self) -> bool {
        self.error
            .redis_source()
            .is_some_and(|source| crate::error::Reply::of(source) == crate::error::Reply::Passing)
    }

    /// Whether the connection broke (or could not be used) under the request.
    pub(crate) fn broke_connection(&self) -> bool {
        matches!(&self.error, LockError::Redis { source, .. } if is_connection_failure(source))
    }

    /// Whether the server did not know the script (`NOSCRIPT`): nothing ran.
    pub(crate) fn is_noscript(&self) -> bool {
        matches!(&self.error, LockError::Redis { source, .. }
            if source.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
    }
}

/// How far a failed request got, which decides whether what it would have written may be there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reached {
    /// Never sent: no connection could be had.
    No,
    /// Sent, or maybe sent, with no answer: it may still arrive and run.
    Maybe,
    /// Redis ran it and answered with an error: whatever it wrote before failing stays
    /// written (or its answer could not be read).
    Answered,
    /// Redis refused it before running it (a replica's `READONLY`, `LOADING`, `OOM`, a key the
    /// user may not touch, a script that does not compile): nothing was written.
    Refused,
}

/// Whether a failed request ran on the server: an error raised inside a script says where
/// (`... script: <sha>, on @user_script:<line>.`), a refusal before the script ran does not,
/// and an answer that could not be read came from a request that ran.
pub(crate) fn ran(error: &redis::RedisError) -> bool {
    match error.kind() {
        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => true,
        _ => error.to_string().contains("@user_script"),
    }
}

impl Reached {
    /// A refusal after an earlier try that may have reached Redis still may have.
    pub(crate) fn max_with(self, earlier: Reached) -> Reached {
        if earlier == Reached::Maybe && self == Reached::Refused {
            Reached::Maybe
        } else {
            self
        }
    }
}

/// What a request that was sent and failed with `source` tells: a timeout or a broken
/// connection may have reached Redis; an error Redis answered ran the script (or not, see
/// [`ran`]).
pub(crate) fn failed(op: &'static str, source: redis::RedisError, after: Duration) -> Failed {
    if source.is_timeout() {
        return Failed {
            error: LockError::RedisTimeout { op, after },
            reached: Reached::Maybe,
        };
    }
    if is_connection_failure(&source) {
        return Failed {
            error: LockError::Redis { op, source },
            reached: Reached::Maybe,
        };
    }
    let reached = if ran(&source) {
        Reached::Answered
    } else {
        Reached::Refused
    };
    Failed {
        error: LockError::from_redis(op, source),
        reached,
    }
}

/// True when the error says the connection itself is unusable, not that the command failed.
pub(crate) fn is_connection_failure(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_timeout()
        || err.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    static ECHO: std::sync::LazyLock<Lua> =
        std::sync::LazyLock::new(|| Lua::new("return {KEYS, ARGV}"));

    #[test]
    fn a_call_is_its_evalsha_command_and_falls_back_to_eval_with_the_same_parts() {
        let mut call = ScriptCall::new("test", &ECHO, Kind::Read, 2);
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
        let expected = by_hand("EVALSHA", &ECHO.hash);
        assert_eq!(call.evalsha().get_packed_command(), expected);
        assert_eq!(call.first_key(), Some(&b"k1"[..]));
        assert_eq!(call.detached().evalsha().get_packed_command(), expected);
        assert_eq!(call.eval().get_packed_command(), by_hand("EVAL", ECHO.code));
        assert_eq!(
            ScriptCall::new("none", &ECHO, Kind::Read, 0).first_key(),
            None
        );
    }

    #[test]
    #[should_panic(expected = "an argument before every key was added")]
    #[cfg(debug_assertions)]
    fn an_argument_before_the_last_key_is_refused() {
        let mut call = ScriptCall::new("test", &ECHO, Kind::Read, 2);
        call.key("k1").arg("a1").key("k2");
    }
}
