//! Taking one request's keys where they live, by the route's [`Grant`]: each shard's group of
//! keys on its one server, in turn, every group granting ([`Grant::All`]: one server, Sentinel, a
//! cluster's slots); or the same keys on every node of a quorum at once, a majority granting
//! ([`Grant::Majority`]).
//!
//! Either way the lease's fencing token is the greatest any place drew, written back to the
//! places that drew less ([`raise_call`]), so the next lease of each key draws above it; and
//! when the grant rule is not met, what was taken is undone before the answer says who holds
//! the keys. Each place's reply is read once, as the acquire script's [`Acquire`].
//!
//! - **All, in turn.** One global order (shard, then key: the keys are sorted), so two requests
//!   for overlapping keys on several shards take them in the same order and cannot deadlock. A
//!   group whose keys are held releases the groups taken before it. A failure after some group
//!   was taken says the request ran (its acquire then releases by token, see `acquire/mod.rs`).
//! - **A majority, at once.** Each node is proposed a token slightly ahead of this host's clock
//!   ([`FLOOR_AHEAD_US`]), which nodes with close clocks all draw: the round ends as soon as a
//!   majority granted the same one (a majority then holds it in its counters, no write-back
//!   needed). When too many nodes failed (down, erroring, timed out) for a majority to be left,
//!   the round stops waiting at once. A node whose acquire may still run (hung, or its answer
//!   lost) may grant late: the answer says so ([`Taken::late`]), and the request never uses that
//!   owner token again (a clean-up of the late grant could otherwise release a lease a later
//!   attempt of the same request took there).

use std::sync::Arc;
use std::time::Duration;

use redis::{FromRedisValue, Value};
use tokio::time::Instant;

use crate::call::{Kind, ScriptCall, Taking};
use crate::failed::{Failed, Reached};
use crate::fence::raise_call;
use crate::keys::LockKeys;
use crate::refusal;
use crate::scripts::{self, Acquire, Waiting};
use crate::topology::quorum::no_quorum;
use crate::topology::{by_shard, Grant, Route};

/// How far ahead of this host's clock (µs) a quorum proposes fencing tokens: more than the
/// round trip to a node plus the clock offsets between hosts, so every node draws the proposal.
const FLOOR_AHEAD_US: u64 = 50_000;

/// The acquire of one request's keys, built once per owner token (and again when the request
/// starts to wait), sent at every attempt.
pub(crate) struct Places {
    grant: Grant,
    /// One acquire call per group of keys that share a shard (one group but on a cluster),
    /// groups in shard order; a quorum's one group runs on every node.
    groups: Vec<Group>,
}

/// The keys of one request that share a shard, taken by one script call.
struct Group {
    /// The index of each of its keys among the request's sorted keys.
    indices: Vec<usize>,
    /// Its kind also makes this group's undo, and names its fencing counters for the
    /// write-back.
    acquire: ScriptCall,
}

impl Group {
    fn taking(&self) -> &Taking {
        match &self.acquire.kind {
            Kind::Acquire(taking) => taking,
            _ => unreachable!("a group's call is an acquire"),
        }
    }
}

/// What an acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) answer: Acquire,
    /// A place's acquire may still run and grant (a hung quorum node): the request must not
    /// send its owner token again.
    pub(crate) late: bool,
}

impl Places {
    /// The acquire of `redis_keys` by `token` for `ttl`, marking as `waiting` says, for a
    /// request whose wait ends at `deadline` (none for a try-lock).
    pub(crate) fn new(
        route: &dyn Route,
        redis_keys: &Arc<[LockKeys]>,
        token: &Arc<str>,
        (ttl, deadline): (Duration, Option<Instant>),
        waiting: Waiting,
    ) -> Self {
        let grant = route.grant();
        let announce = (route.publish_command(), route.announces());
        let shards = match grant {
            Grant::All => by_shard(route, redis_keys),
            Grant::Majority { .. } => vec![(0..redis_keys.len()).collect()],
        };
        let groups = shards
            .into_iter()
            .map(|indices| Group {
                acquire: scripts::acquire_call(
                    redis_keys,
                    indices.clone(),
                    token,
                    (ttl, deadline),
                    waiting,
                    announce,
                ),
                indices,
            })
            .collect();
        Self { grant, groups }
    }

    /// One attempt.
    pub(crate) async fn take(&self, route: &dyn Route) -> Result<Taken, Failed> {
        let answer = match self.grant {
            Grant::All => self.take_in_turn(route).await?,
            Grant::Majority { nodes } => return self.take_at_once(route, nodes).await,
        };
        Ok(Taken {
            answer,
            late: false,
        })
    }

    /// [`Grant::All`]: every group in order.
    async fn take_in_turn(&self, route: &dyn Route) -> Result<Acquire, Failed> {
        let mut drawn: Vec<u64> = Vec::with_capacity(self.groups.len());
        let wrote = |failed: Failed, taken: bool| Failed {
            reached: match failed.reached {
                Reached::No | Reached::Refused if taken => Reached::Answered,
                reached => reached,
            },
            error: failed.error,
        };
        for group in &self.groups {
            match route.call::<Acquire>(&group.acquire).await {
                Ok(Acquire::Acquired { fencing_token }) => drawn.push(fencing_token),
                Ok(Acquire::Held {
                    first_held,
                    remaining,
                    unconfirmed,
                }) => {
                    for taken in &self.groups[..drawn.len()] {
                        route
                            .call::<Value>(&scripts::undo(taken.taking()))
                            .await
                            .map_err(|failed| wrote(failed, true))?;
                    }
                    return Ok(Acquire::Held {
                        first_held: group.indices.get(first_held).copied().unwrap_or(0),
                        remaining,
                        unconfirmed,
                    });
                }
                Err(failed) => return Err(wrote(failed, !drawn.is_empty())),
            }
        }
        let token = drawn.iter().copied().max().unwrap_or(0);
        for (group, _) in self.groups.iter().zip(&drawn).filter(|(_, &t)| t < token) {
            let mut raise = raise_call(group.taking(), token);
            raise.deadline = group.acquire.deadline;
            route
                .call::<Value>(&raise)
                .await
                .map_err(|failed| wrote(failed, true))?;
        }
        Ok(Acquire::Acquired {
            fencing_token: token,
        })
    }

    /// [`Grant::Majority`] of `nodes`: the one group on every node at once.
    async fn take_at_once(&self, route: &dyn Route, nodes: usize) -> Result<Taken, Failed> {
        let group = &self.groups[0];
        let taking = group.taking();
        let majority = self.grant.needed(nodes);
        // Proposed to every node as the least token to draw (see the module docs).
        let floor = u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_micros(),
        )
        .unwrap_or(0)
            + FLOOR_AHEAD_US;
        let limit = route.acquire_timeout(taking.ttl);
        let all = vec![true; nodes];
        // The round ends as soon as a majority granted the same token, or too many failed for
        // a majority to be left. (A node that says the key is held is waited for: contention is
        // answered with who holds it, not an error.)
        let enough = move |answers: &[Option<Result<Value, Failed>>]| {
            let mut tokens = answers.iter().filter_map(granted);
            let first = tokens.next();
            let agreeing = first.map_or(0, |t| 1 + tokens.filter(|&u| u == t).count());
            let failed = answers.iter().filter(|a| matches!(a, Some(Err(_)))).count();
            agreeing >= majority || failed > nodes - majority
        };
        let proposed = Arc::new(group.acquire.with_arg(floor));
        let answers = route.fan_out(proposed, limit, &all, &enough).await;
        // Nodes that took the lock, and nodes that may yet (no answer, or one that may still
        // arrive and run).
        let took: Vec<bool> = answers.iter().map(|a| granted(a).is_some()).collect();
        let late = answers.iter().any(|answer| match answer {
            None => true,
            Some(Err(failed)) => !matches!(failed.reached, Reached::No | Reached::Refused),
            Some(Ok(_)) => false,
        });
        let mut tokens = Vec::new();
        let mut held: Option<Acquire> = None;
        let mut failures = Vec::new();
        for answer in answers.into_iter().flatten() {
            match answer.and_then(|value| parse(&group.acquire, value)) {
                Ok(Acquire::Acquired { fencing_token }) => tokens.push(fencing_token),
                Ok(Acquire::Held {
                    first_held,
                    remaining,
                    ..
                }) => {
                    let longest = match held {
                        Some(Acquire::Held { remaining: r, .. }) => r.max(remaining),
                        _ => remaining,
                    };
                    // A quorum waits for no replica (`min_replicas` is refused on one).
                    held = Some(Acquire::Held {
                        first_held,
                        remaining: longest,
                        unconfirmed: None,
                    });
                }
                Err(failed) => failures.push(failed),
            }
        }
        if tokens.len() >= majority {
            let token = tokens.iter().copied().max().unwrap_or(0);
            // A majority already holds the token in its counters when every grant drew it.
            let uniform = tokens.iter().all(|&t| t == token);
            if uniform || raise_on_majority(route, taking, token, nodes).await {
                let answer = Acquire::Acquired {
                    fencing_token: token,
                };
                return Ok(Taken { answer, late });
            }
            failures.push(Failed {
                error: crate::error::LockError::NoQuorum {
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
        let undo = Arc::new(scripts::undo(taking).detached());
        let undone = route.fan_out(undo, limit, &took, &|_| false).await;
        let took_undone = undone
            .iter()
            .zip(&took)
            .all(|(answer, took)| !took || matches!(answer, Some(Ok(_))));
        match held {
            // Contention: who holds the key, so the caller waits for it.
            Some(answer) if took_undone => Ok(Taken { answer, late }),
            _ => {
                let mut failed = no_quorum(group.acquire.op, tokens.len(), failures, nodes);
                if !took_undone || late {
                    // A grant the undo did not reach, or one still to come: the acquire
                    // releases by token in the background too, until the ttl if Redis fails.
                    failed.reached = Reached::Maybe;
                }
                if !failed.error.is_misconfigured() {
                    return Err(failed);
                }
                // A refusal says what exactly was refused, as every route's call does.
                let probe = |types: ScriptCall| async move { route.invoke(&types).await };
                Err(Box::pin(refusal::explain(&group.acquire, failed, probe)).await)
            }
        }
    }
}

/// The fencing token a node's answer grants, if it granted.
fn granted(answer: &Option<Result<Value, Failed>>) -> Option<u64> {
    match answer {
        Some(Ok(value)) => match Acquire::from_redis_value(value.clone()) {
            Ok(Acquire::Acquired { fencing_token }) => Some(fencing_token),
            _ => None,
        },
        _ => None,
    }
}

/// A node's reply to `call`, read once.
fn parse(call: &ScriptCall, value: Value) -> Result<Acquire, Failed> {
    Acquire::from_redis_value(value).map_err(|error| Failed {
        error: crate::error::LockError::Redis {
            op: call.op,
            source: error.into(),
        },
        reached: Reached::Answered,
    })
}

/// Writes `token` back to the fencing counters of the keys `taking` takes, on every node;
/// whether a majority of `nodes` took it.
async fn raise_on_majority(route: &dyn Route, taking: &Taking, token: u64, nodes: usize) -> bool {
    let raise = Arc::new(raise_call(taking, token));
    let all = vec![true; nodes];
    let answers = route
        .fan_out(raise, route.response_timeout(), &all, &|_| false)
        .await;
    answers.iter().filter(|a| matches!(a, Some(Ok(_)))).count()
        >= Grant::Majority { nodes }.needed(nodes)
}
