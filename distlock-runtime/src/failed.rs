//! A call that failed, how far its request got, and the one classification of a failed reply
//! that every route uses: whether what the request would have written may be there.

use std::time::Duration;

use crate::error::{LockError, Reply};

/// The pause before a request refused for a passing reason (`LOADING`, `BUSY`, `MASTERDOWN`,
/// see [`Failed::is_passing`]) is sent again.
pub(crate) const PASSING_RETRY: Duration = Duration::from_millis(20);

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
            .is_some_and(|source| Reply::of(source) == Reply::Passing)
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
    if Reply::of(&source) == Reply::Connection {
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
