//! The fair hand-off protocol, end to end: how waiters queue in Redis, how a release hands the
//! lock to the oldest live waiter and says so, how the waiter trusts and dates that message, and
//! how a crashed recipient's claim is watched.
//!
//! 1. **Queue.** A fair waiter that finds the key held joins the key's queue (see
//!    [`ACQUIRE_FAIR`]; the queue's Lua is in `scripts/fair_*.lua`): a list of tokens in arrival
//!    order, and a hash of each token's entry (deadline, claim time, secret). A free key is
//!    taken only if no live waiter queued first.
//! 2. **Hand-off.** A release with a live waiter queued sets the key to that waiter's token for
//!    a claim time ([`HANDOFF_CLAIM`]), draws its fencing token, and publishes
//!    `h <token> <fence> <redis_ms> <claim_ms> <next> <mac>` on the key's channel, where `<mac>`
//!    is `sha1hex(secret + " " + fields + " " + secret)` over the fields before it. `<next>`
//!    names a waiter that should watch the claim; the release leaves it empty (finding the next
//!    live waiter would cost two more commands per hand-off, and the watchers of point 5 cover
//!    it).
//! 3. **Trust.** Anyone allowed to publish on the channel could name a waiter; anyone allowed
//!    to subscribe sees every message. So a message signs its fields with the secret the
//!    waiter's latest attempt stored in the queue (128 random bits, new at every attempt, never
//!    published): only a client that can read the queue's keys (the release script) can sign,
//!    and the waiter checks the signature before it trusts the claim, the date or the fencing
//!    token ([`FairWaiter`]). The safety boundary is key access: a client that can read the
//!    queue can take the lock itself. A client that may publish can still disturb liveness (fake
//!    release notices make waiters try again; fake hand-offs naming waiters of other processes
//!    make watchers wait, by at most a claim and a quarter per message), never exclusion or
//!    fencing.
//! 4. **Dating.** The new holder counts its lease from a moment known to precede Redis setting
//!    the key: [`handoff_start`] maps the message's Redis time onto this host's clock through
//!    the Redis time of the waiter's own last attempt. A message too old to trust is confirmed by
//!    one attempt instead (which finds the key already the waiter's).
//! 5. **Claim.** The recipient's renewal extends the key from its claim to its ttl a third of
//!    the claim later, like any renewal (a body that ends sooner spends no round trip on it); a
//!    recipient without renewal extends it at once. A recipient that is gone (its process
//!    crashed) leaves the claim to lapse; the oldest fair waiter of every subscribed process
//!    watches it ([`deliver`]), and retries once the claim (plus a quarter) has passed. Each
//!    crashed waiter at the head of the queue costs the queue at most that long.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::call::{Kind, Lua, ScriptCall};
use crate::failed::Failed;
use crate::keys::LockKeys;
use crate::scripts::{lua, Waiting};
use crate::sync::lock;
use crate::time::millis;
use crate::topology::Route;

/// How long a lock handed to a fair waiter is held for it before the waiter extends it to its
/// ttl (its renewal does, a third of the claim later). A hand-off to a waiter that is gone
/// (crashed, or its process stalled) costs the queue at most this long (plus a quarter, the
/// watchers' slack) before the next waiter takes the lock.
///
/// ```no_run
/// use distlock_runtime::HANDOFF_CLAIM;
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// // The holder's usual time, plus one crashed waiter ahead in the queue (a claim and a
/// // quarter).
/// let wait = std::time::Duration::from_secs(5) + HANDOFF_CLAIM * 5 / 4;
/// let lease = locks.lock("stock:sku-1").fair(true).wait(wait).acquire().await?;
/// # Ok(()) }
/// ```
pub const HANDOFF_CLAIM: Duration = Duration::from_secs(2);

/// Takes one lock key fairly, or joins its queue: `scripts/fair_acquire.lua`.
//
// `#!lua`, as the plain acquire (see `scripts/mod.rs`).
pub(crate) static ACQUIRE_FAIR: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua!(
        "#!lua";
        "mark.lua", "draw.lua", "fair_pop_live.lua", "fair_hand.lua", "fair_acquire.lua"
    ))
});

/// A fair request's queueing script call, built once per acquire: the keys and fixed arguments;
/// the token, the wait left and the attempt's secret are added per attempt.
pub(crate) struct FairRequest {
    keys: [String; 4],
    ttl_ms: u64,
    claim_ms: u64,
}

/// What one fair attempt found, with Redis's clock (ms) when the script ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FairAnswer {
    /// The caller holds the key now.
    Acquired { fencing_token: u64 },
    /// The caller is queued behind the holder, whose lease has `remaining` left (if it expires).
    Queued {
        remaining: Option<Duration>,
        server_ms: u64,
    },
}

impl FairRequest {
    pub(crate) fn new(keys: &LockKeys, ttl: Duration) -> Self {
        Self {
            keys: [
                keys.lock().to_owned(),
                keys.queue().to_owned(),
                keys.waiters().to_owned(),
                keys.fence().to_owned(),
            ],
            ttl_ms: millis(ttl),
            claim_ms: millis(ttl.min(HANDOFF_CLAIM)),
        }
    }

    /// One attempt by `token`, which waits `wait_left` more and stores `secret` in its entry.
    /// `waiting`: whether this request found the key held before.
    pub(crate) async fn send(
        &self,
        redis: &dyn Route,
        token: &str,
        secret: &str,
        wait_left: Duration,
        waiting: Waiting,
    ) -> Result<FairAnswer, Failed> {
        let mut invocation = ScriptCall::new("acquire", &ACQUIRE_FAIR, Kind::Fair, self.keys.len());
        for key in &self.keys {
            invocation.key(key.as_str());
        }
        // At most a century: the script does arithmetic on it in Lua numbers.
        let wait_ms = u64::try_from(wait_left.as_millis())
            .unwrap_or(u64::MAX)
            .min(100 * 365 * 86_400_000);
        invocation
            .arg(token)
            .arg(self.ttl_ms)
            .arg(self.claim_ms)
            .arg(wait_ms)
            .arg(secret)
            .arg(redis.publish_command())
            .arg(waiting);
        redis.call(&invocation).await
    }
}

impl redis::FromRedisValue for FairAnswer {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        if let redis::Value::Int(_) | redis::Value::BulkString(_) = v {
            return Ok(Self::Acquired {
                fencing_token: redis::FromRedisValue::from_redis_value(v)?,
            });
        }
        let fields: Vec<i64> = redis::FromRedisValue::from_redis_value(v)?;
        let server_ms = |now: i64| {
            u64::try_from(now).map_err(|_| redis::ParsingError::from("negative server time"))
        };
        match fields.as_slice() {
            [0, pttl, now] => Ok(Self::Queued {
                remaining: u64::try_from(*pttl).ok().map(Duration::from_millis),
                server_ms: server_ms(*now)?,
            }),
            _ => Err(redis::ParsingError::from(
                "unexpected fair acquire script reply",
            )),
        }
    }
}

/// A hand-off message: the lock was given to `token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Handoff {
    /// The waiter the lock was handed to.
    pub(crate) token: String,
    pub(crate) fencing_token: u64,
    /// Redis server time of the hand-off, in ms.
    pub(crate) server_ms: u64,
    /// How long the lock is held for the waiter before it must be extended.
    pub(crate) claim: Duration,
    /// A waiter that should watch the claim; empty when none (the release leaves it empty).
    pub(crate) next: String,
    /// The fields the signature covers, as published.
    pub(crate) signed: String,
    /// `sha1hex(secret + " " + signed + " " + secret)`, with the secret of the recipient's
    /// attempt: only the release script, which reads the secret in the queue, can make it.
    pub(crate) mac: String,
}

impl Handoff {
    /// Parses a message from the release channel: `None` for a plain release (empty) or
    /// anything not a hand-off.
    pub(crate) fn parse(message: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(message).ok()?.strip_prefix("h ")?;
        let (signed, mac) = text.rsplit_once(' ')?;
        let mut fields = signed.split(' ');
        let token = fields.next()?.to_owned();
        let fencing_token = fields.next()?.parse().ok()?;
        let server_ms = fields.next()?.parse().ok()?;
        let claim = Duration::from_millis(fields.next()?.parse().ok()?);
        let next = fields.next()?.to_owned();
        if fields.next().is_some() {
            return None;
        }
        Some(Self {
            token,
            fencing_token,
            server_ms,
            claim,
            next,
            signed: signed.to_owned(),
            mac: mac.to_owned(),
        })
    }

    /// Whether `secret` signed this message.
    fn signed_with(&self, secret: &str) -> bool {
        !secret.is_empty() && mac(secret, &self.signed) == self.mac
    }
}

/// The signature a hand-off with `signed` fields carries for a waiter whose attempt stored
/// `secret`: the same as the release script's `redis.sha1hex(secret .. ' ' .. signed .. ' ' ..
/// secret)` (the secret on both sides, so the message cannot be extended).
fn mac(secret: &str, signed: &str) -> String {
    let mut sha1 = sha1_smol::Sha1::new();
    for part in [secret, " ", signed, " ", secret] {
        sha1.update(part.as_bytes());
    }
    sha1.digest().to_string()
}

/// The earliest moment (on this host's clock) a hand-off at Redis time `server_ms` can have
/// happened, from an attempt sent at `sent` that ran at Redis time `ran_ms`: Redis's clock has
/// advanced `server_ms - ran_ms` since a moment after `sent`. Allows 1% clock-rate drift and
/// 1 ms for the millisecond resolution. `None` without a dated attempt.
pub(crate) fn handoff_start(
    calibration: Option<(Instant, u64)>,
    server_ms: u64,
) -> Option<Instant> {
    let (sent, ran_ms) = calibration?;
    let start = if server_ms >= ran_ms {
        let elapsed = Duration::from_millis(server_ms - ran_ms);
        (sent + elapsed - elapsed / 100).checked_sub(Duration::from_millis(1))?
    } else {
        let before = Duration::from_millis(ran_ms - server_ms);
        sent.checked_sub(before + before / 100 + Duration::from_millis(1))?
    };
    Some(start.min(Instant::now()))
}

/// What a local fair waiter keeps for the subscriber to find: its token (hand-offs name it),
/// its attempts' secrets (a real hand-off shows one) and the news hand-offs brought it.
pub(crate) struct FairWaiter {
    token: Arc<str>,
    secrets: Mutex<Secrets>,
    news: Mutex<News>,
}

/// The secrets of a fair waiter's latest two attempts.
#[derive(Default)]
struct Secrets {
    latest: Option<Arc<str>>,
    earlier: Option<Arc<str>>,
}

/// Which attempt's secret a hand-off showed.
enum Shown {
    Latest,
    Earlier,
    Unknown,
}

/// What a fair waiter learned from hand-off messages.
#[derive(Default)]
struct News {
    /// The lock was handed to this waiter.
    handed: Option<Handoff>,
    /// This waiter watches the latest hand-off: try again once its claim would have lapsed, in
    /// case its recipient is gone.
    watch_until: Option<Instant>,
}

impl FairWaiter {
    /// The waiter of `token`, whose latest attempt stored `secret`.
    pub(crate) fn new(token: Arc<str>, secret: Option<Arc<str>>) -> Self {
        Self {
            token,
            secrets: Mutex::new(Secrets {
                latest: secret,
                earlier: None,
            }),
            news: Mutex::new(News::default()),
        }
    }

    /// From now on, a hand-off must be signed with `secret` (a new attempt stored it); one
    /// signed with the secret before is still recognised as genuine.
    pub(crate) fn expect_secret(&self, secret: Option<Arc<str>>) {
        let mut secrets = lock(&self.secrets);
        if secrets.latest != secret {
            secrets.earlier = std::mem::replace(&mut secrets.latest, secret);
        }
    }

    fn check(&self, handoff: &Handoff) -> Shown {
        let secrets = lock(&self.secrets);
        let signed = |secret: &Option<Arc<str>>| {
            secret
                .as_deref()
                .is_some_and(|secret| handoff.signed_with(secret))
        };
        if signed(&secrets.latest) {
            Shown::Latest
        } else if signed(&secrets.earlier) {
            Shown::Earlier
        } else {
            Shown::Unknown
        }
    }

    /// Takes a hand-off to this waiter, if one came.
    pub(crate) fn take_handed(&self) -> Option<Handoff> {
        lock(&self.news).handed.take()
    }

    /// When this waiter should look at the latest hand-off's claim, if it watches one.
    pub(crate) fn watch(&self) -> Option<Instant> {
        lock(&self.news).watch_until
    }

    /// Takes over a watch of a waiter that left (keeping the later of the two).
    pub(crate) fn inherit_watch(&self, until: Instant) {
        let mut news = lock(&self.news);
        news.watch_until = news.watch_until.max(Some(until));
    }

    /// Starts watching until `until`; whether this waiter watched nothing before (and so must
    /// be woken to take it into account).
    fn start_watch(&self, until: Instant) -> bool {
        lock(&self.news).watch_until.replace(until).is_none()
    }
}

/// Gives a hand-off published on `channel` to its recipient, if it waits in this process, and
/// has the claim watched by this process's oldest other fair waiter (every subscribed process
/// has one, so the claim stays watched whichever processes are gone), and by the waiter the
/// message names as next, if it waits here. A watcher tries again once the claim would have
/// lapsed; a newer hand-off replaces the one it watched. `waiters` are this process's fair
/// waiters of the key, oldest first, each with the `Notify` that wakes it.
///
/// A hand-off reaches its recipient only if it is signed with the secret of the recipient's
/// latest attempt. One signed with the attempt before is genuine but stale (made before the
/// latest attempt ran, which then finds the lock already the waiter's): its claim is watched,
/// and the recipient learns of it from that attempt. One signed with neither is forged: dropped
/// with a warning. A hand-off to a waiter of another process cannot be checked here; watchers
/// take its claim as at most [`HANDOFF_CLAIM`], so a forged one delays them by little.
pub(crate) fn deliver(channel: &str, handoff: Handoff, waiters: &[(&FairWaiter, &Notify)]) {
    let named = |name: &str| waiters.iter().find(|(w, _)| &*w.token == name);
    let mut recipient = named(&handoff.token);
    if let Some((waiter, _)) = recipient {
        match waiter.check(&handoff) {
            Shown::Latest => {}
            Shown::Earlier => recipient = None,
            Shown::Unknown => {
                tracing::warn!(
                    %channel,
                    "distlock ignored a hand-off message that its waiter's secret did not sign: \
                     it was not published by distlock's release script"
                );
                return;
            }
        }
    }
    // Some slack past the claim: the recipient's extension may be on its way.
    let claim = handoff.claim.min(HANDOFF_CLAIM);
    let until = Instant::now() + claim + claim / 4;
    let next = Some(handoff.next.as_str())
        .filter(|n| !n.is_empty())
        .and_then(named);
    let oldest = waiters.iter().find(|(w, _)| *w.token != *handoff.token);
    for (watcher, wake) in next.into_iter().chain(oldest) {
        // A watcher already sleeping until an earlier watch finds this one when it wakes; only
        // one without a watch needs waking to take it into account.
        if watcher.start_watch(until) {
            wake.notify_one();
        }
    }
    if let Some((waiter, wake)) = recipient {
        lock(&waiter.news).handed = Some(handoff);
        wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_scripts_answers_parse_a_bare_token_as_taken_and_an_array_as_queued() {
        use redis::{FromRedisValue, Value};
        let taken = FairAnswer::from_redis_value(Value::BulkString(b"1795000000123456".to_vec()));
        assert!(matches!(
            taken,
            Ok(FairAnswer::Acquired {
                fencing_token: 1_795_000_000_123_456
            })
        ));
        let queued = FairAnswer::from_redis_value(Value::Array(vec![
            Value::Int(0),
            Value::Int(2500),
            Value::Int(1_795_000_000_123),
        ]));
        assert!(matches!(
            queued,
            Ok(FairAnswer::Queued { remaining: Some(r), server_ms: 1_795_000_000_123 })
                if r == Duration::from_millis(2500)
        ));
        let no_expiry = FairAnswer::from_redis_value(Value::Array(vec![
            Value::Int(0),
            Value::Int(-1),
            Value::Int(5),
        ]));
        assert!(matches!(
            no_expiry,
            Ok(FairAnswer::Queued {
                remaining: None,
                ..
            })
        ));
        let wrong = FairAnswer::from_redis_value(Value::Array(vec![Value::Int(1), Value::Int(7)]));
        assert!(wrong.is_err());
    }

    #[test]
    fn hand_off_messages_parse_and_plain_releases_do_not() {
        let handoff = Handoff::parse(b"h 0af3 17 1795000000123 2000 9bc1 5e5e").unwrap();
        assert_eq!(
            handoff,
            Handoff {
                token: "0af3".into(),
                fencing_token: 17,
                server_ms: 1_795_000_000_123,
                claim: Duration::from_secs(2),
                next: "9bc1".into(),
                signed: "0af3 17 1795000000123 2000 9bc1".into(),
                mac: "5e5e".into(),
            }
        );
        let last_in_line = Handoff::parse(b"h a 1 2 3  5e").unwrap();
        assert_eq!((&*last_in_line.next, &*last_in_line.mac), ("", "5e"));
        assert!(Handoff::parse(b"").is_none());
        assert!(Handoff::parse(b"h a x 2 3  5e").is_none());
        assert!(Handoff::parse(b"h a 1 2 3 b c 5e").is_none());
    }

    #[test]
    fn signatures_match_redis_sha1hex() {
        // redis-cli EVAL "return redis.sha1hex('s1 w1 7 1 2000  s1')" 0
        assert_eq!(
            mac("s1", "w1 7 1 2000 "),
            "5e1b258a7c4e17ba261433113442e4cb1d3dbc04"
        );
    }

    #[test]
    fn a_hand_off_is_dated_no_later_than_redis_made_it() {
        let sent = Instant::now() - Duration::from_secs(5);
        // Redis ran the attempt at 1,000,000 ms and handed over 3,000 ms later on its clock:
        // at least 3 s less 1% drift and 1 ms resolution after the attempt was sent.
        let start = handoff_start(Some((sent, 1_000_000)), 1_003_000).unwrap();
        assert_eq!(start, sent + Duration::from_millis(3_000 - 30 - 1));
        // A hand-off dated before the attempt ran (another attempt's date) reaches back.
        let start = handoff_start(Some((sent, 1_000_000)), 999_000).unwrap();
        assert_eq!(start, sent - Duration::from_millis(1_000 + 10 + 1));
        // Never later than now, whatever Redis's clock says.
        let start = handoff_start(Some((sent, 1_000_000)), 1_000_000 + 60_000).unwrap();
        assert!(start <= Instant::now());
        assert!(handoff_start(None, 1_000_000).is_none());
    }

    #[test]
    fn only_a_hand_off_signed_with_the_latest_secret_reaches_its_waiter() {
        let waiter = FairWaiter::new("w1".into(), Some("s1".into()));
        let wake = Notify::new();
        let signed = "w1 7 1 2000 ";
        let handoff = |mac: String| Handoff::parse(format!("h {signed} {mac}").as_bytes());
        // Forged: the secret is unknown to the sender, or the signed fields were changed.
        deliver("k", handoff("0".repeat(40)).unwrap(), &[(&waiter, &wake)]);
        let altered = Handoff::parse(format!("h w1 9 1 2000  {}", mac("s1", signed)).as_bytes());
        deliver("k", altered.unwrap(), &[(&waiter, &wake)]);
        assert!(waiter.take_handed().is_none());
        waiter.expect_secret(Some("s2".into()));
        // Made before the latest attempt ran: that attempt finds the lock handed over.
        deliver(
            "k",
            handoff(mac("s1", signed)).unwrap(),
            &[(&waiter, &wake)],
        );
        assert!(waiter.take_handed().is_none());
        deliver(
            "k",
            handoff(mac("s2", signed)).unwrap(),
            &[(&waiter, &wake)],
        );
        assert_eq!(waiter.take_handed().map(|h| h.fencing_token), Some(7));
    }
}
