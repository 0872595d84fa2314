//! Redlock: a lock held on a majority of independent primaries.
//!
//! Every call runs on all nodes at once, each bounded by the response timeout, and the answers
//! are combined by the call's [`Kind`]:
//! - **Acquire** is taken node by node by `acquire/places.rs` ([`Grant::Majority`]), through
//!   [`Route::fan_out`], each node within [`Route::acquire_timeout`] (a tenth of the ttl, at
//!   most the response timeout, so a node that hangs cannot stall the round).
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
use super::{Answer, Enough, Grant, Route, Subscribe};
use super::{Link, Timeouts};
use crate::call::{BoxFuture, Kind, ScriptCall};
use crate::error::LockError;
use crate::failed::{Failed, Reached};
use crate::inspect::{listed_holders, quorum_view};
use crate::scripts::Announce;
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
            let dial = PoolDial {
                pool,
                timeouts,
                server: endpoint.clone(),
            };
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
            // An acquire is taken on a majority of the nodes by `acquire/places.rs`, through
            // `fan_out`: never as one call.
            Kind::Acquire(_) => Err(Failed {
                error: LockError::InvalidConfig {
                    what: "quorum",
                    reason: "an acquire runs on a quorum's nodes one by one".to_owned(),
                },
                reached: Reached::No,
            }),
            Kind::Extend => self.extend(call).await,
            Kind::Inspect => self.inspect(call).await,
            Kind::Release | Kind::ForceRelease | Kind::Read | Kind::Check | Kind::Raise => {
                // Done once a majority answered: the others were sent, and run anyway (in
                // tasks of their own). A forced release waits for every node: an operator's
                // command, often from a process that exits right after, which would end those
                // tasks and leave the lock on the nodes that answered last.
                let majority = self.majority();
                let everywhere = matches!(call.kind, Kind::ForceRelease);
                let answers = self
                    .fan_out(call, self.timeouts.response, |answers| {
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
        Err(no_quorum(op, values.len(), failures, self.nodes.len()))
    }

    /// Reads a lock as a majority of nodes hold it ([`quorum_view`]), once the answers settle
    /// it ([`settled`]): a read just after an acquire or a release, whose requests may still be
    /// on their way to some nodes, reports neither what the first node to answer says nor a
    /// holder a majority may not have.
    async fn inspect(&self, call: &ScriptCall) -> Result<Value, Failed> {
        let majority = self.majority();
        let answers = self
            .fan_out(call, self.timeouts.response, |answers| {
                settled(answers, majority)
            })
            .await;
        self.majority_answered(call.op, answers, |values| quorum_view(values, majority))
    }

    async fn extend(&self, call: &ScriptCall) -> Result<Value, Failed> {
        let answers = self.fan_out(call, self.timeouts.response, |_| false).await;
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
            return Err(no_quorum(call.op, 0, failures, self.nodes.len()));
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

/// Whether the inspect answers so far (in node order, `None` for one still out) settle which
/// holders a `majority` of nodes list: a majority answered, and each holder listed is listed by
/// a majority or can no longer be (the nodes still out are too few); or a majority can no
/// longer answer.
fn settled(answers: &[Option<Answer>], majority: usize) -> bool {
    let out = answers.iter().filter(|a| a.is_none()).count();
    let values: Vec<&Value> = answers
        .iter()
        .filter_map(|a| a.as_ref()?.as_ref().ok())
        .collect();
    if values.len() + out < majority {
        return true;
    }
    if values.len() < majority {
        return false;
    }
    let listed: Vec<Vec<String>> = values.into_iter().map(listed_holders).collect();
    listed.iter().flatten().all(|holder| {
        let by = listed.iter().filter(|l| l.contains(holder)).count();
        by >= majority || by + out < majority
    })
}

/// Why no majority was had. When the nodes that refused (settings Redis rejects, a key of
/// another type) are enough to deny a majority, the refusal itself: no outage is to blame,
/// and retrying will not help. Else [`LockError::NoQuorum`], naming a refusal first.
pub(crate) fn no_quorum(
    op: &'static str,
    granted: usize,
    mut failures: Vec<Failed>,
    nodes: usize,
) -> Failed {
    let majority = nodes / 2 + 1;
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
        Some(refusal) if refusals > nodes - majority => Failed {
            error: refusal,
            reached,
        },
        first => Failed {
            error: LockError::NoQuorum {
                op,
                granted,
                needed: majority,
                nodes,
                first_failure: first.map(Box::new),
            },
            reached,
        },
    }
}

const FAIR_REFUSED: &str = "fair requests are not available on a quorum: a hand-off is made by \
    one release script on one server, and a quorum's nodes would each hand the lock to their own \
    oldest waiter; use unfair requests (waiters are still woken by release notifications)";

impl Route for Quorum {
    fn run<'a>(&'a self, call: &'a ScriptCall) -> BoxFuture<'a, Result<Value, Failed>> {
        Box::pin(self.run_call(call))
    }

    fn grant(&self) -> Grant {
        Grant::Majority {
            nodes: self.nodes.len(),
        }
    }

    fn fan_out<'a>(
        &'a self,
        call: Arc<ScriptCall>,
        limit: Duration,
        to: &'a [bool],
        enough: &'a Enough,
    ) -> BoxFuture<'a, Vec<Option<Answer>>> {
        Box::pin(self.fan_out_on(call, limit, to, enough))
    }

    /// A tenth of the ttl (at least 5 ms), never more than the response timeout: a hung node
    /// costs the round that at most.
    fn acquire_timeout(&self, ttl: Duration) -> Duration {
        (ttl / 10)
            .max(Duration::from_millis(5))
            .min(self.timeouts.response)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An inspect answer listing `holders` (none: free).
    fn held_by(holders: &[&str]) -> Option<Answer> {
        if holders.is_empty() {
            return Some(Ok(Value::Nil));
        }
        let mut fields = vec![
            Value::BulkString(b"x".to_vec()),
            Value::Int(1000),
            Value::BulkString(b"7".to_vec()),
            Value::Int(0),
            Value::Int(1),
            Value::Array(Vec::new()),
        ];
        fields.extend(
            holders
                .iter()
                .map(|h| Value::BulkString(h.as_bytes().to_vec())),
        );
        Some(Ok(Value::Array(fields)))
    }

    #[test]
    fn an_inspect_waits_for_the_node_that_decides_whether_a_holder_has_a_majority() {
        // Free on one node, held on another, the third still out: it decides.
        assert!(!settled(&[held_by(&[]), held_by(&["a"]), None], 2));
        assert!(settled(&[held_by(&["a"]), held_by(&["a"]), None], 2));
        assert!(settled(&[held_by(&[]), held_by(&[]), None], 2));
        assert!(settled(
            &[held_by(&[]), held_by(&["a"]), held_by(&["b"])],
            2
        ));
        // A majority can no longer answer: settled (as a failure).
        let failed = || {
            Some(Err(Failed {
                error: LockError::RedisTimeout {
                    op: "inspect",
                    after: Duration::from_millis(1),
                },
                reached: Reached::Maybe,
            }))
        };
        assert!(!settled(&[failed(), held_by(&["a"]), None], 2));
        assert!(settled(&[failed(), held_by(&["a"]), failed()], 2));
    }

    #[test]
    fn a_quorum_view_lists_the_holders_a_majority_lists() {
        let view = |answers: &[Option<Answer>]| {
            let values: Vec<Value> = answers
                .iter()
                .map(|a| a.as_ref().unwrap().as_ref().unwrap().clone())
                .collect();
            quorum_view(&values, 2)
        };
        assert_eq!(
            view(&[held_by(&["a"]), held_by(&[]), held_by(&["b"])]),
            Value::Nil
        );
        assert_eq!(view(&[held_by(&[]), held_by(&[])]), Value::Nil);
        let seen = view(&[held_by(&[]), held_by(&["a"]), held_by(&["a", "b"])]);
        assert_eq!(listed_holders(&seen), ["a"]);
    }
}
