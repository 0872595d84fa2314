//! Redlock: a lock held on a majority of independent primaries. The only file that knows a
//! quorum: every operation runs on all nodes at once, each in a task of its own (a round that
//! ends early never drops a request before it was written, which would leave a grant, or a
//! lock not released, behind), each bounded by the response timeout, and a majority decides:
//! - **Acquire** ([`Quorum::acquire`]): each node is proposed a token slightly ahead of this
//!   host's clock ([`FLOOR_AHEAD_US`]), which nodes with close clocks all draw: the round ends
//!   as soon as a majority granted the same one (a majority then holds it in its counters, no
//!   write-back needed), each node within a tenth of the ttl (at most the response timeout), so
//!   a node that hangs cannot stall the round. When too many nodes failed (down, erroring,
//!   timed out) for a majority to be left, the round stops waiting at once. Without a majority,
//!   what was granted is undone before the answer says who holds the keys. A node whose acquire
//!   may still run (hung, or its answer lost) may grant late: the answer says so
//!   ([`Taken::late`]), and the request never uses that owner token again (a clean-up of the
//!   late grant could otherwise release a lease a later attempt of the same request took there).
//! - **Extend** counts per lease when a majority extended it; without one the lease is lost.
//! - **Release** runs everywhere, and counts when a majority answered (a forced release, when
//!   every node did).
//! - **Inspect** lists the holders a majority of nodes list ([`view`]).
//! - Fair requests are refused ([`FAIR_REFUSED`]), and so is `min_replicas` (a majority is its
//!   redundancy). A semaphore's permits are slots, each acquired as a lock of its own (see
//!   `acquire/places.rs`).
//!
//! Release notifications come from whichever node the subscriber connection reached (each
//! node announces every release); when that node is down, the next is tried.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::{FromRedisValue, Value};

use super::one::{plain_subscriber, PoolDial};
use super::{read, Answer, Deployment, Grant, Link, Timeouts};
use crate::call::{ScriptCall, Taking};
use crate::error::LockError;
use crate::failed::{Failed, Reached};
use crate::fence::raise_call;
use crate::scripts::{Acquire, Inspected, Taken};
use crate::tls::Tls;

/// Connections per node pool (the link takes one for good; the rest serve nobody else).
const POOL_SIZE: usize = 2;

/// How far ahead of this host's clock (µs) a quorum proposes fencing tokens: more than the
/// round trip to a node plus the clock offsets between hosts, so every node draws the proposal.
const FLOOR_AHEAD_US: u64 = 50_000;

/// Why fair requests cannot run on a quorum.
pub(crate) const FAIR_REFUSED: &str = "fair requests are not available on a quorum: a hand-off \
    is made by one release script on one server, and a quorum's nodes would each hand the lock \
    to their own oldest waiter; use unfair requests (waiters are still woken by release \
    notifications)";

/// A quorum of independent Redis primaries.
pub(crate) struct Quorum {
    nodes: Vec<Arc<Link>>,
    timeouts: Timeouts,
    /// Each node's URL, without its password.
    names: Vec<String>,
}

/// A deployment on the independent primaries at `urls`.
pub(crate) fn primaries(
    urls: &[String],
    tls: &Tls,
    timeouts: Timeouts,
) -> Result<Deployment, LockError> {
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
    let mut names = Vec::with_capacity(urls.len());
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
        names.push(endpoint);
    }
    Ok(Deployment {
        endpoint: format!("quorum [{}]", names.join(", ")),
        response_timeout: timeouts.response,
        subscriber: Some(plain_subscriber(clients)),
        commands: vec!["SELECT 0".to_owned()],
        pool: None,
        waits_for_replicas: false,
        grant: Grant::Majority(Quorum {
            nodes,
            timeouts,
            names,
        }),
    })
}

impl Quorum {
    fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Takes `taking`'s keys by `acquire` (its call) on a majority of the nodes, at once (see
    /// the module docs).
    pub(crate) async fn acquire(
        &self,
        taking: &Taking,
        acquire: &ScriptCall,
    ) -> Result<Taken, Failed> {
        let (nodes, majority) = (self.nodes.len(), self.majority());
        // A tenth of the ttl (at least 5 ms), never more than the response timeout: a hung node
        // costs the round that at most.
        let limit = (taking.ttl / 10)
            .max(Duration::from_millis(5))
            .min(self.timeouts.response);
        let answers = self.propose(acquire, limit).await;
        // Nodes that took the lock, and nodes that may yet (no answer, or one that may still
        // arrive and run).
        let took: Vec<bool> = answers.iter().map(|a| granted(a).is_some()).collect();
        let late = answers.iter().any(|answer| match answer {
            None => true,
            Some(Err(failed)) => !matches!(failed.reached, Reached::No | Reached::Refused),
            Some(Ok(_)) => false,
        });
        let (tokens, held, mut failures) = tally(acquire, answers);
        if tokens.len() >= majority {
            let token = tokens.iter().copied().max().unwrap_or(0);
            // A majority already holds the token in its counters when every grant drew it.
            let uniform = tokens.iter().all(|&t| t == token);
            if uniform || self.raise(taking, token).await {
                let answer = Acquire::Acquired {
                    fencing_token: token,
                };
                return Ok(Taken { answer, late });
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
        // No majority: take back what was granted, on the nodes that answered (within the
        // same bound). A node that may still run the acquire is left to the request (`late`).
        let undo = taking.undo().detached();
        let undone = self.fan_out(undo, limit, Some(&took), |_| false).await;
        let took_undone = undone
            .iter()
            .zip(&took)
            .all(|(answer, took)| !took || matches!(answer, Some(Ok(_))));
        match held {
            // Contention: who holds the key, so the caller waits for it.
            Some(answer) if took_undone => Ok(Taken { answer, late }),
            _ => {
                let mut failed = no_quorum(acquire.op, tokens.len(), failures, nodes);
                if !took_undone || late {
                    // A grant the undo did not reach, or one still to come: the acquire
                    // releases by token in the background too, until the ttl if Redis fails.
                    failed.reached = Reached::Maybe;
                }
                self.explained(acquire, Err(failed)).await
            }
        }
    }

    /// Sends `acquire` to every node at once, each within `limit`, proposing a token slightly
    /// ahead of this host's clock; the answers once a majority granted the same token, or too
    /// many failed for a majority to be left. (A node that says the key is held is waited for:
    /// contention is answered with who holds it, not an error.)
    async fn propose(&self, acquire: &ScriptCall, limit: Duration) -> Vec<Option<Answer>> {
        let (nodes, majority) = (self.nodes.len(), self.majority());
        let now = SystemTime::now().duration_since(UNIX_EPOCH);
        let floor =
            u64::try_from(now.unwrap_or_default().as_micros()).unwrap_or(0) + FLOOR_AHEAD_US;
        let enough = move |answers: &[Option<Answer>]| {
            let mut tokens = answers.iter().filter_map(granted);
            let first = tokens.next();
            let agreeing = first.map_or(0, |t| 1 + tokens.filter(|&u| u == t).count());
            let failed = answers.iter().filter(|a| matches!(a, Some(Err(_)))).count();
            agreeing >= majority || failed > nodes - majority
        };
        self.fan_out(acquire.with_arg(floor), limit, None, enough)
            .await
    }

    /// Writes `token` back to the fencing counters of the keys `taking` takes, on every node;
    /// whether a majority took it.
    async fn raise(&self, taking: &Taking, token: u64) -> bool {
        let raise = raise_call(taking, token);
        self.majority_ok(&self.fan_out_all(&raise, |_| false).await)
    }

    /// Runs a call that writes nothing a lease relies on: the first answer, once a majority
    /// answered.
    pub(crate) async fn read<T: FromRedisValue>(&self, call: &ScriptCall) -> Result<T, Failed> {
        let answer = self.first_of_majority(call).await;
        let value = self.explained(call, answer).await?;
        read(call, value)
    }

    /// [`read`](Self::read), its refusals unexplained: what explains them.
    async fn first_of_majority(&self, call: &ScriptCall) -> Answer {
        let values = self.majority_of(call, |a| self.majority_ok(a)).await?;
        Ok(values.into_iter().next().unwrap_or(Value::Nil))
    }

    /// Whether a majority of nodes answered among `answers`.
    fn majority_ok(&self, answers: &[Option<Answer>]) -> bool {
        answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count() >= self.majority()
    }

    /// Runs a release: the most keys any node released, once a majority answered; a forced
    /// release (`everywhere`) waits for every node: an operator's command, often from a
    /// process that exits right after, which would end the other nodes' tasks and leave the
    /// lock on the nodes that answered last.
    pub(crate) async fn release(
        &self,
        call: &ScriptCall,
        everywhere: bool,
    ) -> Result<usize, Failed> {
        let values = self
            .majority_of(call, |a| !everywhere && self.majority_ok(a))
            .await;
        let values = self.explained(call, values).await?;
        let released = values
            .into_iter()
            .filter_map(|v| usize::from_redis_value(v).ok());
        Ok(released.max().unwrap_or(0))
    }

    /// Runs an extension on every node: per lease, whether a majority extended it.
    pub(crate) async fn extend(&self, call: &ScriptCall) -> Result<Vec<bool>, Failed> {
        let answers = self.fan_out_all(call, |_| false).await;
        let (owned, failures) = sort::<Vec<i64>>(call, answers);
        let leases = owned.iter().map(Vec::len).max().unwrap_or(0);
        if leases == 0 {
            // No node answered: an outage, which renewal retries until the lease runs out.
            let failed = no_quorum(call.op, 0, failures, self.nodes.len());
            return self.explained(call, Err(failed)).await;
        }
        let extended = |i| owned.iter().filter(|o| o.get(i) == Some(&1)).count();
        Ok((0..leases)
            .map(|i| extended(i) >= self.majority())
            .collect())
    }

    /// Reads a lock as a majority of nodes hold it ([`view`]), once the answers settle it
    /// ([`settled`]): a read just after an acquire or a release, whose requests may still be on
    /// their way to some nodes, reports neither what the first node to answer says nor a holder
    /// a majority may not have.
    pub(crate) async fn inspect(&self, call: &ScriptCall) -> Result<Option<Inspected>, Failed> {
        let majority = self.majority();
        let values = self.majority_of(call, |a| settled(a, majority)).await;
        let readings = self
            .explained(call, values)
            .await?
            .into_iter()
            .map(|value| read(call, value))
            .collect::<Result<Vec<Option<Inspected>>, _>>()?;
        Ok(view(&readings, majority))
    }

    /// The keys matching `pattern` on any node (the operator wants to see stragglers too),
    /// once a majority answered.
    pub(crate) async fn scan(&self, pattern: &str) -> Result<Vec<String>, LockError> {
        let (mut found, mut errors) = (Vec::new(), Vec::new());
        for node in &self.nodes {
            match node.scan(pattern).await {
                Ok(keys) => found.push(keys),
                Err(error) => errors.push(error),
            }
        }
        match errors.pop() {
            Some(error) if found.len() < self.majority() => Err(error),
            _ => Ok(found.concat()),
        }
    }

    /// Runs `call` on every node: each node's name and answer, and how many must answer.
    pub(crate) async fn run_on_every_server(
        &self,
        call: &ScriptCall,
    ) -> (Vec<(String, Answer)>, usize) {
        // Never cut short: every node has an answer (a timeout, if nothing else).
        let answers = self
            .fan_out_all(call, |_| false)
            .await
            .into_iter()
            .flatten();
        (
            self.names.iter().cloned().zip(answers).collect(),
            self.majority(),
        )
    }

    /// `answer`, and on a refusal what exactly Redis refused (see `refusal.rs`).
    async fn explained<T>(
        &self,
        call: &ScriptCall,
        answer: Result<T, Failed>,
    ) -> Result<T, Failed> {
        match answer {
            Err(failed) => {
                let probe = |types: ScriptCall| async move {
                    let answer = self.first_of_majority(&types).await;
                    answer.and_then(|v| read(&types, v)).map_err(|f| f.error)
                };
                Err(Box::pin(crate::refusal::explain(call, failed, probe)).await)
            }
            answer => answer,
        }
    }

    /// Runs `call` on every node at once, each within the response timeout, until `enough`.
    async fn fan_out_all(
        &self,
        call: &ScriptCall,
        enough: impl Fn(&[Option<Answer>]) -> bool,
    ) -> Vec<Option<Answer>> {
        self.fan_out(call.detached(), self.timeouts.response, None, enough)
            .await
    }

    /// Runs `call` on the nodes `to` marks (all when `None`), at once, each within `limit`;
    /// `enough` looks at the answers so far (in node order, `None` for one still out) and says
    /// whether to stop waiting.
    async fn fan_out(
        &self,
        call: ScriptCall,
        limit: Duration,
        to: Option<&[bool]>,
        enough: impl Fn(&[Option<Answer>]) -> bool,
    ) -> Vec<Option<Answer>> {
        let (op, call) = (call.op, Arc::new(call));
        let timed_out = move || Failed::maybe(LockError::RedisTimeout { op, after: limit });
        let mut answers: Vec<Option<Answer>> = self.nodes.iter().map(|_| None).collect();
        let mut pending: FuturesUnordered<_> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| to.is_none_or(|to| to[*i]))
            .map(|(i, node)| {
                let (node, call) = (Arc::clone(node), Arc::clone(&call));
                // In a task of its own (see the module docs).
                let task = tokio::spawn(async move {
                    (tokio::time::timeout(limit, node.run(&call)).await)
                        .unwrap_or_else(|_| Err(timed_out()))
                });
                async move { (i, task.await.unwrap_or_else(|_| Err(timed_out()))) }
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

    /// The answers to `call` (run on every node until `enough`) when a majority of nodes
    /// answered.
    async fn majority_of(
        &self,
        call: &ScriptCall,
        enough: impl Fn(&[Option<Answer>]) -> bool,
    ) -> Result<Vec<Value>, Failed> {
        let answers = self.fan_out_all(call, enough).await;
        let (values, failures) = sort::<Value>(call, answers);
        if values.len() >= self.majority() {
            return Ok(values);
        }
        Err(no_quorum(call.op, values.len(), failures, self.nodes.len()))
    }
}

/// The fencing token a node's acquire answer grants, if it granted.
fn granted(answer: &Option<Answer>) -> Option<u64> {
    match answer {
        Some(Ok(value)) => match Acquire::from_redis_value(value.clone()) {
            Ok(Acquire::Acquired { fencing_token }) => Some(fencing_token),
            _ => None,
        },
        _ => None,
    }
}

/// An acquire round's answers, each read once: the tokens granted, who holds the keys where
/// they were held (the longest remaining of the holders found), and the failures.
fn tally(
    acquire: &ScriptCall,
    answers: Vec<Option<Answer>>,
) -> (Vec<u64>, Option<Acquire>, Vec<Failed>) {
    let (read, failures) = sort::<Acquire>(acquire, answers);
    let mut tokens = Vec::new();
    let mut held: Option<Acquire> = None;
    for answer in read {
        match answer {
            Acquire::Acquired { fencing_token } => tokens.push(fencing_token),
            Acquire::Held {
                first_held,
                remaining,
                ..
            } => {
                let longest = match held {
                    Some(Acquire::Held { remaining: r, .. }) => r.max(remaining),
                    _ => remaining,
                };
                held = Some(Acquire::Held {
                    first_held,
                    remaining: longest,
                    unconfirmed: None,
                });
            }
        }
    }
    (tokens, held, failures)
}

/// The answers that came, each read as `T`, and the failures (a reply not read as `T` too).
fn sort<T: FromRedisValue>(
    call: &ScriptCall,
    answers: Vec<Option<Answer>>,
) -> (Vec<T>, Vec<Failed>) {
    let (mut read_as, mut failures) = (Vec::new(), Vec::new());
    for answer in answers.into_iter().flatten() {
        match answer.and_then(|value| read(call, value)) {
            Ok(value) => read_as.push(value),
            Err(failed) => failures.push(failed),
        }
    }
    (read_as, failures)
}

/// Whether the inspect answers so far (in node order, `None` for one still out) settle which
/// holders a `majority` of nodes list: a majority answered, and each holder listed is listed by
/// a majority or can no longer be (the nodes still out are too few); or a majority can no
/// longer answer.
fn settled(answers: &[Option<Answer>], majority: usize) -> bool {
    let out = answers.iter().filter(|a| a.is_none()).count();
    let readings: Vec<Option<Inspected>> = answers
        .iter()
        .filter_map(|a| a.as_ref()?.as_ref().ok())
        .map(|value| FromRedisValue::from_redis_value(value.clone()).unwrap_or(None))
        .collect();
    if readings.len() + out < majority {
        return true;
    }
    if readings.len() < majority {
        return false;
    }
    let listed: Vec<&[String]> = readings.iter().map(Inspected::members_of).collect();
    listed.iter().copied().flatten().all(|holder| {
        let by = listed.iter().filter(|l| l.contains(holder)).count();
        by >= majority || by + out < majority
    })
}

/// The lock as a quorum holds it, from the inspect answers of a majority (`majority`) of its
/// nodes or more: a lease holds only where a majority of nodes granted it, so the holders that
/// a majority list, held for as long as a majority still hold them, with the greatest fencing
/// counter any node has; `None` when no holder is listed by a majority. Never in a hand-off's
/// claim: a quorum refuses fair requests, so a node that reads one has a lease whose expiry
/// happens to match (`LockInfo::handoff_claim`).
fn view(readings: &[Option<Inspected>], majority: usize) -> Option<Inspected> {
    let listed: Vec<&[String]> = readings.iter().map(Inspected::members_of).collect();
    let agreed = |holder: &String| listed.iter().filter(|l| l.contains(holder)).count() >= majority;
    let mut holders: Vec<String> = Vec::new();
    for holder in listed.iter().copied().flatten().filter(|h| agreed(h)) {
        if !holders.contains(holder) {
            holders.push(holder.clone());
        }
    }
    let holding = |l: &&[String]| l.iter().any(|h| holders.contains(h));
    let base = readings
        .iter()
        .zip(&listed)
        .find(|(_, l)| holding(l))?
        .0
        .as_ref()?;
    // A majority holds it until the majority-th longest expiry among the nodes holding it
    // (-1: no expiry, the longest).
    let mut pttls: Vec<i64> = readings
        .iter()
        .zip(&listed)
        .filter(|(_, l)| holding(l))
        .filter_map(|(reading, _)| reading.as_ref())
        .map(|r| if r.pttl < 0 { i64::MAX } else { r.pttl })
        .collect();
    pttls.sort_unstable_by(|a, b| b.cmp(a));
    let pttl = pttls.get(majority - 1).copied().unwrap_or(0);
    let counter = readings
        .iter()
        .flatten()
        .filter_map(|r| r.counter.parse::<u64>().ok())
        .max()
        .map_or_else(String::new, |c| c.to_string());
    let kind = match base.kind.as_str() {
        "h" => "x".to_owned(),
        kind => kind.to_owned(),
    };
    Some(Inspected {
        kind,
        pttl: if pttl == i64::MAX { -1 } else { pttl },
        counter,
        holders: i64::try_from(holders.len()).unwrap_or(i64::MAX),
        members: holders,
        ..base.clone()
    })
}

/// Why no majority was had. When the nodes that refused (settings Redis rejects, a key of
/// another type) are enough to deny a majority, the refusal itself: no outage is to blame,
/// and retrying will not help. Else [`LockError::NoQuorum`], naming a refusal first.
fn no_quorum(op: &'static str, granted: usize, mut failures: Vec<Failed>, nodes: usize) -> Failed {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An inspect answer listing `holders` (none: free).
    fn held_by(holders: &[&str]) -> Option<Answer> {
        held_as("x", holders)
    }

    /// An inspect answer listing `holders` (none: free), of kind `kind` (`x`, `h`, `s`).
    fn held_as(kind: &str, holders: &[&str]) -> Option<Answer> {
        if holders.is_empty() {
            return Some(Ok(Value::Nil));
        }
        let mut fields = vec![
            Value::BulkString(kind.as_bytes().to_vec()),
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
            let readings: Vec<Option<Inspected>> = answers
                .iter()
                .map(|a| {
                    let value = a.as_ref().unwrap().as_ref().unwrap().clone();
                    FromRedisValue::from_redis_value(value).unwrap()
                })
                .collect();
            view(&readings, 2)
        };
        assert_eq!(
            view(&[held_by(&["a"]), held_by(&[]), held_by(&["b"])]),
            None
        );
        assert_eq!(view(&[held_by(&[]), held_by(&[])]), None);
        let seen = view(&[held_by(&[]), held_by(&["a"]), held_by(&["a", "b"])]).unwrap();
        assert_eq!(seen.members, ["a"]);
        assert_eq!(seen.holders, 1);
        // A lease whose expiry reads as a hand-off's claim on every node is a lease: a quorum
        // hands nothing off.
        let claimed = || held_as("h", &["a"]);
        let seen = view(&[claimed(), claimed(), claimed()]).unwrap();
        assert_eq!(seen.kind, "x");
        let shared = view(&[held_as("s", &["a"]), held_as("s", &["a"])]).unwrap();
        assert_eq!(shared.kind, "s");
    }
}
