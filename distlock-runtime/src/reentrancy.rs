//! The task-local record of the leases a task holds through `run`, for re-entrancy and
//! [`current_lease`].
//!
//! Every `run` body is polled inside a frame naming the keys it holds; frames link to the frame
//! of the enclosing `run`. A nested `run` on the same task and the same manager (or a clone of
//! it) consults the chain: keys already held are not requested again. The record follows the
//! task, not the thread: a future moved to `tokio::spawn` starts with an empty record.
//!
//! Re-entry is for strict nesting only. Futures polled side by side on one task (`join!`,
//! `select!`, `FuturesUnordered`) all see the same enclosing frame, and each would otherwise
//! re-enter it at once: two critical sections on one key at the same time. So a re-entering
//! call *borrows* each held key from the nearest frame that holds it, for as long as its body
//! runs, and runs that body in a frame of its own that now holds the key. A sibling asking for
//! a key that is lent out waits until it comes back (up to its `wait`, like any waiter), while a
//! call nested inside the borrower finds the borrower's frame first and re-enters at once.
//! Borrowing every held key of a request happens in one step, and a request that also needs
//! keys nobody on the task holds takes those from Redis first, so it never keeps a loan while
//! it waits on Redis. Like any nested locking, a body that holds a key and then asks for one in
//! another order can still wait on a sibling that does the opposite; the wait ends at its
//! `wait`.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::context::Context;
use crate::error::LockError;
use crate::mode::{KeyModes, LockMode};
use crate::order::{Class, Classes, Site};
use crate::sync::lock;
use crate::wait::Wait;

tokio::task_local! {
    static HELD: Arc<Frame>;
}

/// One `run` body on the current task: the keys it holds, and the frame it runs inside.
struct Frame {
    /// Unique per frame, to name it in the record of loans.
    id: u64,
    manager_id: u64,
    keys: Arc<[String]>,
    /// The mode each key is held in (of the lease that holds it, for a borrowed key).
    modes: Arc<[LockMode]>,
    /// The fencing token of the lease this frame took; `None` for a re-entry, whose keys are
    /// held by frames above it.
    fencing_token: Option<u64>,
    parent: Option<Arc<Frame>>,
    /// Shared by every frame of the task's chain.
    loans: Arc<Loans>,
    /// The keys' classes, for the lock order check.
    named: Named,
}

/// The lock order check's class of each key of a request or frame (see `order.rs`), and where
/// it was asked for.
#[derive(Debug, Clone)]
pub(crate) struct Named {
    pub(crate) classes: Classes,
    pub(crate) site: Site,
}

impl Named {
    /// The class of `keys[at]`.
    fn class<'a>(&'a self, keys: &'a [String], at: usize) -> Class<'a> {
        Class {
            name: self
                .classes
                .as_ref()
                .map_or(&keys[at], |classes| classes[at]),
            key: &keys[at],
            site: self.site,
        }
    }

    /// The classes of the keys at the positions `at`, in that order.
    fn pick(&self, at: &[usize]) -> Self {
        let classes = self.classes.as_ref();
        Self {
            classes: classes.map(|classes| at.iter().map(|&i| classes[i]).collect()),
            site: self.site,
        }
    }
}

impl Frame {
    fn chain(self: &Arc<Self>) -> impl Iterator<Item = &Frame> {
        std::iter::successors(Some(&**self), |frame| frame.parent.as_deref())
    }

    /// The nearest frame of the chain that holds `key` through `manager_id`.
    fn holder(self: &Arc<Self>, manager_id: u64, key: &str) -> Option<(&Frame, LockMode)> {
        self.chain().find_map(|f| {
            let at = f.keys.iter().position(|k| k == key)?;
            (f.manager_id == manager_id).then(|| (f, f.modes[at]))
        })
    }
}

/// Which keys of which frames are lent to a re-entering call whose body is running.
#[derive(Default)]
struct Loans {
    /// (frame id, key) pairs.
    lent: Mutex<Vec<(u64, String)>>,
    returned: Notify,
}

/// The innermost frame of the current task, if it is inside a `run`.
fn innermost() -> Option<Arc<Frame>> {
    HELD.try_with(Arc::clone).ok()
}

/// What a `run` found when it looked for its keys on the current task: the keys enclosing
/// bodies hold (to borrow) and the keys it must acquire. Becomes an [`Entry`] once borrowed.
pub(crate) struct Found {
    manager_id: u64,
    parent: Option<Arc<Frame>>,
    /// (holding frame's id, key) of each held key.
    wanted: Vec<(u64, String)>,
    /// The mode each wanted key is held in.
    held_modes: Vec<LockMode>,
    /// The keys no enclosing body holds: they need a lease of their own, taken before the held
    /// keys are borrowed, so that no loan is kept while waiting on Redis (a sibling using a
    /// held key could be waiting for a key of this request's lease).
    pub(crate) missing: KeyModes,
    /// The classes of the held keys and of the missing ones.
    held_named: Named,
    missing_named: Named,
}

/// A `run`'s place on the current task: the frame its body runs in, and the held keys it
/// borrowed (`taken` out of `loans`, if any), given back when it is dropped.
pub(crate) struct Entry {
    frame: Option<Arc<Frame>>,
    loans: Option<Arc<Loans>>,
    taken: Vec<(u64, String)>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(loans) = &self.loans {
            lock(&loans.lent).retain(|pair| !self.taken.contains(pair));
            loans.returned.notify_waiters();
        }
    }
}

/// Checks the lock order of a request for `keys` (classes `named`) that no enclosing body holds,
/// made through `context` on the current task, against the keys that enclosing bodies hold
/// through it: see `order.rs`. (Not for a try-lock, which never waits, so never deadlocks: its
/// caller does not call this.)
///
/// # Errors
/// [`LockError::LockOrderInversion`] under [`LockOrder::Fail`](crate::LockOrder::Fail).
pub(crate) fn check_order(
    context: &Context,
    keys: &[String],
    named: &Named,
) -> Result<(), LockError> {
    let Some(innermost) = innermost().filter(|_| context.orders.on()) else {
        return Ok(());
    };
    // The frames that took a lease: a re-entry's frame only borrows keys one of them holds.
    let held: Vec<Class<'_>> = innermost
        .chain()
        .filter(|frame| frame.manager_id == context.id && frame.fencing_token.is_some())
        .flat_map(|frame| (0..frame.keys.len()).map(|at| frame.named.class(&frame.keys, at)))
        .collect();
    let wanted: Vec<Class<'_>> = (0..keys.len()).map(|at| named.class(keys, at)).collect();
    context.orders.check(&held, &wanted)
}

/// The first of `keys` that an enclosing `run` body on the current task holds through
/// `manager_id`, if any: what a plain acquire, which cannot re-enter, refuses.
pub(crate) fn first_held(manager_id: u64, keys: &[String]) -> Option<&str> {
    let innermost = innermost()?;
    keys.iter()
        .find(|key| innermost.holder(manager_id, key).is_some())
        .map(String::as_str)
}

/// Looks up `keys` (sorted, each asked in its mode of `modes`, of classes `named`) for a `run`
/// through `context` on the current task: which an enclosing body holds, which are missing.
/// A request that `waits` (not a try-lock) for missing keys has its lock order checked.
///
/// # Errors
/// [`LockError::UpgradeNotSupported`] for a key held in a mode that does not cover the one
/// asked (an exclusive call inside a shared or permit hold): waiting for it would deadlock two
/// readers that both asked. [`LockError::LockOrderInversion`] (see [`check_order`]).
pub(crate) fn find(
    context: &Context,
    keys: &[String],
    modes: &[LockMode],
    named: &Named,
    waits: bool,
) -> Result<Found, LockError> {
    let (manager_id, parent) = (context.id, innermost());
    let Some(enclosing) = &parent else {
        // Outside any body: every key is missing, and no order is taken.
        return Ok(Found {
            manager_id,
            parent: None,
            wanted: Vec::new(),
            held_modes: Vec::new(),
            held_named: Named {
                classes: None,
                site: named.site,
            },
            missing: (keys.into(), modes.into()),
            missing_named: named.clone(),
        });
    };
    let (mut wanted, mut held_modes, mut held_at) = (Vec::new(), Vec::new(), Vec::new());
    let (mut missing, mut missing_modes, mut missing_at) = (Vec::new(), Vec::new(), Vec::new());
    for (at, (key, &mode)) in keys.iter().zip(modes).enumerate() {
        match enclosing.holder(manager_id, key) {
            Some((_, held)) if !held.covers(mode) => {
                return Err(LockError::UpgradeNotSupported { key: key.clone() });
            }
            Some((frame, held)) => {
                wanted.push((frame.id, key.clone()));
                held_modes.push(held);
                held_at.push(at);
            }
            None => {
                missing.push(key.clone());
                missing_modes.push(mode);
                missing_at.push(at);
            }
        }
    }
    let missing_named = named.pick(&missing_at);
    if waits && !missing.is_empty() {
        check_order(context, &missing, &missing_named)?;
    }
    Ok(Found {
        manager_id,
        parent,
        wanted,
        held_modes,
        held_named: named.pick(&held_at),
        missing: (missing.into(), missing_modes.into()),
        missing_named,
    })
}

impl Found {
    /// Borrows the held keys, all at once, waiting within `wait` (not at all for a try-lock)
    /// while a sibling uses one; the body then runs holding them and, given its
    /// `fencing_token`, the new lease on the missing keys.
    ///
    /// # Errors
    /// [`LockError::NotAcquired`] (zero wait) or [`LockError::Timeout`] when a sibling still
    /// uses a held key.
    pub(crate) async fn borrow(
        self,
        wait: Wait,
        fencing_token: Option<u64>,
    ) -> Result<Entry, LockError> {
        let held = self.parent.as_ref().filter(|_| !self.wanted.is_empty());
        let loans = held.map(|parent| Arc::clone(&parent.loans));
        let deadline = wait.deadline();
        // Until every held key is taken, waiting while a sibling uses one.
        while let Some(loans) = &loans {
            let returned = loans.returned.notified();
            tokio::pin!(returned);
            // Registered before looking, so a return right after the look is not missed.
            returned.as_mut().enable();
            let busy = {
                let mut lent = lock(&loans.lent);
                match self.wanted.iter().find(|pair| lent.contains(pair)) {
                    Some((_, key)) => key.clone(),
                    None => {
                        lent.extend(self.wanted.iter().cloned());
                        break;
                    }
                }
            };
            if wait.is_try() {
                return Err(LockError::NotAcquired { key: busy });
            }
            if tokio::time::timeout_at(deadline, returned).await.is_err() {
                return Err(LockError::Timeout {
                    key: busy,
                    waited: wait.started.elapsed(),
                });
            }
        }
        Ok(Entry {
            taken: self.wanted.clone(),
            loans,
            frame: self.frame(fencing_token),
        })
    }

    /// The frame a body runs in: one holding the borrowed keys and, given its `fencing_token`,
    /// one holding the new lease's keys, below the enclosing frames.
    fn frame(self, fencing_token: Option<u64>) -> Option<Arc<Frame>> {
        let loans = self
            .parent
            .as_ref()
            .map_or_else(Arc::default, |p| Arc::clone(&p.loans));
        let borrowed = (!self.wanted.is_empty()).then(|| {
            let keys = self.wanted.into_iter().map(|(_, key)| key).collect();
            (keys, self.held_modes.into(), None, self.held_named)
        });
        let (keys, modes) = self.missing;
        let lease = fencing_token.map(|token| (keys, modes, Some(token), self.missing_named));
        let mut frame = self.parent;
        for (keys, modes, fencing_token, named) in [borrowed, lease].into_iter().flatten() {
            frame = Some(Arc::new(Frame {
                id: crate::ids::next_id(),
                manager_id: self.manager_id,
                keys,
                modes,
                fencing_token,
                parent: frame,
                loans: Arc::clone(&loans),
                named,
            }));
        }
        frame
    }
}

impl Entry {
    /// Runs `body` in its frame; the borrowed keys go back when the body ends or is dropped.
    pub(crate) async fn scope<F: Future>(mut self, body: F) -> F::Output {
        match self.frame.take() {
            Some(frame) => HELD.scope(frame, body).await,
            None => body.await,
        }
    }
}

/// The lease the current task's innermost [`run`](crate::LockRequest::run) body holds.
///
/// Returned by [`current_lease`].
///
/// ```no_run
/// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
/// locks.lock("order:42").run(async {
///     if let Some(lease) = distlock_runtime::current_lease() {
///         println!("{:?} under fencing token {}", lease.keys(), lease.fencing_token());
///     }
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLease {
    keys: Arc<[String]>,
    fencing_token: u64,
}

impl CurrentLease {
    /// The keys of the lease (without the manager's prefix).
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// locks.lock_all(["wallet:7", "stock:sku-1"]).run(async {
    ///     let lease = distlock_runtime::current_lease().expect("inside a locked body");
    ///     assert_eq!(lease.keys(), ["stock:sku-1", "wallet:7"]);
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The lease's fencing token.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_runtime::LockManager) -> Result<(), distlock_runtime::LockError> {
    /// locks.lock("account:7").run(async {
    ///     let token = distlock_runtime::current_lease().map(|lease| lease.fencing_token());
    ///     // pass `token` with every write to the account's storage
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }
}

/// Inside a locked body: the lease its keys are held under, with its keys and fencing token.
/// `None` outside any [`run`](crate::LockRequest::run) body (and in tasks spawned from one,
/// which do not inherit the record).
///
/// In an annotated fn, `lease = NAME` in the attribute binds the same value to `NAME` for the
/// body (see [`distributed_lock`](crate::distributed_lock)), with no `Option` to unwrap.
///
/// The lease's token fences the keys in [`keys`](CurrentLease::keys), which are all of the
/// body's keys unless the body re-entered keys held further out. A nested `run` whose keys were
/// all held already runs under the enclosing leases that hold them: this returns the nearest
/// that holds one of its keys (not a lease taken in between for other keys). A nested `run` that
/// took a lease for some keys and re-entered others returns its new lease, whose keys are the
/// ones it took. In both cases, [`current_fencing_token`] gives the token that fences each key.
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
    let innermost = innermost()?;
    // The innermost body's own lease; for a body that only re-entered (its frame holds no
    // lease), the nearest enclosing lease that holds one of its keys.
    let holder = innermost.chain().find(|frame| {
        frame.fencing_token.is_some()
            && frame.manager_id == innermost.manager_id
            && (std::ptr::eq(*frame, &*innermost)
                || frame.keys.iter().any(|key| innermost.keys.contains(key)))
    })?;
    Some(CurrentLease {
        keys: Arc::clone(&holder.keys),
        fencing_token: holder.fencing_token?,
    })
}

/// Inside a locked body: the fencing token of the innermost lease of this task that holds `key`
/// (the key as given to the lock, without the manager's prefix), or `None` if no lease of this
/// task holds it. It does not ask which manager took the lease: a task that locks the same key
/// name through two managers (two Redis servers or prefixes) should use
/// [`Lease::fencing_token`](crate::Lease::fencing_token) instead.
///
/// ```no_run
/// use distlock_runtime::{distributed_lock, LockError};
///
/// #[distributed_lock("account:{id}")]
/// async fn deposit(id: u64, cents: u64) -> Result<(), LockError> {
///     let key = format!("account:{id}");
///     let token = distlock_runtime::current_fencing_token(&key).expect("held by this body");
///     // write `cents` only if the account's storage has seen no token above `token`
///     Ok(())
/// }
/// ```
pub fn current_fencing_token(key: &str) -> Option<u64> {
    innermost()?
        .chain()
        .filter(|frame| frame.keys.iter().any(|k| k == key))
        .find_map(|frame| frame.fencing_token)
}
