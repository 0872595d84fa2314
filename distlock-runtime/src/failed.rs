//! A call that failed, and how far its request got: whether what the request would have
//! written may be there. (What its reply means is [`Reply`]'s to say.)

use std::time::Duration;

use crate::error::{LockError, Reply};

/// A call that failed, and how far its request got.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: LockError,
    pub(crate) reached: Reached,
}

impl Failed {
    /// A failure whose request may have reached Redis, and run.
    pub(crate) fn maybe(error: LockError) -> Self {
        let reached = Reached::Maybe;
        Self { error, reached }
    }

    /// What Redis (or the client) answered, if it did.
    pub(crate) fn reply(&self) -> Option<Reply> {
        self.error.redis_source().map(Reply::of)
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

/// How far a request got that Redis answered with `error`: it ran if an error raised inside a
/// script says where (`... script: <sha>, on @user_script:<line>.`), or if its answer could not
/// be read; a refusal before the script ran does not say where.
fn answered(error: &redis::RedisError) -> Reached {
    match error.kind() {
        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => Reached::Answered,
        _ if error.to_string().contains("@user_script") => Reached::Answered,
        _ => Reached::Refused,
    }
}

impl Reached {
    /// How far a request got whose last try got as far as this (`unsent`: it failed before it
    /// left), after tries that got as far as `earlier`: a try that never left got no further
    /// than those before it, and one refused (or never sent) after one that may have reached
    /// Redis still may have.
    pub(crate) fn after(self, earlier: Reached, unsent: bool) -> Reached {
        match self {
            Reached::Maybe if unsent => earlier,
            Reached::No | Reached::Refused if earlier == Reached::Maybe => Reached::Maybe,
            reached => reached,
        }
    }
}

/// What a request that was sent and failed with `source` tells: a timeout or a broken
/// connection may have reached Redis; an error Redis answered ran the script (or not, see
/// [`answered`]).
pub(crate) fn failed(op: &'static str, source: redis::RedisError, after: Duration) -> Failed {
    if source.is_timeout() {
        return Failed::maybe(LockError::RedisTimeout { op, after });
    }
    if Reply::of(&source) == Reply::Connection {
        return Failed::maybe(LockError::Redis { op, source });
    }
    let reached = answered(&source);
    Failed {
        error: LockError::from_redis(op, source),
        reached,
    }
}
