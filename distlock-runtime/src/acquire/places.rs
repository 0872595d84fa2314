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
//! **Slots.** A quorum's node sees only the holders it granted, so a semaphore there is N slots,
//! each an exclusive lock (`scripts/holders.lua`): an attempt asks for one slot at a time on
//! every node, from a start its owner token picks (contenders spread over the slots), and ends
//! at the first slot a majority granted; a slot not granted was undone by its round (see
//! `topology/quorum.rs`) before the next is asked, so a token never holds two slots, and its
//! renewal and release name whichever slot it holds. Two leases cannot both hold one slot on a
//! majority (any two majorities share a node, which grants the slot to one member at a time), so
//! at most N leases are valid at once. A round that leaves a node in doubt ends the attempt
//! (its token is not sent again); so does the wait's deadline.
//!
//! **In turn.** One global order (shard, then key: the keys are sorted), so two requests for
//! overlapping keys on several shards take them in the same order and cannot deadlock. A group
//! whose keys are held releases the groups taken before it. A failure after some group was
//! taken says the request ran (its acquire then releases by token, see `acquire/mod.rs`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::call::{ScriptCall, Taking};
use crate::failed::{Failed, Reached};
use crate::fence::raise_call;
use crate::keys::{LockKeys, Seat};
use crate::mode::LockMode;
use crate::scripts::{Acquire, Taken, Waiting};
use crate::topology::quorum::Quorum;
use crate::topology::{by_shard, Deployment, Grant, Serial};

/// The acquire of one request's keys, built once per owner token (and again when the request
/// starts to wait), sent at every attempt.
pub(crate) struct Places {
    /// One acquire call per group of keys that share a shard (one group but on a cluster),
    /// groups in shard order; a quorum's one group runs on every node.
    groups: Vec<Group>,
    /// A semaphore on a quorum: its slots, asked in turn (`groups` is then empty).
    slots: Option<Slots>,
}

/// A quorum semaphore's one key, asked slot after slot (see the module docs).
struct Slots {
    /// The key, held in whichever slot; each round asks for one.
    taking: Taking,
    /// How many slots (the permits), and the first one asked.
    n: u32,
    start: u32,
    deadline: Option<Instant>,
    waiting: Waiting,
    /// The slot the last attempt ended on.
    last: AtomicU32,
    /// How many attempts of the request before this token's ended on a held slot that a node
    /// left in doubt (see [`Places::after_doubt`]).
    doubts: u32,
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
        if let [keys] = &redis_keys[..] {
            if let (LockMode::Permits(n), Seat::AnySlot) = (keys.mode(), keys.seat()) {
                let taking = Taking {
                    keys: Arc::clone(redis_keys),
                    indices: vec![0],
                    token: Arc::clone(token),
                    ttl,
                    publish,
                    announce,
                };
                let start = first_slot(token, n);
                let slots = Slots {
                    taking,
                    n,
                    start,
                    deadline,
                    waiting,
                    last: AtomicU32::new(start),
                    doubts: 0,
                };
                return Self {
                    groups: Vec::new(),
                    slots: Some(slots),
                };
            }
        }
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
        Self {
            groups,
            slots: None,
        }
    }

    /// A quorum semaphore's attempt under `before` (this request's previous owner token) ended
    /// on a held slot that a node left in doubt: this token's first attempt starts at the next
    /// slot. Whether to make it at once: while fewer attempts in a row ended so than there are
    /// slots (a node that hangs leaves every round in doubt, and each token asks one slot then:
    /// a token never holds two slots), so that a free slot is found without waiting for a
    /// release, and a semaphore that is full is not asked in a loop.
    pub(crate) fn after_doubt(&mut self, before: &Places) -> bool {
        let (Some(slots), Some(previous)) = (&mut self.slots, &before.slots) else {
            return false;
        };
        let last = previous.last.load(Ordering::Relaxed);
        slots.start = slot_after(last, 1, slots.n);
        slots.doubts = previous.doubts + 1;
        slots.doubts < slots.n
    }

    /// One attempt.
    pub(crate) async fn take(&self, deployment: &Deployment) -> Result<Taken, Failed> {
        match (&deployment.grant, &self.slots) {
            (Grant::Serial(serial), _) => Ok(Taken {
                answer: self.take_in_turn(serial).await?,
                late: false,
            }),
            // Boxed: a quorum's round is large, and rare beside the other deployments'.
            (Grant::Majority(quorum), Some(slots)) => Box::pin(slots.take(quorum)).await,
            (Grant::Majority(quorum), None) => {
                let group = &self.groups[0];
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

impl Slots {
    /// One attempt: slot after slot from `start`, until a majority grants one, a round leaves a
    /// node in doubt or fails, or the wait's deadline passes; when no slot was granted, the
    /// soonest any of those asked may free.
    async fn take(&self, quorum: &Quorum) -> Result<Taken, Failed> {
        let mut soonest: Option<Duration> = None;
        for slot in (0..self.n).map(|i| slot_after(self.start, i, self.n)) {
            let keys = self.taking.keys[0].clone().seated(Seat::Slot(slot));
            let taking = Arc::new(Taking {
                keys: Arc::new([keys]),
                indices: vec![0],
                token: Arc::clone(&self.taking.token),
                ..self.taking
            });
            let acquire = taking.call(self.deadline, self.waiting);
            self.last.store(slot, Ordering::Relaxed);
            let taken = quorum.acquire(&taking, &acquire).await?;
            let Taken {
                answer: Acquire::Held { remaining, .. },
                late: false,
            } = taken
            else {
                // Granted, or a node may still grant this slot: this token asks no other.
                return Ok(taken);
            };
            soonest = match (soonest, remaining) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if self
                .deadline
                .is_some_and(|deadline| Instant::now() >= deadline)
            {
                break;
            }
        }
        Ok(Taken {
            answer: Acquire::Held {
                first_held: 0,
                remaining: soonest,
                unconfirmed: None,
            },
            late: false,
        })
    }
}

/// The first slot of `n` an owner token asks for: from its leading hex digits (random), so that
/// contenders spread over the slots rather than all ask slot 0 first.
fn first_slot(token: &str, n: u32) -> u32 {
    let digits = token.get(..8).unwrap_or_default();
    u32::from_str_radix(digits, 16).unwrap_or(0) % n.max(1)
}

/// The slot asked `i`-th, of `n`, from `start`.
fn slot_after(start: u32, i: u32, n: u32) -> u32 {
    let slot = u64::from(start) + u64::from(i);
    u32::try_from(slot % u64::from(n.max(1))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_asks_every_slot_once_from_the_tokens_start() {
        for n in [1, 2, 3, 7] {
            for token in [
                "00000000",
                "0000000b",
                "ffffffff",
                "9a3c41e0aa:label",
                "short",
            ] {
                let start = first_slot(token, n);
                assert!(start < n);
                let mut asked: Vec<u32> = (0..n).map(|i| slot_after(start, i, n)).collect();
                assert_eq!(asked[0], start);
                asked.sort_unstable();
                assert_eq!(asked, (0..n).collect::<Vec<_>>(), "{token} of {n}");
            }
        }
        assert_eq!(first_slot("0000000b", 3), 2);
        assert_eq!(slot_after(u32::MAX - 1, 1, u32::MAX), 0);
    }
}
