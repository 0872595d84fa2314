//! The operator's view of locks: who holds one and for how long ([`LockManager::inspect`]),
//! which are held ([`LockManager::held_locks`]), and breaking one by hand
//! ([`LockManager::force_release`]).
//!
//! A holder's label ([`LockManagerBuilder::holder_label`](crate::LockManagerBuilder::holder_label))
//! travels inside its owner token (`<128 random bits in hex>:<label>`), so every script that
//! compares tokens compares it too, and no key is added per lock.

use std::sync::LazyLock;
use std::time::Duration;

use crate::call::{Confirm, ScriptCall};
use crate::error::LockError;
use crate::keys::LockKeys;
use crate::manager::LockManager;
use crate::mode::LockMode;
use crate::scripts::{lua, lua_spliced};
use crate::scripts::{Inspected, Lua};

/// Who holds a lock and for how long, from [`LockManager::inspect`].
///
/// ```no_run
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// if let Some(info) = locks.inspect("order:42").await? {
///     let holder = info.holder.as_deref().unwrap_or(&info.token_prefix);
///     println!("{} held by {holder} for {:?} more", info.key, info.remaining);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock's key, as requested (`order:42`).
    pub key: String,
    /// How long the lock is held for at most (its expiry in Redis, unless renewed).
    pub remaining: Duration,
    /// The last fencing token drawn for the key: the holder's (or, after a hand-off that its
    /// recipient has not yet confirmed, the hand-off's). Of a key held shared or as permits,
    /// that of the latest lease granted, which may have left since: every holder's token is at
    /// most this one.
    pub fencing_token: u64,
    /// Fair waiters queued for the key: the queue's entries, which may still count one whose
    /// wait has passed (dropped by the next script that serves the queue); [`queued`](Self::queued)
    /// lists the live ones in order.
    pub waiters: usize,
    /// The first 8 hex digits of the holder's owner token: enough to tell holders apart in
    /// logs, not enough to release the lock. Of a key held shared or as permits, that of the
    /// holder whose lease ends first.
    pub token_prefix: String,
    /// The holder's label, if its manager set one
    /// ([`LockManagerBuilder::holder_label`](crate::LockManagerBuilder::holder_label)); of a key
    /// held shared or as permits, that of the holder whose lease ends first.
    pub holder: Option<String>,
    /// How the key is held: exclusively, shared by readers, or as permits of a semaphore (with
    /// the `n` of the holder whose lease ends first).
    pub mode: LockMode,
    /// How many leases hold it: 1 when exclusive.
    pub holders: usize,
    /// Every holder's label, where its manager set one, in the order their leases end (the
    /// first 100 holders').
    pub holder_labels: Vec<String>,
    /// Every lease that holds it, in the order the leases end (the first 100): one when held
    /// exclusively.
    pub owners: Vec<Owner>,
    /// The fair waiters queued for it, in arrival order: who is served next, and after whom
    /// (the live ones among the queue's first 100 entries; unfair waiters do not queue).
    pub queued: Vec<Owner>,
    /// Whether the lock reads as in a fair hand-off's claim: a release handed it to the fair
    /// waiter shown as its holder, which has not renewed it yet. That recipient holds the lock
    /// and runs its body from the hand-off on; [`remaining`](Self::remaining) is what is left of
    /// the claim ([`HANDOFF_CLAIM`](crate::HANDOFF_CLAIM)), not of its ttl. Its first renewal, a
    /// third of the claim in, extends the lock to its ttl; a body done sooner releases it
    /// without one, and a recipient gone or paused lets the claim expire (`docs/fair.md`,
    /// "Claim"). A claim shorter than `HANDOFF_CLAIM` (a recipient whose ttl is shorter) is its
    /// whole ttl, and reads as a lease.
    ///
    /// Read from the lock's expiry, which a hand-off sets to `HANDOFF_CLAIM` after the moment
    /// it draws its fencing token, and from the key's mark. So it is also `true` for a lease
    /// that is no claim, whenever its expiry is exactly 2 s (within 2 ms) after its own fencing
    /// token was drawn while its key is marked, which any waiting attempt does (fair or not):
    /// - a 2 s ttl, from its acquire until its first renewal (all its life without renewal);
    /// - a 1.5 s ttl right after its first renewal (renewals come a third of the ttl apart:
    ///   likewise any ttl with `ttl * (1 + k / 3)` = 2 s, after its k-th);
    /// - `hold_at_least` of 2 s, once its body has ended.
    ///
    /// Such a lease keeps its owner, where a hand-off gives the lock to another owner with no
    /// free moment between: `distlock watch` and `top` show a claim only then
    /// (`docs/operations.md`). Always `false` on a quorum (it refuses fair requests) and of a
    /// key held shared or as permits.
    pub handoff_claim: bool,
}

/// One lease holding a lock, or one fair waiter queued for it, as [`LockInfo`] shows it.
///
/// ```no_run
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// if let Some(info) = locks.inspect("order:42").await? {
///     for (place, waiter) in info.queued.iter().enumerate() {
///         let who = waiter.label.as_deref().unwrap_or(&waiter.token_prefix);
///         println!("{}. {who} waits to hold it {}", place + 1, waiter.mode);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Owner {
    /// The first 8 hex digits of its owner token (see [`LockInfo::token_prefix`]).
    pub token_prefix: String,
    /// Its manager's holder label, if set.
    pub label: Option<String>,
    /// The mode it holds, or waits to hold, the key in.
    pub mode: LockMode,
}

impl Owner {
    /// The owner of `token` (`<random hex>:<label>`) in `mode`.
    fn of(token: &str, mode: LockMode) -> Self {
        let mut parts = token.splitn(2, ':');
        Self {
            token_prefix: parts.next().unwrap_or_default().chars().take(8).collect(),
            label: parts.next().map(str::to_owned),
            mode,
        }
    }
}

/// Reads a lock without changing it: `scripts/inspect.lua`.
pub(crate) static INSPECT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua!(
        "#!lua flags=no-writes";
        "scripts/shared.lua", "scripts/mark.lua", "fair/entry.lua", "scripts/inspect.lua"
    ))
});

/// Deletes a lock whoever holds it, as a release would: `scripts/force_release.lua`.
//
// `allow-oom`, as the release (see `scripts/mod.rs`).
pub(crate) static FORCE_RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(lua_spliced!(
        "#!lua flags=allow-oom";
        "scripts/shared.lua", "scripts/force_release.lua" at "--[[ queue functions ]]";
        crate::scripts::queue_functions!()
    ))
});

/// A label made fit for a token: no spaces or control characters (hand-off messages are
/// space-separated), at most 64 bytes.
pub(crate) fn clean_label(label: &str) -> String {
    let mut clean = label.replace(|c: char| c.is_whitespace() || c.is_control(), "_");
    while clean.len() > 64 {
        clean.pop();
    }
    clean
}

impl LockManager {
    /// Who holds the lock on `key`, and for how long; `None` when it is free. Reads only. On a
    /// quorum, the holders a majority of nodes list (a lease holds only there), for as long as
    /// a majority still hold them.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// match locks.inspect("order:42").await? {
    ///     Some(info) => println!(
    ///         "held by {} for {:?} more, token {}, {} waiting",
    ///         info.holder.as_deref().unwrap_or(&info.token_prefix),
    ///         info.remaining,
    ///         info.fencing_token,
    ///         info.waiters
    ///     ),
    ///     None => println!("free"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis cannot be asked;
    /// [`LockError::InvalidKey`] for an empty key.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let keys = lock_keys(self, key)?;
        let mut call = ScriptCall::new("inspect", &INSPECT, Confirm::No, 5);
        call.key(keys.lock())
            .key(keys.fence())
            .key(keys.waiters())
            .key(keys.holders())
            .key(keys.queue());
        call.arg(crate::time::millis(crate::HANDOFF_CLAIM));
        let answer = self.context().redis().inspect(&call).await?;
        answer.map(|answer| info(key, answer)).transpose()
    }

    /// Frees the lock on `key` whoever holds it, in whatever mode (every reader or permit holder
    /// of a shared key or a semaphore); `true` if it was held. Its fair waiters are then served
    /// in order, as on a release.
    ///
    /// **Dangerous.** This breaks the current holder's exclusion, so the holder is told: each
    /// holder's manager (every holder's, of a shared key or a semaphore; an election's leader's)
    /// hears of it on the channel `{prefix}forced`, and ends the lease at once, within
    /// milliseconds of this call's return: its [`Lease::lost`](crate::Lease::lost) resolves, its
    /// `run` (or annotated call) stops the body at its next await point and returns
    /// [`LockError::LeaseLost`], and its renewal stops. A holder whose manager cannot hear it
    /// (an ACL user without channel rights, a manager built on a caller's pool, a subscriber
    /// connection down at that moment) learns at its next renewal, a third of its ttl at most
    /// (a lease without renewal, never: it runs to its ttl). A body that does not await keeps
    /// running until it does, so only storage that checks fencing tokens turns its late writes
    /// away. Use it for a lock whose holder is known to be gone or stuck (a ttl set far too
    /// long, a job to stop).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// if locks.force_release("nightly-report").await? {
    ///     println!("released a lock held by someone else");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when Redis cannot be asked;
    /// [`LockError::InvalidKey`] for an empty key.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let keys = lock_keys(self, key)?;
        let redis = self.context().redis();
        let mut call = ScriptCall::new("force release", &FORCE_RELEASE, Confirm::No, 5);
        call.key(keys.lock())
            .key(keys.queue())
            .key(keys.waiters())
            .key(keys.fence())
            .key(keys.holders());
        call.arg(redis.announce().0)
            .arg(crate::forced::channel(self.prefix()))
            .arg(key);
        let released = redis.force_release(&call).await?;
        Ok(released > 0)
    }

    /// The locks held now whose key matches the glob `pattern` (`*` for all, `order:*`), with
    /// what [`inspect`](Self::inspect) tells of each, sorted by key. Found with `SCAN` (never
    /// `KEYS`) on every server that holds locks: the primary, each cluster primary, each quorum
    /// node (a quorum lists a key a majority of its nodes hold).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// for info in locks.held_locks("order:*").await? {
    ///     println!("{} for {:?}", info.key, info.remaining);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Redis`] / [`LockError::RedisTimeout`] when a server cannot be asked.
    pub async fn held_locks(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        // A key held exclusively has a lock key; one held shared or as permits, holders.
        let mut names = Vec::new();
        for kind in ["lock:", "holders:"] {
            let prefix = format!("{}{kind}", self.prefix());
            let glob = format!("{}{{{}}}", glob_escape(&prefix), pattern);
            let found = self.context().redis().scan(&glob).await?;
            names.extend(found.iter().filter_map(|name| {
                let braced = name.strip_prefix(&prefix)?.strip_prefix('{')?;
                braced.strip_suffix('}').map(str::to_owned)
            }));
        }
        // By the key, as documented (`order:1` before `order:10`), each once (a quorum's
        // nodes list a key each).
        names.sort_unstable();
        names.dedup();
        let mut held = Vec::with_capacity(names.len());
        for key in &names {
            held.extend(self.inspect(key).await?);
        }
        Ok(held)
    }
}

/// The Redis keys of the lock on `key`, an operator's argument: refused when empty.
fn lock_keys(manager: &LockManager, key: &str) -> Result<LockKeys, LockError> {
    if key.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "the key is empty",
        });
    }
    Ok(manager.context().lock_keys(key))
}

/// `text` with glob specials escaped, for `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let escape = |c| matches!(c, '*' | '?' | '[' | ']' | '\\').then_some('\\');
    text.chars()
        .flat_map(|c| escape(c).into_iter().chain([c]))
        .collect()
}

/// What `inspect` tells of the lock on `key`, from the inspect script's answer.
fn info(key: &str, answer: Inspected) -> Result<LockInfo, LockError> {
    let bad = |what: &str| LockError::Redis {
        op: "inspect",
        source: redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected inspect answer",
            what.to_owned(),
        )),
    };
    let mut queued = Vec::with_capacity(answer.queue.len() / 2);
    for pair in answer.queue.chunks(2) {
        let [token, word] = pair else {
            return Err(bad("a queued token without its mode"));
        };
        let mode = LockMode::from_word(word).ok_or_else(|| bad("a waiter of unknown mode"))?;
        queued.push(Owner::of(token, mode));
    }
    // A member is a token (shared), or `N token` (one of N permits): see scripts/holders.lua.
    let mut owners = Vec::with_capacity(answer.members.len());
    for member in &answer.members {
        let (mode, token) = match (answer.kind.as_str(), member.split_once(' ')) {
            ("x" | "h", _) => (Some(LockMode::Exclusive), member.as_str()),
            ("s", None) => (Some(LockMode::Shared), member.as_str()),
            ("s", Some((n, token))) => (LockMode::from_word(n), token),
            _ => return Err(bad("an unknown kind of holding")),
        };
        let mode = mode.ok_or_else(|| bad("a member of unknown mode"))?;
        owners.push(Owner::of(token, mode));
    }
    let Some(first) = owners.first() else {
        return Err(bad("a holding without holders"));
    };
    Ok(LockInfo {
        key: key.to_owned(),
        remaining: u64::try_from(answer.pttl)
            .map(Duration::from_millis)
            .unwrap_or(Duration::MAX),
        fencing_token: answer.counter.parse().unwrap_or(0),
        waiters: usize::try_from(answer.waiters).unwrap_or(0),
        token_prefix: first.token_prefix.clone(),
        holder: first.label.clone(),
        mode: first.mode,
        holders: usize::try_from(answer.holders).unwrap_or(0),
        holder_labels: owners.iter().filter_map(|o| o.label.clone()).collect(),
        owners,
        queued,
        handoff_claim: answer.kind == "h",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_cleaned_and_split_back() {
        assert_eq!(clean_label("web-1 pid 42\n"), "web-1_pid_42_");
        assert_eq!(clean_label(&"x".repeat(100)).len(), 64);
        let token = format!("{}:{}", "0af3".repeat(8), clean_label("host:9"));
        let owner = Owner::of(&token, LockMode::Shared);
        assert_eq!(owner.token_prefix, "0af30af3");
        assert_eq!(owner.label.as_deref(), Some("host:9"));
        assert_eq!(Owner::of("0af3", LockMode::Shared).label, None);
        assert_eq!(glob_escape("a*b[c]"), "a\\*b\\[c\\]");
    }
}
