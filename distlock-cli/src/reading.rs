//! One reading of a held lock, as `watch` and `top` compare and show it: the tool's own copy of
//! [`LockInfo`] (which is `#[non_exhaustive]`, so tests could not build one).

use std::time::Duration;

use distlock_runtime::{LockInfo, LockMode, Owner, ServerInfo};

/// A held lock when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lock {
    /// The lock key (`order:42`, `election:NAME`).
    pub(crate) key: String,
    /// The mode of the lease whose end comes first.
    pub(crate) mode: LockMode,
    /// How long it is held at most unless renewed (until the last holder's expiry).
    pub(crate) remaining: Duration,
    /// The last fencing token drawn for it.
    pub(crate) fencing_token: u64,
    /// How many leases hold it.
    pub(crate) holders: usize,
    /// The leases that hold it, in the order they end (the first 100).
    pub(crate) owners: Vec<Holder>,
    /// The live fair waiters, in arrival order.
    pub(crate) queued: Vec<Holder>,
    /// Handed to its fair waiter (the owner), which has not renewed it yet: `remaining` is what
    /// is left of the hand-off's claim, not of the owner's ttl ([`LockInfo::handoff_claim`]),
    /// as judged by [`judge_claim`].
    pub(crate) claim: bool,
}

/// A lease, or a queued waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) token_prefix: String,
    pub(crate) label: Option<String>,
    pub(crate) mode: LockMode,
}

impl From<&Owner> for Holder {
    fn from(owner: &Owner) -> Self {
        Self {
            token_prefix: owner.token_prefix.clone(),
            label: owner.label.clone(),
            mode: owner.mode,
        }
    }
}

impl From<&LockInfo> for Lock {
    fn from(info: &LockInfo) -> Self {
        Self {
            key: info.key.clone(),
            mode: info.mode,
            remaining: info.remaining,
            fencing_token: info.fencing_token,
            holders: info.holders,
            owners: info.owners.iter().map(Holder::from).collect(),
            queued: info.queued.iter().map(Holder::from).collect(),
            claim: info.handoff_claim,
        }
    }
}

impl Holder {
    /// `alpha (3f2a9c1d)`, or the token prefix alone without a label.
    pub(crate) fn who(&self) -> String {
        match &self.label {
            Some(label) => format!("{label} ({})", self.token_prefix),
            None => self.token_prefix.clone(),
        }
    }

    /// The label, or the token prefix without one.
    pub(crate) fn name(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.token_prefix)
    }
}

impl Lock {
    /// The election's name, for an election's key.
    pub(crate) fn election(&self) -> Option<&str> {
        self.key.strip_prefix(crate::ELECTION_KEY)
    }

    /// Whether `holder` (by its token) is among the owners.
    pub(crate) fn held_by(&self, holder: &Holder) -> bool {
        self.owners
            .iter()
            .any(|o| o.token_prefix == holder.token_prefix)
    }
}

/// What was read of a key before a reading, as [`judge_claim`] needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Before<'a> {
    /// Nothing: this is the first reading.
    Unread,
    /// Free (or not listed).
    Free,
    /// Held, as shown then (its claim judged already).
    Held(&'a Lock),
}

/// `now` with its claim kept only where it is a fair hand-off's. The runtime reads a claim from
/// the lock's expiry, which some leases match ([`LockInfo::handoff_claim`]); a hand-off always
/// gives the lock to another owner without a free moment, so a claim is believed when it comes
/// with such a change, while the same claim lasts (same owner and token), and on the first
/// reading (nothing to tell it by). A claim flag that turns on for the same owner, or on a lock
/// that was free, is a lease's.
pub(crate) fn judge_claim(before: Before<'_>, mut now: Lock) -> Lock {
    now.claim = now.claim
        && match before {
            Before::Unread => true,
            Before::Free => false,
            Before::Held(last) => {
                let handed_over = !now.owners.iter().any(|o| last.held_by(o));
                let same_claim = last.claim && last.fencing_token == now.fencing_token;
                handed_over || same_claim
            }
        };
    now
}

/// What is left of a lock as `watch` and `top` show it: `ttl 1.5s`, or `claim 1.5s` while it is
/// in a hand-off's claim (its recipient's ttl is not known yet).
pub(crate) fn left(lock: &Lock, remaining: Duration) -> String {
    let what = if lock.claim { "claim" } else { "ttl" };
    format!("{what} {}", secs(remaining))
}

/// `1.5s`, as `watch` and `top` show a ttl; `no expiry` for a key without one.
pub(crate) fn secs(duration: Duration) -> String {
    if duration == Duration::MAX {
        return "no expiry".to_owned();
    }
    format!("{:.1}s", duration.as_secs_f64())
}

/// Holders or waiters, in order: `alpha (01386969), beta (161ea176)`.
pub(crate) fn names(holders: &[Holder]) -> String {
    let names: Vec<String> = holders.iter().map(Holder::who).collect();
    names.join(", ")
}

/// `exclusive`, `shared` or `permits`, as JSON names a mode.
pub(crate) fn mode_name(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Exclusive => "exclusive",
        LockMode::Shared => "shared",
        LockMode::Permits(_) => "permits",
    }
}

/// The servers that hold the locks, in a few words: `Valkey 8.1.8 at 10.0.0.5:6379` for one,
/// `Redis 8.2.3 on 3 servers` for several of one version, each version's count when they differ
/// (a cluster being upgraded).
pub(crate) fn servers(servers: &[ServerInfo]) -> String {
    let described: Vec<(String, &str)> = servers
        .iter()
        .map(|server| {
            let version = format!("{} {}", server.product, server.version);
            (version, server.address.as_str())
        })
        .collect();
    summary(&described)
}

/// [`servers`] of each server's `(software and version, address)`.
fn summary(servers: &[(String, &str)]) -> String {
    if let [(version, address)] = servers {
        return format!("{version} at {address}");
    }
    let mut versions: Vec<(&str, usize)> = Vec::new();
    for (version, _) in servers {
        match versions.iter_mut().find(|(known, _)| known == version) {
            Some((_, count)) => *count += 1,
            None => versions.push((version, 1)),
        }
    }
    versions
        .iter()
        .map(|(version, count)| match count {
            1 => format!("{version} on 1 server"),
            n => format!("{version} on {n} servers"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A reading for tests: `owners` and `queued` as `prefix:label` (or a bare prefix).
#[cfg(test)]
pub(crate) fn lock(key: &str, mode: LockMode, owners: &[&str], token: u64) -> Lock {
    let holder = |text: &&str| {
        let (prefix, label) = match text.split_once(':') {
            Some((prefix, label)) => (prefix, Some(label.to_owned())),
            None => (*text, None),
        };
        Holder {
            token_prefix: prefix.to_owned(),
            label,
            mode,
        }
    };
    Lock {
        key: key.to_owned(),
        mode,
        remaining: Duration::from_secs(10),
        fencing_token: token,
        holders: owners.len(),
        owners: owners.iter().map(holder).collect(),
        queued: Vec::new(),
        claim: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `key` held by `owner` with fencing token `token`, read as a claim when `claim`.
    fn read(owner: &str, token: u64, claim: bool) -> Lock {
        let mut read = lock("order:42", LockMode::Exclusive, &[owner], token);
        read.claim = claim;
        read
    }

    #[test]
    fn a_claim_is_believed_only_with_a_new_owner_while_held_or_at_the_first_reading() {
        let alpha = read("aaaa1111:alpha", 7, false);
        let judged = |before, now: Lock| judge_claim(before, now).claim;
        // Handed to beta without a free moment: its claim.
        let beta = judge_claim(Before::Held(&alpha), read("bbbb2222:beta", 8, true));
        assert!(beta.claim);
        // The same claim read again, then extended: a lease.
        assert!(judged(Before::Held(&beta), read("bbbb2222:beta", 8, true)));
        assert!(!judged(
            Before::Held(&beta),
            read("bbbb2222:beta", 8, false)
        ));
        // Alpha's own lease whose expiry matches a claim (a 2 s ttl, a 1.5 s ttl just renewed,
        // hold_at_least of 2 s): a lease.
        assert!(!judged(
            Before::Held(&alpha),
            read("aaaa1111:alpha", 7, true)
        ));
        // Taken from free: a lease (a hand-off never frees the key).
        assert!(!judged(Before::Free, read("bbbb2222:beta", 8, true)));
        // Nothing to tell it by: as read.
        assert!(judged(Before::Unread, read("bbbb2222:beta", 8, true)));
        // A lease stays a lease whatever came before.
        assert!(!judged(Before::Unread, read("bbbb2222:beta", 8, false)));
        assert!(!judged(
            Before::Held(&alpha),
            read("bbbb2222:beta", 8, false)
        ));
    }

    #[test]
    fn servers_are_summed_up_by_version() {
        let server = |version: &str, address: &'static str| (version.to_owned(), address);
        assert_eq!(
            summary(&[server("Valkey 8.1.8", "10.0.0.5:6379")]),
            "Valkey 8.1.8 at 10.0.0.5:6379"
        );
        let cluster = [
            server("Redis 8.2.3", "a:1"),
            server("Redis 8.2.3", "b:1"),
            server("Redis 8.2.3", "c:1"),
        ];
        assert_eq!(summary(&cluster), "Redis 8.2.3 on 3 servers");
        let upgrading = [
            server("Redis 7.0.15", "a:1"),
            server("Redis 8.2.3", "b:1"),
            server("Redis 7.0.15", "c:1"),
        ];
        assert_eq!(
            summary(&upgrading),
            "Redis 7.0.15 on 2 servers, Redis 8.2.3 on 1 server"
        );
    }
}
