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

/// A boxed future, as the object-safe [`Route`] returns.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A Lua script: its source and its SHA-1, which `EVALSHA` names it by.
pub(crate) struct Lua {
    code: String,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: impl Into<String>) -> Self {
        let code = code.into();
        let hash = sha1_smol::Sha1::from(code.as_bytes()).digest().to_string();
        Self { code, hash }
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
    /// Builds the release that undoes the acquire (`release::undo_of`, passed in: releasing
    /// sits above this module).
    pub(crate) make_undo: fn(&Taking) -> ScriptCall,
}

impl Taking {
    /// The fencing counters of the keys taken.
    pub(crate) fn fences(&self) -> impl Iterator<Item = &str> {
        self.indices.iter().map(|&i| self.keys[i].fence.as_str())
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
        // they are held (see `scripts.rs`).
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
    /// The keys, and the arguments, each in one buffer (a command without a name): no
    /// allocation per key or argument, and copied into the `EVALSHA` command in one pass.
    keys: Cmd,
    args: Cmd,
    /// How many keys `keys` holds.
    key_count: usize,
    pub(crate) kind: Kind,
}

impl ScriptCall {
    pub(crate) fn new(op: &'static str, lua: &'static Lua, kind: Kind) -> Self {
        Self {
            op,
            lua,
            keys: Cmd::with_capacity(4, 128),
            args: Cmd::with_capacity(4, 64),
            key_count: 0,
            kind,
        }
    }

    /// Adds a key. Keys and arguments may be added in any order: the keys go first.
    pub(crate) fn key(&mut self, key: &str) -> &mut Self {
        self.keys.arg(key);
        self.key_count += 1;
        self
    }

    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// An owned copy of the call, for one server of a quorum (its kind is [`Kind::Read`]:
    /// the combining is the quorum's).
    pub(crate) fn detached(&self) -> Self {
        Self {
            op: self.op,
            lua: self.lua,
            keys: self.keys.clone(),
            args: self.args.clone(),
            key_count: self.key_count,
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

    /// The first key, if any.
    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        match self.keys.args_iter().next() {
            Some(Arg::Simple(key)) => Some(key),
            _ => None,
        }
    }

    /// `EVALSHA`: the script by its hash.
    pub(crate) fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", &self.lua.hash)
    }

    /// `EVAL`: the whole script, which also loads it (for a server that lost it: a restart, a
    /// `SCRIPT FLUSH`, a promoted replica).
    pub(crate) fn eval(&self) -> Cmd {
        self.command("EVAL", &self.lua.code)
    }

    fn command(&self, name: &str, script: &str) -> Cmd {
        let parts = || self.keys.args_iter().chain(self.args.args_iter());
        let (count, bytes) = parts().fold((0, 0), |(n, len), part| match part {
            Arg::Simple(part) => (n + 1, len + part.len()),
            _ => (n, len),
        });
        let mut cmd = Cmd::with_capacity(count + 3, bytes + name.len() + script.len() + 8);
        cmd.arg(name).arg(script).arg(self.key_count);
        for part in parts() {
            if let Arg::Simple(part) = part {
                cmd.arg(part);
            }
        }
        cmd
    }

    /// Sends `EVALSHA` through `send`, and `EVAL` once if the server does not know the script.
    /// Every distlock script may run twice: an acquire that finds its own token takes the key
    /// as it is, release and extend are idempotent.
    pub(crate) async fn run_with<'a, F, Fut>(&'a self, mut send: F) -> Result<Value, Failed>
    where
        F: FnMut(Cmd) -> Fut,
        Fut: Future<Output = Result<Value, Failed>> + 'a,
    {
        match send(self.evalsha()).await {
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
    fn keys_go_before_arguments_whatever_order_they_were_added_in() {
        // As the renewal batch adds them: a lease's keys, its arguments, the next lease's keys.
        let mut call = ScriptCall::new("test", &ECHO, Kind::Read);
        call.key("k1").arg("a1").arg(7).key("k2").arg("a2");
        let mut expected = redis::cmd("EVALSHA");
        expected
            .arg(&ECHO.hash)
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg("a1")
            .arg(7)
            .arg("a2");
        assert_eq!(
            call.evalsha().get_packed_command(),
            expected.get_packed_command()
        );
        assert_eq!(call.first_key(), Some(&b"k1"[..]));
        assert_eq!(
            call.detached().evalsha().get_packed_command(),
            expected.get_packed_command()
        );
    }
}
