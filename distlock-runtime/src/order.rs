//! The lock order check: which lock class each task of a manager took inside which, and the
//! first nesting that goes the other way, found before it deadlocks (the Linux kernel's lockdep
//! does this for its own locks).
//!
//! A key's class is its attribute template with the placeholders blanked (`acct:{a}` and
//! `acct:{b}` are both `acct:{}`), or, for a key given to the explicit API, the key itself. When
//! a task that holds keys (through `run` or an annotated fn) asks for more, each class it holds
//! is recorded as taken before each class it asks for. The request is an inversion when some
//! task of the manager took them the other way round, or when it asks for another key of a class
//! it holds (two accounts locked one inside the other: `transfer(a, b)` against
//! `transfer(b, a)`). Re-entering a key the task holds asks for nothing, and the keys of one
//! request are taken together, all or nothing: neither is a nesting.
//!
//! The check asks Redis nothing. It runs only for nested requests, under one mutex of the
//! manager's, and remembers at most [`MAX_PAIRS`] orders.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::panic::Location;
use std::sync::{Arc, Mutex};

use crate::error::LockError;
use crate::sync::lock;

/// What a manager does when a task nests lock classes in an order that deadlocks with an order
/// seen before: [`LockManagerBuilder::lock_order`](crate::LockManagerBuilder::lock_order).
///
/// Nested locks taken in opposite orders deadlock across the fleet: `transfer(a, b)` locking
/// `acct:{a}` and calling `deposit(b)`, which locks `acct:{b}`, waits for `transfer(b, a)`, which
/// waits for it, until both waits run out and fail as contention. The check finds such an order
/// the first time it is taken, before it deadlocks, from the order locks are taken in (as the
/// Linux kernel's lockdep does):
///
/// - A key's **class** is its attribute template with the placeholders blanked (`acct:{a}` and
///   `acct:{b}` are both `acct:{}`), or, for a key given to the explicit API
///   ([`LockManager::lock`](crate::LockManager::lock) and the like), the key itself.
/// - When a task holding keys (inside a [`run`](crate::LockRequest::run) body or an annotated
///   fn) asks this manager for more, each class it holds is recorded as taken before each class
///   it asks for. The request is an **inversion** if some task of the manager took two of them
///   the other way round before, or if it asks for another key of a class it holds (two
///   accounts, one inside the other).
/// - Never an inversion: a try-lock (a zero wait), which never waits and so never deadlocks
///   (nor is its order recorded); re-entering a key the task holds; the keys of one request,
///   which are taken together, all or nothing (`lock_all`, an attribute's key list); keys held
///   through another manager; a lease from [`acquire`](crate::LockRequest::acquire) kept
///   outside a body (it belongs to no task's record).
/// - The check asks Redis nothing, runs only for nested requests, and remembers at most 10,000
///   pairs of classes per manager (a warning says when it stops recording).
///
/// An order meant both ways is not declared but written so: take the keys in one request
/// (`lock_all(["acct:1", "acct:2"])`, or both in the attribute's list), or give the nested call
/// a manager of its own with `LockOrder::Off`. Cycles through three or more classes (a in b, b
/// in c, c in a) are not found; pairs are.
///
/// ```no_run
/// # use distlock_runtime::{distributed_lock, LockError, LockManager};
/// #[distributed_lock("acct:{from}", manager = locks)]
/// async fn transfer(locks: &LockManager, from: u64, to: u64) -> Result<(), LockError> {
///     deposit(locks, to).await // `acct:{}` inside `acct:{}`: an inversion
/// }
///
/// #[distributed_lock("acct:{to}", manager = locks)]
/// async fn deposit(locks: &LockManager, to: u64) -> Result<(), LockError> {
///     Ok(())
/// }
///
/// // Instead: both accounts in one request, all or nothing.
/// #[distributed_lock(["acct:{from}", "acct:{to}"], manager = locks)]
/// async fn transfer_both(locks: &LockManager, from: u64, to: u64) -> Result<(), LockError> {
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LockOrder {
    /// No check, nothing recorded.
    Off,
    /// The nested request goes on; the first inversion of each pair of classes is logged as a
    /// warning naming both classes and where each order was first seen, and every inversion
    /// counts in `distlock_lock_order_inversions_total`.
    #[default]
    Warn,
    /// The nested request fails at once with [`LockError::LockOrderInversion`], before it asks
    /// Redis anything or waits (the testing helpers' managers use this).
    Fail,
}

/// How many ordered pairs of classes a manager remembers; past that, new pairs are not
/// recorded (a warning says so once), so keys used as classes cannot grow it without bound.
pub(crate) const MAX_PAIRS: usize = 10_000;

/// Where a request was made: the annotated fn, or the line of the call that built it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Site {
    Attribute(&'static str),
    Call(&'static Location<'static>),
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Attribute(name) => write!(f, "fn `{name}`"),
            Self::Call(at) => write!(f, "{}:{}", at.file(), at.line()),
        }
    }
}

/// The class of each key of a request, in the keys' order, where an attribute named them;
/// `None`: each key is its own class.
pub(crate) type Classes = Option<Arc<[&'static str]>>;

/// One key of a request, as the check sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Class<'a> {
    /// The class: a blanked template, or the key itself.
    pub(crate) name: &'a str,
    pub(crate) key: &'a str,
    pub(crate) site: Site,
}

/// Where an order was first seen: the outer request's site, then the inner one's.
type Seen = (Site, Site);

/// The orders a manager's tasks have taken classes in.
#[derive(Debug)]
pub(crate) struct Orders {
    mode: LockOrder,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// (outer class, inner class) → where that order was first seen.
    seen: HashMap<(Arc<str>, Arc<str>), Seen>,
    /// The pairs (as ordered when first found) already warned of.
    warned: HashSet<(Arc<str>, Arc<str>)>,
    /// The cap on `seen` was reached and said.
    full: bool,
}

/// An inversion found: the classes as held and wanted now, and where the other order was first
/// seen (`None` for a class nested under itself).
#[derive(Debug)]
struct Inversion<'a> {
    held: Class<'a>,
    wanted: Class<'a>,
    before: Option<Seen>,
}

impl Orders {
    pub(crate) fn new(mode: LockOrder) -> Self {
        Self {
            mode,
            state: Mutex::default(),
        }
    }

    /// Whether nested requests are checked at all.
    pub(crate) fn on(&self) -> bool {
        self.mode != LockOrder::Off
    }

    /// Checks a nested request: a task holding `held` asks for `wanted` (the keys it does not
    /// hold yet). Unless it fails, records each held class as taken before each wanted one that
    /// is not an inversion. A request with inversions counts once in the metric; warnings are
    /// logged once the record is unlocked.
    ///
    /// # Errors
    /// [`LockError::LockOrderInversion`] under [`LockOrder::Fail`], for the first inversion;
    /// nothing of the request is recorded then.
    pub(crate) fn check(&self, held: &[Class<'_>], wanted: &[Class<'_>]) -> Result<(), LockError> {
        if self.mode == LockOrder::Off || held.is_empty() || wanted.is_empty() {
            return Ok(());
        }
        let mut state = lock(&self.state);
        let (mut inversions, mut orders) = (Vec::new(), Vec::new());
        for &outer in held {
            for &inner in wanted {
                match state.inversion(outer, inner) {
                    Some(inversion) => inversions.push(inversion),
                    None => orders.push((outer, inner)),
                }
            }
        }
        if let (LockOrder::Fail, Some(first)) = (self.mode, inversions.first()) {
            drop(state);
            crate::telemetry::lock_order_inversion();
            return Err(LockError::LockOrderInversion {
                held: first.held.name.to_owned(),
                wanted: first.wanted.name.to_owned(),
            });
        }
        let full = orders
            .into_iter()
            .any(|(outer, inner)| !state.record(outer, inner));
        let news: Vec<&Inversion<'_>> = (inversions.iter())
            .filter(|inversion| state.warned.insert(pair(inversion)))
            .collect();
        let first_full = full && !std::mem::replace(&mut state.full, true);
        drop(state);
        if !inversions.is_empty() {
            crate::telemetry::lock_order_inversion();
        }
        news.into_iter().for_each(warn);
        if first_full {
            tracing::warn!(
                pairs = MAX_PAIRS,
                "distlock's lock order check remembers no more orders of classes: new nestings \
                 go unchecked (keys given to the explicit API are classes of their own; many \
                 distinct ones nested fill it)"
            );
        }
        Ok(())
    }
}

impl State {
    /// Why taking `inner` inside `outer` is an inversion, if it is.
    fn inversion<'a>(&self, outer: Class<'a>, inner: Class<'a>) -> Option<Inversion<'a>> {
        if outer.name == inner.name {
            // Another key of the class (the same key would be a re-entry, never checked).
            return (outer.key != inner.key).then_some(Inversion {
                held: outer,
                wanted: inner,
                before: None,
            });
        }
        let reversed = (Arc::from(inner.name), Arc::from(outer.name));
        let before = *self.seen.get(&reversed)?;
        Some(Inversion {
            held: outer,
            wanted: inner,
            before: Some(before),
        })
    }

    /// Records `inner` taken inside `outer` (where first seen, if new); `false` when the record
    /// is full and it was new.
    fn record(&mut self, outer: Class<'_>, inner: Class<'_>) -> bool {
        let full = self.seen.len() >= MAX_PAIRS;
        match self
            .seen
            .entry((Arc::from(outer.name), Arc::from(inner.name)))
        {
            Entry::Occupied(_) => true,
            Entry::Vacant(_) if full => false,
            Entry::Vacant(vacant) => {
                vacant.insert((outer.site, inner.site));
                true
            }
        }
    }
}

/// The unordered pair of an inversion's classes, to warn of it once whichever way it is found.
fn pair(inversion: &Inversion<'_>) -> (Arc<str>, Arc<str>) {
    let (a, b) = (inversion.held.name, inversion.wanted.name);
    let (first, second) = if a <= b { (a, b) } else { (b, a) };
    (first.into(), second.into())
}

fn warn(inversion: &Inversion<'_>) {
    let Inversion {
        held,
        wanted,
        before,
    } = inversion;
    match before {
        Some((outer, inner)) => tracing::warn!(
            held = held.name,
            wanted = wanted.name,
            "distlock lock order inversion: `{}` asked for at {} while `{}` is held (taken at {}), \
             but `{}` was taken inside `{}` before (at {inner}, inside {outer}); two tasks taking \
             them in these two orders wait for each other until their waits run out: take them \
             in one order everywhere",
            wanted.name,
            wanted.site,
            held.name,
            held.site,
            held.name,
            wanted.name,
        ),
        None => tracing::warn!(
            held = held.name,
            wanted = wanted.name,
            "distlock lock order inversion: `{}` (key `{}`) asked for at {} inside another key \
             of its class, `{}` (taken at {}); two tasks nesting two keys of one class the other \
             way round wait for each other until their waits run out: take both keys in one \
             request (all or nothing)",
            wanted.name,
            wanted.key,
            wanted.site,
            held.key,
            held.site,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class<'a>(name: &'a str, key: &'a str) -> Class<'a> {
        Class {
            name,
            key,
            site: Site::Attribute("f"),
        }
    }

    fn inverted(result: Result<(), LockError>) -> Option<(String, String)> {
        match result {
            Ok(()) => None,
            Err(LockError::LockOrderInversion { held, wanted }) => Some((held, wanted)),
            Err(other) => panic!("not an inversion: {other}"),
        }
    }

    #[test]
    fn the_reverse_of_a_seen_order_fails_and_the_same_order_does_not() {
        let orders = Orders::new(LockOrder::Fail);
        let (a, b) = (class("a:{}", "a:1"), class("b:{}", "b:1"));
        assert_eq!(inverted(orders.check(&[a], &[b])), None);
        assert_eq!(inverted(orders.check(&[a], &[b])), None);
        assert_eq!(
            inverted(orders.check(&[b], &[a])),
            Some(("b:{}".to_owned(), "a:{}".to_owned()))
        );
        // The failed nesting was not recorded: the first order still stands.
        assert_eq!(inverted(orders.check(&[a], &[b])), None);
    }

    #[test]
    fn a_failed_request_records_none_of_its_pairs() {
        let orders = Orders::new(LockOrder::Fail);
        let (x, y, z) = (class("x", "x"), class("y", "y"), class("z", "z"));
        assert!(orders.check(&[z], &[x]).is_ok());
        // Holding x and y, asking for z: x then z inverts z then x; y then z is not kept.
        assert!(inverted(orders.check(&[x, y], &[z])).is_some());
        assert!(orders.check(&[z], &[y]).is_ok(), "y then z was recorded");
    }

    #[test]
    fn a_request_with_several_inversions_counts_once_and_warns_each_pair_once() {
        let orders = Orders::new(LockOrder::Warn);
        let (a, b, c) = (class("a", "a"), class("b", "b"), class("c", "c"));
        assert!(orders.check(&[a, b], &[c]).is_ok());
        assert!(orders.check(&[c], &[a, b]).is_ok());
        assert_eq!(lock(&orders.state).warned.len(), 2);
    }

    #[test]
    fn another_key_of_a_held_class_is_an_inversion_at_once() {
        let orders = Orders::new(LockOrder::Fail);
        let result = orders.check(&[class("acct:{}", "acct:1")], &[class("acct:{}", "acct:2")]);
        assert_eq!(
            inverted(result),
            Some(("acct:{}".to_owned(), "acct:{}".to_owned()))
        );
    }

    #[test]
    fn an_order_through_a_third_class_is_not_an_inversion() {
        // Only direct pairs are inversions: a then b, b then c, c then a is a cycle of three,
        // which this check (like a pair check) does not claim to find.
        let orders = Orders::new(LockOrder::Fail);
        let (a, b, c) = (class("a", "a"), class("b", "b"), class("c", "c"));
        assert!(orders.check(&[a], &[b]).is_ok());
        assert!(orders.check(&[b], &[c]).is_ok());
        assert!(orders.check(&[a, b], &[c]).is_ok());
        assert!(inverted(orders.check(&[c], &[b])).is_some());
    }

    #[test]
    fn warn_goes_on_and_remembers_each_pair_once() {
        let orders = Orders::new(LockOrder::Warn);
        let (a, b) = (class("a", "a"), class("b", "b"));
        assert!(orders.check(&[a], &[b]).is_ok());
        assert!(orders.check(&[b], &[a]).is_ok());
        assert!(orders.check(&[b], &[a]).is_ok());
        assert!(orders.check(&[a], &[b]).is_ok());
        let state = lock(&orders.state);
        assert_eq!(state.warned.len(), 1);
        assert_eq!(
            state.seen.len(),
            1,
            "an inversion is not recorded as an order"
        );
    }

    #[test]
    fn off_records_nothing() {
        let orders = Orders::new(LockOrder::Off);
        let (a, b) = (class("a", "a"), class("b", "b"));
        assert!(orders.check(&[a], &[b]).is_ok());
        assert!(orders.check(&[b], &[a]).is_ok());
        assert!(lock(&orders.state).seen.is_empty());
    }

    #[test]
    fn the_orders_remembered_are_capped() {
        let orders = Orders::new(LockOrder::Fail);
        let names: Vec<String> = (0..=MAX_PAIRS).map(|i| format!("k{i}")).collect();
        let outer = class("outer", "outer");
        for name in &names {
            orders.check(&[outer], &[class(name, name)]).unwrap();
        }
        let state = lock(&orders.state);
        assert_eq!(state.seen.len(), MAX_PAIRS);
        assert!(state.full);
    }
}
