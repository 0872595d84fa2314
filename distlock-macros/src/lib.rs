//! The `#[distributed_lock]` attribute. Use it through `distlock-runtime`, which re-exports it
//! and provides the runtime it expands to.
//!
//! The macro only parses, checks and emits one call: `args` (the attribute's arguments) ->
//! `item` (the fn) -> `check` (templates against parameters, signature) -> `expand`.
#![forbid(unsafe_code)]

mod args;
mod check;
mod errors;
mod expand;
mod item;
mod key;

use proc_macro::TokenStream;

/// Runs the body of an `async fn` under a distributed lock held in Redis.
///
/// ```ignore
/// #[distributed_lock("order:{order_id}", ttl = 30)]
/// async fn pay(order_id: u64, amount_cents: u64) -> Result<Receipt, AppError> {
///     // at most one task in the whole fleet runs this per order_id at a time
/// }
/// ```
///
/// With `lease = lease`, the body holds its fencing token for the storage it writes to:
///
/// ```ignore
/// #[distributed_lock("account:{id}", lease = lease)]
/// async fn deposit(db: &Db, id: u64, cents: u64) -> Result<(), AppError> {
///     // the storage refuses a write whose token is below the last one it accepted
///     db.add_fenced(id, cents, lease.fencing_token()).await?;
///     Ok(())
/// }
/// ```
///
/// # Keys
/// The first argument (left out when `read` alone names the keys) is a key template, or an array
/// of them locked together (all or nothing,
/// sorted and de-duplicated at run time, so no two calls can deadlock on each other's order):
/// `["stock:{sku}", "wallet:{user.id}"]`. These keys are held exclusively: one holder at a time.
/// `read = ...` adds keys held shared (many readers, no writer), and `permits = N` makes the one
/// key a semaphore of `N` holders; see the options below. A template interpolates the fn's
/// parameters with `Display`: `{name}`, a field path `{name.field.sub}`, or `{self.field}` in a
/// method. `{{` and `}}` are literal braces. Parameters bound by patterns count (`Path(id):
/// Path<u64>` binds `id`). Interpolated values are percent-encoded for `%`, `:`, `{` and `}`, and
/// two placeholders must have a `:` (or another of those characters) between them, so distinct
/// arguments never render the same key and user input cannot pick a Redis Cluster hash slot;
/// other values render as they are (`order:{order_id}` with 42 is `order:42`). A placeholder that
/// names no parameter is a compile error listing the parameters; one naming a field its
/// parameter's type lacks is a compile error on the key. The `read` templates follow the same
/// rules.
///
/// ```ignore
/// // Writes the report, reading its inputs: `report:{id}` exclusively, the others shared, all
/// // taken together.
/// #[distributed_lock("report:{id}", read = ["sales:{id}", "stock:{id}"])]
/// async fn build_report(id: u64) -> Result<(), AppError> { /* ... */ }
///
/// // Only shared keys: any number of viewers at once, none while a writer holds `doc:{id}`.
/// #[distributed_lock(read = "doc:{id}")]
/// async fn view(id: u64) -> Result<Doc, AppError> { /* ... */ }
///
/// // At most 8 exports at once across the fleet (or `permits = settings.exports`).
/// #[distributed_lock("exports", permits = 8)]
/// async fn export(job: Job) -> Result<(), AppError> { /* ... */ }
/// ```
///
/// # Options
/// | option | value | default |
/// |---|---|---|
/// | `read` | key templates held shared, taken with the exclusive keys as one unit: `read = "doc:{id}"` or `read = ["a:{x}", "b:{y}"]`. May stand alone, without exclusive keys (`#[distributed_lock(read = "doc:{id}")]`); a template may not be both exclusive and in `read` (the exclusive hold already covers reading) | none |
/// | `permits` | makes the one exclusive key a semaphore: up to this many calls hold it at once, each with a lease of its own. An integer literal of at least 1, or an integer expression evaluated at each call (`permits = settings.exports`): zero, negative or above `u32::MAX` is `LockError::InvalidConfig` then, the body not run. Needs exactly one exclusive key and no `read` | none: the key is exclusive |
/// | `ttl` | lease length: integer seconds (`ttl = 30`) or a string with a unit (`"1500ms"`, `"2s"`, `"5m"`, `"1h"`), checked at compile time; at least 10 ms. Or any other expression of integer seconds or a `Duration` (`ttl = SETTINGS_TTL`, `ttl = config.ttl`), evaluated at each call: a negative or out-of-range value is `LockError::InvalidConfig` then, the body not run | the manager's default ttl (30 s unless set with its builder) |
/// | `wait` | how long to wait for a held lock, same forms; `wait = 0` tries once (try-lock) | the manager's default wait (10 s unless set with its builder) |
/// | `renew` | `true` / `false`: extend the lease every ttl/3 while the body runs | `true` |
/// | `fair` | `true` / `false`: serve waiters in arrival order, handing the lock straight to the oldest live waiter; one key only, the `read` keys counted too | the manager's (`true` for one key unless `LockManagerBuilder::default_fair(false)`; unfair on a quorum or with `min_replicas`) |
/// | `hold_at_least` | after the body, keep the keys held until this long after the acquisition (same forms as `ttl`): scheduled jobs that must run at most once per tick across a fleet | released when the body ends |
/// | `lease` | a variable name (`lease = lease`): the body sees the lease it runs under as `distlock_runtime::CurrentLease`, for its fencing token (`lease.fencing_token()`), without naming a key. The token fences the keys in `lease.keys()`: all of the call's keys, except in a nested call that re-entered keys held further out (then the lease it took for the others, or, having taken none, the nearest enclosing lease holding its keys; `current_fencing_token(key)` gives each key's). With `read` or `permits`, holders run side by side with different tokens: storage must check their tokens without recording them (see `docs/guarantees.md`). A name a parameter already has, or `self`, is a compile error | not bound (`distlock_runtime::current_lease()` returns the same) |
/// | `manager` | an expression yielding a `LockManager`, `&LockManager` or `Arc<LockManager>`; may use the parameters and `self` (`manager = &self.locks`) | the default manager: the one `with_default_manager` gave the running future, else the one installed with `set_default_manager` |
/// | `crate` | path of the runtime crate as a string, for a renamed dependency (`crate = "lock"`) | `"::distlock_runtime"` |
///
/// Any other option, a duplicate, a malformed value, `fair = true` with several keys, `permits = 0`,
/// `permits` with several keys (on `permits`) or with `read` (on `read`), `read = []`, and a
/// template both exclusive and in `read` (on the `read` one) are compile errors on their token.
///
/// # The fn
/// It must be `async` and return `Result<T, E>` where `E: From<LockError>` (a type alias of such
/// a `Result` works too; the check is a trait bound on the return type). Methods (`&self`,
/// `&mut self`, `self: Arc<Self>`), generics, `impl Trait` parameters, lifetimes, `where` clauses,
/// fns in `impl Trait for Type` blocks, doc comments and other attributes all keep working, and
/// so does `Result<impl Trait, E>`. A return type that is not such a `Result`, or whose error
/// type lacks `From<LockError>` (`String`, axum's `StatusCode`), is a compile error on the return
/// type: give the error type a variant `Lock(#[from] LockError)` (thiserror) or an
/// `impl From<LockError>`, or return `anyhow::Result<T>` or `Result<T, LockError>`. The returned
/// future is `Send` whenever the body's future and the returned `T` and `E` are `Send` (the
/// result is held while the lease is released), so annotated fns serve as axum handlers and run
/// in `tokio::spawn`.
///
/// # What the expansion does
/// The fn keeps its signature. Its new body renders the keys (exclusive and `read`) from the
/// arguments, evaluates the `manager` expression (or takes the default manager), then makes one call into the runtime
/// with the original body as an `async move` block. The runtime sorts and de-duplicates the
/// keys, acquires them as one lease (waiting up to `wait`), runs the body, and releases the
/// lease whatever happens: on return, on panic, and when the call's future is dropped. If the
/// lease is lost while the body runs, the body is dropped at its next await point. Every lock
/// failure (busy, timed out, lease lost, Redis unavailable, no manager configured) becomes
/// `Err(E::from(LockError::..))`, and the body does not run (or stops).
///
/// # Re-entrancy
/// A call nested inside the body, on the same task and the same manager (or a clone of it), for
/// keys this task already holds does not wait for itself: it runs under the outer lease. So its
/// own `ttl`, `renew` and `fair` do not apply (the outer lease keeps its own); only its `wait`
/// does, when a sibling call on the same task (side by side in `join!` or `select!`) is using the
/// key at that moment: re-entry is for strict nesting, and side-by-side calls take turns. If only
/// some of its keys are held, the others are acquired as a new lease, under its own settings.
/// A body holding a key exclusively re-enters for it in any mode; a body holding it shared (or
/// as a permit) re-enters only in that mode, and a nested exclusive call for it fails at once
/// with `LockError::UpgradeNotSupported` (two readers upgrading would wait for each other).
#[proc_macro_attribute]
pub fn distributed_lock(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    let mut errors = errors::Errors::default();
    let args = match syn::parse::<args::Parsed>(attr) {
        Ok(parsed) => {
            errors.extend(parsed.errors);
            check::options(&parsed.args, &mut errors);
            Some(parsed.args)
        }
        Err(error) => {
            errors.push(error);
            None
        }
    };
    let locked = syn::parse2::<item::LockedFn>(item.clone())
        .map_err(|e| errors.push(e))
        .ok();
    if let Some(locked) = &locked {
        check::signature(locked, &mut errors);
    }
    let expanded = match (&args, &locked) {
        (Some(args), Some(locked)) => {
            let templates = check::templates(args, locked, &mut errors);
            Some(expand::expand(args, &templates, locked))
        }
        _ => None,
    };
    match errors.finish() {
        Err(error) => expand::fallback(item, &error).into(),
        // Without an error both parts parsed, so there is an expansion.
        Ok(()) => expanded.unwrap_or(item).into(),
    }
}
