//! `min_replicas`: a write and its `WAIT`, in one pipeline on a connection of their own, for
//! every route (a cluster node's link included), and the undo of an acquire the replicas did
//! not confirm.
//!
//! **Within the wait.** An attempt of a request that waits ends by the wait's deadline plus one
//! response timeout, as on every route (see [`bounds`]): its `WAIT` waits for the replica
//! timeout, but never past half a response timeout after the deadline (the other half is the
//! script's, the answer's and the undo's). A try-lock's one attempt, and renewals, wait the
//! whole replica timeout.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::time::Instant;

use super::link::{Hop, Link, Request};
use crate::call::{Confirm, ScriptCall};
use crate::error::{LockError, Misconfiguration, Reply};
use crate::failed::{failed, Failed, Reached};
use crate::retry::{Decision, Retry, Tried};
use crate::scripts::Unconfirmed;
use crate::sync::lock;
use crate::time::millis;

/// `min_replicas`: how many replicas must acknowledge an acquire or extend, and how long to
/// wait for them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replicas {
    pub(crate) count: usize,
    pub(crate) timeout: Duration,
}

/// `min_replicas` on one link: how many replicas, and the connections kept for its writes.
pub(super) struct Replicated {
    pub(super) replicas: Replicas,
    spare: Mutex<Spare>,
}

/// Idle connections for replicated writes, and a count of failovers: a connection checked out
/// before a failover is not put back after it.
#[derive(Default)]
struct Spare {
    idle: Vec<MultiplexedConnection>,
    generation: u64,
}

/// Most idle connections kept for writes that wait for replicas.
const MAX_SPARE: usize = 8;

impl Replicated {
    pub(super) fn new(replicas: Replicas) -> Self {
        Self {
            replicas,
            spare: Mutex::new(Spare::default()),
        }
    }

    /// Drops the kept connections: the link's own failed, and they most likely died the same
    /// way (or reach a demoted primary).
    pub(super) fn forget_spare(&self) {
        let mut spare = lock(&self.spare);
        spare.idle.clear();
        spare.generation += 1;
    }

    /// Runs a write and `WAIT`s for `replicas` in one pipeline, on a connection of its own:
    /// `WAIT` blocks the connection it runs on until the replicas answer or its timeout passes,
    /// and on the shared multiplexed connection every other lock's commands would queue behind
    /// it. Such connections are kept (up to [`MAX_SPARE`]) for the next replicated write; a
    /// write that the replicas did not confirm is undone (see [`confirmed`]). A failed
    /// try is sent again as the link's policy says ([`Retry::link`]): a passing refusal 20 ms
    /// later on the same connection, within the response timeout.
    pub(super) async fn run(
        &self,
        link: &Link,
        call: &ScriptCall,
        hop: Hop,
    ) -> Result<Value, Failed> {
        let (now, response_timeout) = (Instant::now(), link.timeouts().response);
        // An attempt of a wait ends by its deadline plus one response timeout (one sent after
        // the deadline, a response timeout after it is sent), every try of it included.
        let finish = call
            .deadline
            .map(|deadline| deadline.max(now) + response_timeout);
        let (mut tried, mut sent) = (Tried::default(), Reached::No);
        // When the tries on one connection end: a response timeout after the first.
        let mut ends = None;
        let mut request = Request::script(call, hop);
        // The connection of the next try, and the failover count when it was checked out;
        // none: a spare one, or a fresh one after a failed try that asked for it.
        let (mut held, mut fresh) = (None, false);
        loop {
            let (conn, generation) = match held.take() {
                Some(held) => held,
                None => {
                    let reached = Reached::No.after(sent, false);
                    let checkout = self.checkout(link, call.op, fresh).await;
                    let (conn, generation, kept) =
                        checkout.map_err(|error| Failed { error, reached })?;
                    tried.kept = kept;
                    (conn, generation)
                }
            };
            let until = *ends.get_or_insert_with(|| Instant::now() + response_timeout);
            let (answer, within) = self
                .try_on(&conn, call, &request, finish, response_timeout)
                .await;
            let failed = match answer {
                Ok(answer) => {
                    self.keep(conn, generation);
                    let mut replicas = self.replicas;
                    replicas.timeout = within;
                    let undo = |undo| undo_within(link, undo, hop, finish);
                    return confirmed(call, answer, replicas, undo).await;
                }
                Err(failed) => failed,
            };
            if failed.reached == Reached::Maybe {
                sent = Reached::Maybe;
            }
            let retry = Retry::link(until, link.retries_read_only());
            match retry.decide(&failed, &mut tried, Instant::now()) {
                Decision::After(pause) => tokio::time::sleep(pause).await,
                Decision::Reload if request.reload() => {}
                // A kept connection that died while idle (a server restart): it may have been
                // sent, but an acquire by the same token takes its own keys again, release and
                // extend are idempotent. Or a replica refused it before running it: the link's
                // connection (and the spare ones) reach it too.
                Decision::Reconnect => {
                    if failed.reply() == Some(Reply::ReadOnly) {
                        link.forget_current();
                    }
                    (fresh, ends) = (true, None);
                    continue;
                }
                _ => {
                    let reached = failed.reached.after(sent, false);
                    return Err(link.gave_up(Failed { reached, ..failed }, None));
                }
            }
            held = Some((conn, generation));
        }
    }

    /// A connection for a replicated write, the failover count when it was checked out, and
    /// whether it was kept (it may have died while idle): a spare one unless `fresh`.
    async fn checkout(
        &self,
        link: &Link,
        op: &'static str,
        fresh: bool,
    ) -> Result<(MultiplexedConnection, u64, bool), LockError> {
        let (spare, generation) = {
            let mut spare = lock(&self.spare);
            let idle = if fresh { None } else { spare.idle.pop() };
            (idle, spare.generation)
        };
        match spare {
            Some(conn) => Ok((conn, generation, true)),
            None => Ok((link.dial.dial(op).await?, generation, false)),
        }
    }

    /// Keeps `conn` for the next replicated write, unless a failover came since its checkout.
    fn keep(&self, conn: MultiplexedConnection, generation: u64) {
        let mut spare = lock(&self.spare);
        if spare.idle.len() < MAX_SPARE && spare.generation == generation {
            spare.idle.push(conn);
        }
    }

    /// One try: `request` and its `WAIT` in one pipeline on `conn` (over its hop), within the
    /// attempt's bounds (see [`bounds`]); its answer, and how long it waited for the replicas.
    async fn try_on(
        &self,
        conn: &MultiplexedConnection,
        call: &ScriptCall,
        request: &Request<'_>,
        finish: Option<Instant>,
        response_timeout: Duration,
    ) -> (Result<(Value, Value), Failed>, Duration) {
        let (op, replicas, hop) = (call.op, self.replicas, request.hop);
        let (waited, after) = bounds(replicas.timeout, response_timeout, finish, Instant::now());
        // `ping`'s check waits for no replica: it shows that `WAIT` is taken.
        let (count, wait_ms) = match call.confirm {
            Confirm::Shown => (0, 0),
            _ => (replicas.count, millis(waited)),
        };
        let mut pipe = hop.pipe();
        pipe.add_command(request.cmd.clone().into_owned())
            .cmd("WAIT")
            .arg(count)
            .arg(wait_ms);
        let mut conn = conn.clone();
        conn.set_response_timeout(after);
        let sent = conn.send_packed_commands(&pipe, 0, 2 + usize::from(hop == Hop::Asking));
        let answer = match tokio::time::timeout(after, sent).await {
            // Each reply on its own: a script's error (MOVED, NOSCRIPT, WRONGTYPE, ...) as the
            // server error it is, not a pipeline's.
            Ok(Ok(values)) => replicated_answer(op, values, hop, after),
            Ok(Err(source)) => Err(failed(op, source, after)),
            Err(_) => Err(Failed::maybe(LockError::RedisTimeout { op, after })),
        };
        (answer, waited)
    }
}

/// The undo of an acquire the replicas did not confirm, on the link's own connection, within
/// the attempt's bound too: an undo cut short is released by token in the background (see
/// `acquire/mod.rs`, "In doubt").
async fn undo_within(
    link: &Link,
    undo: ScriptCall,
    hop: Hop,
    finish: Option<Instant>,
) -> Result<Value, Failed> {
    let undo = link.send(Request::script(&undo, hop));
    let Some(finish) = finish else {
        return undo.await;
    };
    let (op, after) = ("release", link.timeouts().response);
    let timed_out = |_| Err(Failed::maybe(LockError::RedisTimeout { op, after }));
    tokio::time::timeout_at(finish, undo)
        .await
        .unwrap_or_else(timed_out)
}

/// How long a try sent at `now` waits for the replicas (`WAIT`'s timeout), and how long its
/// whole pipeline may take. A write that must end by `finish` (an attempt of a wait, see
/// `Replicated::run`) waits at most until half a response timeout before it (at least 1 ms:
/// `WAIT 0` would block for good) and its pipeline ends by `finish` (leaving the script and the
/// answer at least half a response timeout); any other waits the whole replica timeout, its
/// pipeline a response timeout more.
fn bounds(
    replica_timeout: Duration,
    response_timeout: Duration,
    finish: Option<Instant>,
    now: Instant,
) -> (Duration, Duration) {
    let Some(finish) = finish else {
        return (replica_timeout, response_timeout + replica_timeout);
    };
    let left = finish.saturating_duration_since(now);
    let half = response_timeout / 2;
    // Whole milliseconds, as `WAIT` takes them.
    let wait = replica_timeout.min(left.saturating_sub(half));
    let wait = Duration::from_millis(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1));
    let after = (response_timeout + wait).min(left).max(wait + half);
    (wait, after)
}

/// The replies to `[ASKING,] script, WAIT` as `(answer, replicas)`, or the first error among
/// `ASKING`'s and the script's.
fn replicated_answer(
    op: &'static str,
    values: Vec<Value>,
    hop: Hop,
    after: Duration,
) -> Result<(Value, Value), Failed> {
    let mut values = hop.answers(values).map_err(|e| failed(op, e, after))?;
    let (Some(answer), Some(acked)) = (values.next(), values.next()) else {
        // A write and `WAIT` answered with something else than a reply to each.
        let what = "unexpected answer to a write and WAIT";
        let source = redis::RedisError::from((redis::ErrorKind::Parse, what));
        let (error, reached) = (LockError::Redis { op, source }, Reached::Answered);
        return Err(Failed { error, reached });
    };
    let answer = answer.extract_error().map_err(|e| failed(op, e, after))?;
    Ok((answer, acked))
}

/// With `min_replicas`: the `answer` of `call` sent in one pipeline with `WAIT`, and `WAIT`'s
/// reply (`acked`: how many replicas acknowledged, after `replicas.timeout` at most). When
/// fewer replicas than required did, or the server refused `WAIT`, an acquire is undone at once
/// (by `run`, its release) and the call fails with [`LockError::Replication`] (with a
/// `Misconfigured` error naming `WAIT` when it was refused); it counts as having written (so
/// the acquire also releases by token, in the background, whatever the undo could not). An
/// acquire that found a key held took nothing: its answer stands, with what the replicas
/// confirmed after it when too few did ([`Unconfirmed`]: a wait that ends on it says so).
async fn confirmed<F, Fut>(
    call: &ScriptCall,
    (answer, acked): (Value, Value),
    replicas: Replicas,
    run: F,
) -> Result<Value, Failed>
where
    F: FnOnce(ScriptCall) -> Fut,
    Fut: Future<Output = Result<Value, Failed>>,
{
    let acked = match acked.extract_error() {
        Ok(Value::Int(n)) => Ok(usize::try_from(n).unwrap_or(0)),
        Ok(_) => Ok(0),
        Err(refusal) => Err(wait_refused(call.op, refusal)),
    };
    let needed = match call.confirm {
        Confirm::Shown => 0,
        _ => replicas.count,
    };
    let error = match acked {
        Ok(acked) if acked >= needed => return Ok(answer),
        Ok(acked) => LockError::Replication {
            op: call.op,
            acked,
            needed,
            within: replicas.timeout,
        },
        Err(refused) => refused,
    };
    let Confirm::Acquire(taking) = &call.confirm else {
        let reached = Reached::Answered;
        return Err(Failed { error, reached });
    };
    // The acquire script answers a fencing token when it took the keys, an array when they
    // are held (see `scripts/acquire.lua`).
    if !matches!(answer, Value::Int(_) | Value::BulkString(_)) {
        // Held by another owner: nothing was taken, and the answer stands.
        return Ok(match error {
            LockError::Replication {
                acked,
                needed,
                within,
                ..
            } => Unconfirmed {
                acked,
                needed,
                within,
            }
            .appended_to(answer),
            _ => answer,
        });
    }
    let reached = match run(taking.undo()).await {
        // Undone: nothing of it is left.
        Ok(_) => Reached::Refused,
        Err(_) => Reached::Answered,
    };
    Err(Failed { error, reached })
}

/// What the server's refusal of `WAIT` (`NOPERM` for an ACL user without `+wait`, `ERR unknown
/// command` from a service that does not offer it) means for `min_replicas`: a
/// misconfiguration, never an outage to wait out, that says what to configure instead.
fn wait_refused(op: &'static str, refusal: redis::RedisError) -> LockError {
    let problem = match LockError::from_redis(op, refusal.clone()) {
        LockError::Misconfigured { problem, .. } => problem,
        _ => Misconfiguration::Unsupported,
    };
    LockError::Misconfigured {
        op,
        problem,
        detail: crate::refusal::refused_own_command("WAIT", problem),
        source: refusal,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use redis::FromRedisValue;

    use super::*;
    use crate::keys::LockKeys;
    use crate::scripts::{Announce, Waiting};

    const REPLICAS: Replicas = Replicas {
        count: 1,
        timeout: Duration::from_millis(500),
    };

    /// An acquire of one key, as the request builds it.
    fn acquire() -> ScriptCall {
        let taking = crate::call::Taking {
            keys: vec![LockKeys::new("distlock:", "k")].into(),
            indices: vec![0],
            token: Arc::from("0a1b"),
            ttl: Duration::from_secs(30),
            publish: "PUBLISH",
            announce: Announce::WaitedOn,
        };
        Arc::new(taking).call(None, Waiting::NotYet)
    }

    /// The check `ping` runs, which waits for no replica.
    fn check() -> ScriptCall {
        ScriptCall::new("ping", &crate::diagnose::CHECK, Confirm::Shown, 0)
    }

    /// A server's error reply, as it is read off the wire.
    fn refusal(reply: &str) -> Value {
        redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()).unwrap()
    }

    /// Runs `confirmed` on `[answer, acked]`, counting the undos it runs.
    async fn confirm(
        call: &ScriptCall,
        answer: Value,
        acked: Value,
    ) -> (Result<Value, Failed>, usize) {
        let undos = AtomicUsize::new(0);
        let confirmed = confirmed(call, (answer, acked), REPLICAS, |undo| {
            assert_eq!(undo.op, "release");
            undos.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok(Value::Int(1)))
        })
        .await;
        (confirmed, undos.into_inner())
    }

    #[test]
    fn an_attempt_of_a_wait_waits_for_replicas_within_its_deadline() {
        let (replica, response) = (Duration::from_secs(3), Duration::from_millis(500));
        let now = Instant::now();
        let ms = Duration::from_millis;
        // No wait to end by (a try-lock, a renewal): the whole replica timeout.
        assert_eq!(
            bounds(replica, response, None, now),
            (replica, response + replica)
        );
        // Far from the deadline: the same.
        let far = now + ms(10_000) + response;
        assert_eq!(
            bounds(replica, response, Some(far), now),
            (replica, response + replica)
        );
        // 1 s before it: WAIT ends half a response timeout past it, the pipeline by a whole.
        let near = now + ms(1000) + response;
        assert_eq!(
            bounds(replica, response, Some(near), now),
            (ms(1250), ms(1500))
        );
        // Sent at the deadline: half a response timeout for the replicas, one in all.
        let at = now + response;
        assert_eq!(bounds(replica, response, Some(at), now), (ms(250), ms(500)));
        // A second try past its bound (after NOSCRIPT): 1 ms, never `WAIT 0` (for good).
        assert_eq!(
            bounds(replica, response, Some(now), now + ms(5)),
            (ms(1), ms(251))
        );
        // A replica timeout shorter than what is left stays as set.
        let short = ms(100);
        assert_eq!(bounds(short, response, Some(at), now), (short, response));
    }

    #[tokio::test]
    async fn a_refused_wait_undoes_the_acquire_and_is_a_misconfiguration_naming_wait() {
        for (reply, problem, said) in [
            (
                "NOPERM User app has no permissions to run the 'wait' command",
                Misconfiguration::Permissions,
                "ACL SETUSER <user> +wait",
            ),
            (
                "ERR unknown command 'WAIT', with args beginning with: '1' '500' ",
                Misconfiguration::Unsupported,
                "does not offer WAIT",
            ),
        ] {
            let (confirmed, undos) = confirm(&acquire(), Value::Int(42), refusal(reply)).await;
            let failed = confirmed.unwrap_err();
            assert_eq!(undos, 1, "the acquire took the key: undone");
            assert_eq!(failed.reached, Reached::Refused, "undone: nothing left");
            match &failed.error {
                LockError::Misconfigured {
                    problem: p, detail, ..
                } => {
                    assert_eq!(*p, problem);
                    assert!(detail.contains(said), "{detail}");
                    assert!(detail.contains("without min_replicas"), "{detail}");
                }
                other => panic!("{other:?}"),
            }
        }
        // Held by another owner: nothing taken, nothing undone, the answer stands.
        let held = Value::Array(vec![Value::Int(1)]);
        let (confirmed, undos) = confirm(
            &acquire(),
            held.clone(),
            refusal("ERR unknown command 'WAIT'"),
        )
        .await;
        assert_eq!((confirmed.unwrap(), undos), (held, 0));
    }

    #[tokio::test]
    async fn too_few_replicas_undo_an_acquire_and_the_check_needs_none() {
        let (confirmed, undos) = confirm(&acquire(), Value::Int(42), Value::Int(0)).await;
        let failed = confirmed.unwrap_err();
        assert!(
            matches!(
                failed.error,
                LockError::Replication {
                    acked: 0,
                    needed: 1,
                    ..
                }
            ),
            "{failed:?}"
        );
        assert_eq!(undos, 1);
        // Held by another owner: nothing to undo, and the answer says the replicas did not
        // confirm (a wait that ends on it fails with `Replication`, not as contention).
        let held = Value::Array(vec![Value::Int(0), Value::Int(1), Value::Int(800)]);
        let (confirmed, undos) = confirm(&acquire(), held.clone(), Value::Int(0)).await;
        let answer = confirmed.unwrap();
        assert_eq!(undos, 0);
        let unconfirmed = Unconfirmed {
            acked: 0,
            needed: 1,
            within: REPLICAS.timeout,
        };
        assert!(
            matches!(
                crate::scripts::Acquire::from_redis_value(answer),
                Ok(crate::scripts::Acquire::Held { unconfirmed: Some(u), .. }) if u == unconfirmed
            ),
            "the replicas' shortfall is in the answer"
        );
        let (confirmed, _) = confirm(&acquire(), held.clone(), Value::Int(1)).await;
        assert_eq!(confirmed.unwrap(), held, "confirmed: the answer as it was");
        let (confirmed, _) = confirm(&acquire(), Value::Int(42), Value::Int(1)).await;
        assert_eq!(confirmed.unwrap(), Value::Int(42));
        // `ping`'s check waits for no replica, but a refused WAIT is still a refusal.
        let (confirmed, undos) = confirm(&check(), Value::Nil, Value::Int(0)).await;
        assert_eq!((confirmed.unwrap(), undos), (Value::Nil, 0));
        let (confirmed, undos) =
            confirm(&check(), Value::Nil, refusal("ERR unknown command 'WAIT'")).await;
        assert!(confirmed.unwrap_err().error.is_misconfigured());
        assert_eq!(undos, 0);
    }
}
