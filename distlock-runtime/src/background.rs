//! The bounds of a manager's background releases (see `release.rs`): how many may wait, how
//! many requests may be out at once, and their rate-limited warnings.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::telemetry::Throttle;

/// Most background releases that may wait at once per manager.
pub(crate) const MAX_PENDING: usize = 10_000;

/// Most background release requests out at once per manager.
pub(crate) const IN_FLIGHT: usize = 8;

/// What a manager's background releases share: their bounds, and their rate-limited warnings.
pub(crate) struct Background {
    pending: AtomicUsize,
    /// A permit per request out.
    pub(crate) in_flight: tokio::sync::Semaphore,
    /// Releases dropped over [`MAX_PENDING`].
    pub(crate) dropped: Mutex<Throttle>,
    /// Releases of dropped leases that failed for good.
    pub(crate) failed: Mutex<Throttle>,
}

impl Default for Background {
    fn default() -> Self {
        Self {
            pending: AtomicUsize::new(0),
            in_flight: tokio::sync::Semaphore::new(IN_FLIGHT),
            dropped: Mutex::new(Throttle::default()),
            failed: Mutex::new(Throttle::default()),
        }
    }
}

impl Background {
    /// Background releases waiting or running now.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Counts one more background release; `false` (and not counted) when [`MAX_PENDING`]
    /// wait already.
    pub(crate) fn enter(&self) -> bool {
        let counted = self.pending.fetch_add(1, Ordering::AcqRel);
        if counted >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// A background release [`enter`](Self::enter)ed has ended.
    pub(crate) fn leave(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }
}
