//! Forced releases, told: the channel a forced release ([`LockManager::force_release`]) names
//! the holders it freed on, the notice's format, and [`LockManager::forced_releases`], which
//! hands the notices to a program (`distlock watch` prints them).
//!
//! One channel per key prefix, `{prefix}forced`, which no lock's own channel (its lock key,
//! `{prefix}lock:{key}`) can be. It is `PUBLISH`ed, also on a cluster (which carries it to every
//! node, so a manager hears it on whichever node it subscribed), and a quorum's every node
//! publishes it. Each message is the freed holders' owner tokens, space-separated (a token holds
//! no space: see `clean_label`), a newline, then the key as requested (which may hold anything).

use tokio::sync::mpsc;

use crate::error::LockError;
use crate::manager::LockManager;
use crate::notify::Listening;

/// The channel that forced releases of the locks under `prefix` are told on.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}forced")
}

/// A forced release's message, read.
pub(crate) struct Notice<'a> {
    /// The owner tokens of the holders it freed.
    pub(crate) tokens: Vec<&'a str>,
    /// The key, as requested.
    pub(crate) key: &'a str,
}

impl<'a> Notice<'a> {
    /// The notice `payload` carries; `None` for one of another form.
    pub(crate) fn parse(payload: &'a [u8]) -> Option<Self> {
        let text = std::str::from_utf8(payload).ok()?;
        let (tokens, key) = text.split_once('\n')?;
        Some(Self {
            tokens: tokens.split(' ').filter(|t| !t.is_empty()).collect(),
            key,
        })
    }
}

/// A forced release of a lock, as [`ForcedReleases::next`] hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// The lock's key, as requested (`order:42`).
    pub key: String,
    /// Each holder it freed (one of a key held exclusively, every reader or permit holder of
    /// one held shared or as permits; on a quorum, those the publishing node had granted), as
    /// [`LockInfo`](crate::LockInfo) names holders: its manager's
    /// [`holder_label`](crate::LockManagerBuilder::holder_label) if it set one, the first 8 hex
    /// digits of its owner token otherwise.
    pub holders: Vec<String>,
}

/// The forced releases of the locks under a manager's prefix, as they happen, from
/// [`LockManager::forced_releases`]. Dropping it stops listening.
pub struct ForcedReleases {
    received: mpsc::Receiver<ForcedRelease>,
    _listening: Listening,
}

/// How many notices wait to be taken at most; more are dropped until [`ForcedReleases::next`]
/// takes some.
const WAITING: usize = 1024;

impl ForcedReleases {
    /// The next forced release heard; `None` once the manager is gone.
    pub async fn next(&mut self) -> Option<ForcedRelease> {
        self.received.recv().await
    }
}

impl std::fmt::Debug for ForcedReleases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForcedReleases").finish_non_exhaustive()
    }
}

impl LockManager {
    /// Listens for forced releases ([`force_release`](Self::force_release), from any process)
    /// of the locks under this manager's prefix: each is handed over with the holders it freed,
    /// whose managers end their leases at once where they hear it (see `force_release`). For
    /// an audit log, or a dashboard
    /// (`distlock watch` prints them). A release forced while the subscription is being made
    /// (or remade after a lost connection) is missed. Must be called inside a Tokio runtime.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// let mut forced = locks.forced_releases()?;
    /// while let Some(release) = forced.next().await {
    ///     tracing::warn!(key = %release.key, holders = ?release.holders, "lock force-released");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a manager built on a caller's pool, which has no
    /// subscriber connection to listen on.
    pub fn forced_releases(&self) -> Result<ForcedReleases, LockError> {
        let no_subscriber = || LockError::InvalidConfig {
            what: "pool",
            reason: "a manager built on a caller's pool cannot subscribe to forced releases; \
                     build one from a URL to listen"
                .to_owned(),
        };
        let notifications = self.context().notifications.as_ref();
        let forced = notifications.ok_or_else(no_subscriber)?.forced();
        let (sender, received) = mpsc::channel(WAITING);
        let listening = forced.listen(std::sync::Arc::new(move |payload: &[u8]| {
            if let Some(notice) = Notice::parse(payload) {
                let holders = notice.tokens.iter().map(|token| holder(token)).collect();
                let key = notice.key.to_owned();
                // Full: dropped, rather than block the subscriber connection.
                let _ = sender.try_send(ForcedRelease { key, holders });
            }
        }));
        Ok(ForcedReleases {
            received,
            _listening: listening.ok_or_else(no_subscriber)?,
        })
    }
}

/// How a holder is named: its label (after the token's `:`), or its token's first 8 digits.
fn holder(token: &str) -> String {
    match token.split_once(':') {
        Some((_, label)) if !label.is_empty() => label.to_owned(),
        _ => token.chars().take(8).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_is_its_tokens_then_a_newline_then_the_key_whatever_it_holds() {
        let notice = Notice::parse(b"aa:web-1 bb\norder 42\nx").unwrap();
        assert_eq!(notice.tokens, ["aa:web-1", "bb"]);
        assert_eq!(notice.key, "order 42\nx");
        assert!(Notice::parse(b"aa bb").is_none(), "no key: not a notice");
        assert_eq!(holder("aa:web-1"), "web-1");
        assert_eq!(holder("0123456789abcdef"), "01234567");
    }
}
