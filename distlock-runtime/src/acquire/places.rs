//! Taking one request's keys where they live: on a [`Serial`] deployment each shard's group of
//! keys on its one server, in turn, every group granting (one server, Sentinel, a cluster's
//! slots); on a quorum the same keys on every node at once, a majority granting (see
//! `topology/quorum.rs`).
//!
//! Either way the lease's fencing token is the greatest any place drew, written back to the
//! places that drew less ([`raise_call`]), so the next lease of each key draws above it; and
//! when the grant rule is not met, what was taken is undone before the answer says who holds
//! the keys. Each place's reply is read once, as the acquire script's [`Acquire`].
//!
//! **In turn.** One global order (shard, then key: the keys are sorted), so two requests for
//! overlapping keys on several shards take them in the same order and cannot deadlock. A group
//! whose keys are held releases the groups taken before it. A failure after some group was
//! taken says the request ran (its acquire then releases by token, see `acquire/mod.rs`).

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::call::{ScriptCall, Taking};
use crate::failed::{Failed, Reached};
use crate::fence::raise_call;
use crate::keys::LockKeys;
use crate::scripts::{Acquire, Taken, Waiting};
use crate::topology::{by_shard, Deployment, Grant, Serial};

/// The acquire of one request's keys, built once per owner token (and again when the request
/// starts to wait), sent at every attempt.
pub(crate) struct Places {
    /// One acquire call per group of keys that share a shard (one group but on a cluster),
    /// groups in shard order; a quorum's one group runs on every node.
    groups: Vec<Group>,
}

/// The keys of one request that share a shard, taken by one script call.
struct Group {
    /// What it takes: also makes its undo, and names its fencing counters for the write-back.
    taking: Arc<Taking>,
    acquire: ScriptCall,
}

impl Places {
    /// The acquire of `redis_keys` by `token` for `ttl`, marking as `waiting` says, for a
    /// request whose wait ends at `deadline` (none for a try-lock).
    pub(crate) fn new(
        deployment: &Deployment,
        redis_keys: &Arc<[LockKeys]>,
        token: &Arc<str>,
        (ttl, deadline): (Duration, Option<Instant>),
        waiting: Waiting,
    ) -> Self {
        let (publish, announce) = deployment.announce();
        let groups = by_shard(deployment, redis_keys)
            .into_iter()
            .map(|indices| {
                let taking = Arc::new(Taking {
                    keys: Arc::clone(redis_keys),
                    indices,
                    token: Arc::clone(token),
                    ttl,
                    publish,
                    announce,
                });
                Group {
                    acquire: taking.call(deadline, waiting),
                    taking,
                }
            })
            .collect();
        Self { groups }
    }

    /// One attempt.
    pub(crate) async fn take(&self, deployment: &Deployment) -> Result<Taken, Failed> {
        match &deployment.grant {
            Grant::Serial(serial) => Ok(Taken {
                answer: self.take_in_turn(serial).await?,
                late: false,
            }),
            Grant::Majority(quorum) => {
                let group = &self.groups[0];
                // Boxed: a quorum's round is large, and rare beside the other deployments'.
                Box::pin(quorum.acquire(&group.taking, &group.acquire)).await
            }
        }
    }

    /// Every group in order.
    async fn take_in_turn(&self, serial: &Serial) -> Result<Acquire, Failed> {
        let mut drawn: Vec<u64> = Vec::with_capacity(self.groups.len());
        let wrote = |failed: Failed, taken: bool| Failed {
            reached: match failed.reached {
                Reached::No | Reached::Refused if taken => Reached::Answered,
                reached => reached,
            },
            error: failed.error,
        };
        for group in &self.groups {
            match serial.call::<Acquire>(&group.acquire).await {
                Ok(Acquire::Acquired { fencing_token }) => drawn.push(fencing_token),
                Ok(Acquire::Held {
                    first_held,
                    remaining,
                    unconfirmed,
                }) => {
                    for taken in &self.groups[..drawn.len()] {
                        serial
                            .call::<Value>(&taken.taking.undo())
                            .await
                            .map_err(|failed| wrote(failed, true))?;
                    }
                    return Ok(Acquire::Held {
                        first_held: group.taking.indices.get(first_held).copied().unwrap_or(0),
                        remaining,
                        unconfirmed,
                    });
                }
                Err(failed) => return Err(wrote(failed, !drawn.is_empty())),
            }
        }
        let token = drawn.iter().copied().max().unwrap_or(0);
        for (group, _) in self.groups.iter().zip(&drawn).filter(|(_, &t)| t < token) {
            let mut raise = raise_call(&group.taking, token);
            raise.deadline = group.acquire.deadline;
            serial
                .call::<Value>(&raise)
                .await
                .map_err(|failed| wrote(failed, true))?;
        }
        Ok(Acquire::Acquired {
            fencing_token: token,
        })
    }
}
