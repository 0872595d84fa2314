//! Durations as Redis takes them.

use std::time::Duration;

/// A duration as whole milliseconds for `PX` / `PEXPIRE` (at least 1).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
