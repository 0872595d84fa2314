//! The task-local record of the leases a task holds through `run`, for re-entrancy and
//! [`current_lease`].
//!
//! Every `run` body is polled inside a frame naming the lease it runs under; frames link to the
//! frame of the enclosing `run`. A nested `run` on the same task and the same manager (or a clone
//! of it) consults the chain: keys already held are not requested again. The record follows the
//! task, not the thread: a future moved to `tokio::spawn` starts with an empty record.

use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static HELD: Arc<Frame>;
}

/// One `run` on the current task.
pub(crate) struct Frame {
    pub(crate) manager_id: u64,
    pub(crate) keys: Arc<[String]>,
    pub(crate) fencing_token: u64,
    parent: Option<Arc<Frame>>,
}

impl Frame {
    fn chain(self: &Arc<Self>) -> impl Iterator<Item = &Frame> {
        std::iter::successors(Some(&**self), |frame| frame.parent.as_deref())
    }
}

/// The innermost frame of the current task, if it is inside a `run`.
fn innermost() -> Option<Arc<Frame>> {
    HELD.try_with(Arc::clone).ok()
}

/// Of `keys` (sorted), those this task does not already hold through `manager_id`.
pub(crate) fn not_held(manager_id: u64, keys: &[String]) -> Vec<String> {
    let Some(frame) = innermost() else {
        return keys.to_vec();
    };
    keys.iter()
        .filter(|key| {
            !frame
                .chain()
                .any(|f| f.manager_id == manager_id && f.keys.contains(key))
        })
        .cloned()
        .collect()
}

/// Runs `body` with a new innermost frame for a lease on `keys`.
pub(crate) async fn scope<F: Future>(
    manager_id: u64,
    keys: Arc<[String]>,
    fencing_token: u64,
    body: F,
) -> F::Output {
    let frame = Arc::new(Frame {
        manager_id,
        keys,
        fencing_token,
        parent: innermost(),
    });
    HELD.scope(frame, body).await
}

/// The lease the current task's innermost [`run`](crate::LockRequest::run) body holds.
///
/// Returned by [`current_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLease {
    keys: Arc<[String]>,
    fencing_token: u64,
}

impl CurrentLease {
    /// The keys of the lease (without the manager's prefix).
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The lease's fencing token.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }
}

/// Inside a locked body: the innermost lease this task runs under, with its keys and fencing
/// token. `None` outside any [`run`](crate::LockRequest::run) body (and in tasks spawned from
/// one, which do not inherit the record).
///
/// A nested `run` whose keys were all held already runs under the outer lease, so inside it this
/// returns the outer lease. Use [`current_fencing_token`] for the token covering one key.
///
/// ```no_run
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// locks.lock("report:daily").run(async {
///     let lease = distlock_runtime::current_lease().expect("inside a locked body");
///     println!("writing with fencing token {}", lease.fencing_token());
/// }).await?;
/// # Ok(()) }
/// ```
pub fn current_lease() -> Option<CurrentLease> {
    innermost().map(|frame| CurrentLease {
        keys: Arc::clone(&frame.keys),
        fencing_token: frame.fencing_token,
    })
}

/// Inside a locked body: the fencing token of the innermost lease of this task that holds `key`
/// (the key as given to the lock, without the manager's prefix), or `None` if no lease of this
/// task holds it.
pub fn current_fencing_token(key: &str) -> Option<u64> {
    let frame = innermost()?;
    let token = frame
        .chain()
        .find(|f| f.keys.iter().any(|k| k == key))
        .map(|f| f.fencing_token);
    token
}
