//! Redlock: a lock held on a majority of independent primaries.
//!
//! Every call runs on all nodes at once, each bounded by its own timeout (for an acquire a
//! tenth of the ttl, at most the response timeout, so a node that hangs cannot stall the round),
//! and the answers are combined by the call's [`Kind`]:
//! - **Acquire** counts when a majority (`n/2 + 1`) granted it. The lease's validity is
//!   counted by the request layer as everywhere: ttl less the time since before the round was
//!   sent, less the drift margin (1% of the ttl + 2 ms). Each node is proposed a token slightly
//!   ahead of this host's clock, which nodes with close clocks all draw; the round ends as soon
//!   as a majority granted the same one (a majority then holds it in its counters). Otherwise
//!   the token is the greatest any node drew, written back to the counters of a majority before
//!   it is handed out. Either way any later majority, which meets that one, draws above it. When
//!   too many nodes failed (down, erroring, timed out) for a majority to be left, the round
//!   stops waiting at once, takes back what was granted, and fails with [`LockError::NoQuorum`];
//!   when nodes said the key is held, it answers who holds it, so the caller waits. A node
//!   whose acquire may still run (hung) is sent the release later, twice.
//! - Every node's request runs in a task of its own, so a round that ends early never drops a
//!   request before it was written (which would leave a grant, or a lock not released, behind).
//! - **Extend** counts per lease when a majority extended it; without one the lease is lost.
//! - **Release** runs everywhere, and counts when a majority answered.
//! - **Read** and **Raise** count when a majority answered.
//! - Fair requests are refused: a hand-off is made by one release script on one server, and a
//!   quorum's nodes would each hand the lock to their own oldest waiter.
//!
//! Release notifications come from whichever node the subscriber connection reached (each
//! node announces every release); when that node is down, the next is tried.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::{FromRedisValue, Value};

use super::standalone::{PlainSubscriber, PoolDial};
use super::{Link, Timeouts};
use super::{Route, Subscribe};
use crate::call::{BoxFuture, Kind, ScriptCall, Taking};
use crate::error::LockError;
use crate::failed::{Failed, Reached};
use crate::fence::raise_call;
use crate::scripts::{Acquire, Announce};
use crate::tls::Tls;

/// Connections per node pool (the link takes one for good; the rest serve nobody else).
const POOL_SIZE: usize = 2;

/// A quorum of independent Redis primaries.
pub(crate) struct Quorum {
    nodes: Vec<Arc<Link>>,
    clients: Vec<redis::Client>,
    timeouts: Timeouts,
    endpoint: String,
    /// Each node's URL, without its password.
    names: Vec<String>,
}

/// One node's answer, or how it failed.
type Answer = Result<Value, Failed>;

impl Quorum {
    pub(crate) fn new(urls: &[String], tls: &Tls, timeouts: Timeouts) -> Result<Self, LockError> {
        if urls.len() < 3 {
            return Err(LockError::InvalidConfig {
                what: "quorum",
                reason: format!(
                    "{} node(s) given; a quorum needs at least 3 independent primaries (an odd \
                     number: 3, 5, 7), or use .url(..) for one server",
                    urls.len()
                ),
            });
        }
        let mut nodes = Vec::with_capacity(urls.len());
        let mut clients = Vec::with_capacity(urls.len());
        let mut shown = Vec::with_capacity(urls.len());
        for url in urls {
            let (info, endpoint) = super::parse_url(url, tls)?;
            clients.push(super::client(info.clone())?);
            let pool = super::create_pool(info, POOL_SIZE, timeouts)?;
            let dial = PoolDial { pool, timeouts };
            nodes.push(Arc::new(Link::new(Box::new(dial), timeouts, true, None)));
            shown.push(endpoint);
        }
        Ok(Self {
            nodes,
            clients,
            timeouts,
            endpoint: format!("quorum [{}]", shown.join(", ")),
            names: shown,
        })
    }

    fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// How long one node may take: for an acquire a tenth of the ttl (at least 5 ms), never more
    /// than the response timeout.
    fn node_timeout(&self, call: &ScriptCall) -> Duration {
        match &call.kind {
            Kind::Acquire(taking) => (taking.ttl / 10)
                .max(Duration::from_millis(5))
                .min(self.timeouts.response),
            _ => self.timeouts.response,
        }
    }

    /// Runs `call` on every node at once, each within `limit`; `enough` looks at the answers so
    /// far (in node order, `None` for one still out) and says whether to stop waiting.
    async fn fan_out(
        &self,
        call: &ScriptCall,
        limit: Duration,
        enough: impl Fn(&[Option<Answer>]) -> bool,
    ) -> Vec<Option<Answer>> {
        let all = vec![true; self.nodes.len()];
        self.fan_out_on(Arc::new(call.detached()), limit, &all, enough)
            .await
    }

    /// [`fan_out`](Self::fan_out) on the nodes `to` marks.
    async fn fan_out_on(
        &self,
        call: Arc<ScriptCall>,
        limit: Duration,
        to: &[bool],
        enough: impl Fn(&[Option<Answer>]) -> bool,
    ) -> Vec<Option<Answer>> {
        let op = call.op;
        // Each node's request runs in a task of its own, so a round that ends early (enough
        // answers) leaves the others to finish: a request dropped before it was written would
        // never reach its node, and a release or a grant would be left behind there.
        let owned = call;
        let mut answers: Vec<Option<Answer>> = self.nodes.iter().map(|_| None).collect();
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| to.get(*i).copied().unwrap_or(false))
            .map(|(i, node)| {
                let (node, call) = (Arc::clone(node), Arc::clone(&owned));
                let task = tokio::spawn(async move {
                    match tokio::time::timeout(limit, node.run(&call)).await {
                        Ok(answer) => answer,
                        Err(_) => Err(Failed {
                            error: LockError::RedisTimeout { op, after: limit },
                            reached: Reached::Maybe,
                        }),
                    }
                });
                async move {
                    let answer = task.await.unwrap_or_else(|_| {
                        Err(Failed {
                            error: LockError::RedisTimeout { op, after: limit },
                            reached: Reached::Maybe,
                        })
                    });
                    (i, answer)
                }
            })
            .collect();
        while let Some((i, answer)) = pending.next().await {
            answers[i] = Some(answer);
            if enough(&answers) {
                break;
            }
        }
        answers
    }

    async fn run_call(&self, call: &ScriptCall) -> Result<Value, Failed> {
        match &call.kind {
            Kind::Acquire(taking) => self.acquire(call, taking).await,
            Kind::Extend => self.extend(call).await,
            Kind::Release | Kind::ForceRelease | Kind::Read | Kind::Raise => {
                // Done once a majority answered: the others were sent, and run anyway (in
                // tasks of their own). A forced release waits for every node: an operator's
                // command, often from a process that exits right after, which would end those
                // tasks and leave the lock on the nodes that answered last.
                let majority = self.majority();
                let everywhere = matches!(call.kind, Kind::ForceRelease);
                let answers = self
                    .fan_out(call, self.node_timeout(call), |answers| {
                        !everywhere
                            && answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count()
                                >= majority
                    })
                    .await;
                self.majority_answered(call.op, answers, |values| match call.kind {
                    // The most keys any node released.
                    Kind::Release | Kind::ForceRelease => values
                        .iter()
                        .filter_map(|v| i64::from_redis_value(v.clone()).ok())
                        .max()
                        .map_or(Value::Int(0), Value::Int),
                    _ => values.first().cloned().unwrap_or(Value::Nil),
                })
            }
            Kind::Fair => Err(Failed {
                error: LockError::InvalidConfig {
                    what: "fair",
                    reason: FAIR_REFUSED.to_owned(),
                },
                reached: Reached::No,
            }),
        }
    }

    /// Succeeds with `combine` of the answers when a majority of nodes answered.
    fn majority_answered(
        &self,
        op: &'static str,
        answers: Vec<Option<Answer>>,
        combine: impl FnOnce(&[Value]) -> Value,
    ) -> Result<Value, Failed> {
        let mut values = Vec::new();
        let mut failures = Vec::new();
        for answer in answers.into_iter().flatten() {
            match answer {
                Ok(value) => values.push(value),
                Err(failed) => failures.push(failed),
            }
        }
        if values.len() >= self.majority() {
            return Ok(combine(&values));
        }
        Err(self.no_quorum(op, values.len(), failures))
    }

    /// Why no majority was had. When the nodes that refused (settings Redis rejects, a key of
    /// another type) are enough to deny a majority, the refusal itself: no outage is to blame,
    /// and retrying will not help. Else [`LockError::NoQuorum`], naming a refusal first.
    fn no_quorum(&self, op: &'static str, granted: usize, mut failures: Vec<Failed>) -> Failed {
        let reached = if failures.iter().any(|f| f.reached != Reached::No) {
            Reached::Maybe
        } else {
            Reached::No
        };
        let refusals = failures
            .iter()
            .filter(|f| f.error.is_misconfigured())
            .count();
        failures.sort_by_key(|f| !f.error.is_misconfigured());
        let first = failures.into_iter().next().map(|f| f.error);
        match first {
            Some(refusal) if refusals > self.nodes.len() - self.majority() => Failed {
                error: refusal,
                reached,
            },
            first => Failed {
                error: LockError::NoQuorum {
                    op,
                    granted,
                    needed: self.majority(),
                    nodes: self.nodes.len(),
                    first_failure: first.map(Box::new),
                },
                reached,
            },
        }
    }

    async fn acquire(&self, call: &ScriptCall, taking: &Taking) -> Result<Value, Failed> {
        let majority = self.majority();
        let nodes = self.nodes.len();
        let granted = |answer: &Option<Answer>| token(answer).is_some();
        // Proposed to every node as the least token to draw: slightly ahead of this host's
        // clock, so nodes whose clocks differ by less than that all draw it, and a majority
        // holds it in its counters without a write-back round.
        let floor = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros(),
        )
        .unwrap_or(0)
            + FLOOR_AHEAD_US;
        let proposed = Arc::new(call.with_arg(floor));
        // Every node within its bound: a hung node costs the round a tenth of the ttl at most.
        // The round ends as soon as a majority granted the same token (the others' answers,
        // grants included, are released with the lease).
        let all = vec![true; nodes];
        let answers = self
            .fan_out_on(proposed, self.node_timeout(call), &all, |answers| {
                let mut tokens = answers.iter().filter_map(token);
                let first = tokens.next();
                let agreeing = first.map_or(0, |t| 1 + tokens.filter(|&u| u == t).count());
                // Nodes that failed (down, erroring, timed out) can no longer grant: once too
                // many did, no majority is left to wait for. (A node that says the key is held
                // is waited for: contention is answered with who holds it, not an error.)
                let failed = answers.iter().filter(|a| matches!(a, Some(Err(_)))).count();
                agreeing >= majority || failed > nodes - majority
            })
            .await;
        let mut tokens = Vec::new();
        let mut held: Option<Acquire> = None;
        let mut failures = Vec::new();
        // Nodes that took the lock, and nodes that may yet (no answer, or one that may still
        // arrive and run).
        let took: Vec<bool> = answers.iter().map(granted).collect();
        let in_doubt: Vec<bool> = answers
            .iter()
            .map(|answer| match answer {
                None => true,
                Some(Err(failed)) => !matches!(failed.reached, Reached::No | Reached::Refused),
                Some(Ok(_)) => false,
            })
            .collect();
        for answer in answers.into_iter().flatten() {
            match answer.map(Acquire::from_redis_value) {
                Ok(Ok(Acquire::Acquired { fencing_token })) => tokens.push(fencing_token),
                Ok(Ok(Acquire::Held {
                    first_held,
                    remaining,
                })) => {
                    let longest = match held {
                        Some(Acquire::Held { remaining: r, .. }) => r.max(remaining),
                        _ => remaining,
                    };
                    held = Some(Acquire::Held {
                        first_held,
                        remaining: longest,
                    });
                }
                Ok(Err(parse)) => failures.push(Failed {
                    error: LockError::Redis {
                        op: call.op,
                        source: parse.into(),
                    },
                    reached: Reached::Answered,
                }),
                Err(failed) => failures.push(failed),
            }
        }
        if tokens.len() >= majority {
            let token = tokens.iter().copied().max().unwrap_or(0);
            let uniform = tokens.iter().all(|&t| t == token);
            // A majority already holds the token in its counters when every grant drew it.
            if uniform || self.raise(taking, token).await {
                return Ok(Value::Int(i64::try_from(token).unwrap_or(i64::MAX)));
            }
            failures.push(Failed {
                error: LockError::NoQuorum {
                    op: "acquire (fencing write-back)",
                    granted: 0,
                    needed: majority,
                    nodes,
                    first_failure: None,
                },
                reached: Reached::Answered,
            });
        }
        // No majority: take back what was granted now, on the nodes that answered (within the
        // same per-node bound). A node that may still run the acquire (hung, or its answer
        // lost) is released in the background, after a response timeout and once more after
        // another: waiting for it here would stall the round.
        let undo = Arc::new(taking.undo().detached());
        let limit = self.node_timeout(call);
        let undone = self
            .fan_out_on(Arc::clone(&undo), limit, &took, |_| false)
            .await;
        let took_undone = undone
            .iter()
            .zip(&took)
            .all(|(answer, took)| !took || matches!(answer, Some(Ok(_))));
        if in_doubt.iter().any(|&doubt| doubt) {
            self.release_later(&undo, &in_doubt);
        }
        match held {
            // Contention: who holds the key, so the caller waits for it.
            Some(held) if took_undone => Ok(encode(held)),
            _ => {
                let mut failed = self.no_quorum(call.op, tokens.len(), failures);
                if !took_undone {
                    // A grant the undo did not reach: the acquire releases by token in the
                    // background too, until the ttl if Redis fails.
                    failed.reached = Reached::Maybe;
                }
                Err(failed)
            }
        }
    }

    /// Sends `undo` to the nodes `to` marks after a response timeout, and once more after
    /// another, from a task of its own: for nodes whose acquire may still run (hung, or its
    /// answer lost), so a grant they make late does not stay until its ttl.
    fn release_later(&self, undo: &Arc<ScriptCall>, to: &[bool]) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let nodes: Vec<Arc<Link>> = self
            .nodes
            .iter()
            .zip(to)
            .filter(|(_, &to)| to)
            .map(|(node, _)| Arc::clone(node))
            .collect();
        let undo = Arc::clone(undo);
        let pause = self.timeouts.response;
        runtime.spawn(async move {
            for _ in 0..2 {
                tokio::time::sleep(pause).await;
                for node in &nodes {
                    let _ = tokio::time::timeout(pause, node.run(&undo)).await;
                }
            }
        });
    }

    /// Writes `token` back to the fencing counters of the keys `taking` takes, on every node;
    /// whether a majority took it.
    async fn raise(&self, taking: &Taking, token: u64) -> bool {
        let raise = raise_call(taking, token);
        let answers = self
            .fan_out(&raise, self.timeouts.response, |_| false)
            .await;
        answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count() >= self.majority()
    }

    async fn extend(&self, call: &ScriptCall) -> Result<Value, Failed> {
        let answers = self.fan_out(call, self.node_timeout(call), |_| false).await;
        let mut votes: Vec<usize> = Vec::new();
        for answer in answers.iter().flatten() {
            let Ok(value) = answer else { continue };
            let Ok(owned) = Vec::<i64>::from_redis_value(value.clone()) else {
                continue;
            };
            if votes.len() < owned.len() {
                votes.resize(owned.len(), 0);
            }
            for (vote, owned) in votes.iter_mut().zip(owned) {
                *vote += usize::from(owned == 1);
            }
        }
        if votes.is_empty() {
            // No node answered: an outage, which renewal retries until the lease runs out.
            let failures = answers
                .into_iter()
                .flatten()
                .filter_map(Result::err)
                .collect();
            return Err(self.no_quorum(call.op, 0, failures));
        }
        let majority = self.majority();
        Ok(Value::Array(
            votes
                .into_iter()
                .map(|v| Value::Int(i64::from(v >= majority)))
                .collect(),
        ))
    }
}

/// How far ahead of this host's clock (µs) a quorum proposes fencing tokens: more than the
/// round trip to a node plus the clock offsets between hosts, so every node draws the proposal.
const FLOOR_AHEAD_US: u64 = 50_000;

/// The fencing token a node's answer grants, if it granted.
fn token(answer: &Option<Answer>) -> Option<u64> {
    match answer {
        Some(Ok(value)) => match Acquire::from_redis_value(value.clone()) {
            Ok(Acquire::Acquired { fencing_token }) => Some(fencing_token),
            _ => None,
        },
        _ => None,
    }
}

/// The acquire script's answer for `held`.
fn encode(held: Acquire) -> Value {
    match held {
        Acquire::Acquired { fencing_token } => {
            Value::Int(i64::try_from(fencing_token).unwrap_or(i64::MAX))
        }
        Acquire::Held {
            first_held,
            remaining,
        } => Value::Array(vec![
            Value::Int(0),
            Value::Int(i64::try_from(first_held).unwrap_or(0) + 1),
            Value::Int(remaining.map_or(-1, |r| i64::try_from(r.as_millis()).unwrap_or(i64::MAX))),
        ]),
    }
}

const FAIR_REFUSED: &str = "fair requests are not available on a quorum: a hand-off is made by \
    one release script on one server, and a quorum's nodes would each hand the lock to their own \
    oldest waiter; use unfair requests (waiters are still woken by release notifications)";

impl Route for Quorum {
    fn run<'a>(&'a self, call: &'a ScriptCall) -> BoxFuture<'a, Result<Value, Failed>> {
        Box::pin(self.run_call(call))
    }

    fn announces(&self) -> Announce {
        Announce::Always
    }

    fn subscriber(&self) -> Option<Arc<dyn Subscribe>> {
        Some(Arc::new(PlainSubscriber {
            clients: self.clients.clone(),
            next: AtomicUsize::new(0),
        }))
    }

    fn scan<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, Result<Vec<String>, LockError>> {
        Box::pin(async move {
            // A key any node holds: the operator wants to see stragglers too.
            let mut found = Vec::new();
            let mut answered = 0;
            let mut last_error = None;
            for node in &self.nodes {
                match node.scan(pattern).await {
                    Ok(keys) => {
                        answered += 1;
                        found.extend(keys);
                    }
                    Err(error) => last_error = Some(error),
                }
            }
            match last_error {
                Some(error) if answered < self.majority() => Err(error),
                _ => Ok(found),
            }
        })
    }

    fn response_timeout(&self) -> Duration {
        self.timeouts.response
    }

    fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    fn refuses_fair(&self) -> Option<&'static str> {
        Some(FAIR_REFUSED)
    }

    fn run_on_every_server<'a>(
        &'a self,
        call: &'a ScriptCall,
    ) -> BoxFuture<'a, Vec<(String, Result<Value, Failed>)>> {
        Box::pin(async move {
            let answers = self.fan_out(call, self.timeouts.response, |_| false).await;
            self.names
                .iter()
                .cloned()
                .zip(answers)
                .map(|(name, answer)| {
                    let answer = answer.unwrap_or_else(|| {
                        Err(Failed {
                            error: LockError::RedisTimeout {
                                op: call.op,
                                after: self.timeouts.response,
                            },
                            reached: Reached::Maybe,
                        })
                    });
                    (name, answer)
                })
                .collect()
        })
    }

    fn servers_needed(&self, _servers: usize) -> usize {
        self.majority()
    }

    fn commands(&self) -> Vec<String> {
        vec!["SELECT 0".to_owned()]
    }
}
