//! What `#[distributed_lock]` expands to. Not public API: the names here may change in any
//! release.

use std::fmt::{self, Display, Write};
use std::future::Future;
use std::time::Duration;

use crate::error::LockError;
use crate::manager::LockManager;
use crate::request::LockRequest;

/// The options written in the attribute; `None` keeps the manager's default.
#[derive(Debug)]
pub struct Options {
    /// `read = ..`: the keys held shared, rendered (empty without `read`).
    pub read: Vec<String>,
    /// `permits = ..`: a literal, or an expression converted at the call.
    pub permits: Option<Result<u32, LockError>>,
    /// `ttl = ..`: a literal, or an expression converted at the call.
    pub ttl: Option<Result<Duration, LockError>>,
    /// `wait = ..`.
    pub wait: Option<Result<Duration, LockError>>,
    /// `renew = ..`.
    pub renew: bool,
    /// `fair = ..`; `None` keeps the manager's default.
    pub fair: Option<bool>,
    /// `hold_at_least = ..`.
    pub hold_at_least: Option<Result<Duration, LockError>>,
    /// The key template(s) as written, for metrics and spans.
    pub template: &'static str,
    /// The lock order check's class of each key (exclusive, then shared, as written): its
    /// template with the placeholders blanked.
    pub classes: &'static [&'static str],
    /// The annotated fn's path (`module::fn`), for the lock order check's warnings.
    pub name: &'static str,
}

/// A duration option's value given as an expression (`ttl = SETTINGS_TTL`, `wait =
/// config.wait`): whole seconds as an integer, or a `Duration`. A negative integer is a
/// [`LockError::InvalidConfig`] at the call.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` durations are whole seconds (an integer) or a `std::time::Duration`; `{Self}` is neither",
    label = "expected integer seconds or a `Duration`",
    note = "write `ttl = 30`, `ttl = \"1500ms\"`, a `const TTL: u64 = 30;`, or an expression of type `Duration`"
)]
pub trait IntoDuration {
    /// The duration, or why `what` cannot be one.
    fn into_duration(self, what: &'static str) -> Result<Duration, LockError>;
}

impl IntoDuration for Duration {
    fn into_duration(self, _: &'static str) -> Result<Duration, LockError> {
        Ok(self)
    }
}

impl<T: IntoDuration + Copy> IntoDuration for &T {
    fn into_duration(self, what: &'static str) -> Result<Duration, LockError> {
        (*self).into_duration(what)
    }
}

macro_rules! seconds {
    ($($t:ty),*) => {$(
        impl IntoDuration for $t {
            fn into_duration(self, what: &'static str) -> Result<Duration, LockError> {
                u64::try_from(self).map(Duration::from_secs).map_err(|_| LockError::InvalidConfig {
                    what,
                    reason: format!("{self} seconds: a duration cannot be negative"),
                })
            }
        }
    )*};
}
seconds!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

/// A `permits = ..` value given as an expression (`permits = settings.exports`): any integer.
/// Zero, a negative value, or one above `u32::MAX` is a [`LockError::InvalidConfig`] at the
/// call.
#[diagnostic::on_unimplemented(
    message = "`permits = ...` takes an integer number of permits; `{Self}` is not an integer",
    label = "expected an integer",
    note = "write `permits = 8`, a `const EXPORTS: u32 = 8;`, or an expression of an integer type"
)]
pub trait IntoPermits {
    /// The number of permits, or why this value cannot be one.
    fn into_permits(self) -> Result<u32, LockError>;
}

impl<T: IntoPermits + Copy> IntoPermits for &T {
    fn into_permits(self) -> Result<u32, LockError> {
        (*self).into_permits()
    }
}

macro_rules! permits {
    ($($t:ty),*) => {$(
        impl IntoPermits for $t {
            fn into_permits(self) -> Result<u32, LockError> {
                let n = u32::try_from(self).ok().filter(|&n| n > 0);
                n.ok_or_else(|| LockError::InvalidConfig {
                    what: "permits",
                    reason: format!("permits = {self}: a semaphore takes 1 to {} permits", u32::MAX),
                })
            }
        }
    )*};
}
permits!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

/// A return type that can carry a [`LockError`]: `Result<T, E>` with `E: From<LockError>`.
///
/// The impl is `do_not_recommend`, so a `Result` whose error lacks `From<LockError>` (`String`,
/// axum's `StatusCode`) is reported as not implementing this trait, with the message below,
/// rather than as an unmet `From` bound listing unrelated `From` impls.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` functions must return `Result<T, E>` with `E: From<distlock_runtime::LockError>`; `{Self}` is not such a type",
    label = "this return type cannot carry a lock failure",
    note = "the fn returns a lock failure (busy, timed out, lease lost, Redis unreachable) as `Err(E::from(error))`, so `E` needs `From<LockError>`; `String` and axum's `StatusCode` do not have it",
    note = "wrap the error in an app error type with a variant `Lock(#[from] LockError)` (thiserror) or an `impl From<LockError>`, or return `anyhow::Result<T>` or `Result<T, LockError>`"
)]
pub trait LockResult {
    /// The value the fn returns when the lock fails.
    fn from_lock_error(error: LockError) -> Self;
}

#[diagnostic::do_not_recommend]
impl<T, E: From<LockError>> LockResult for Result<T, E> {
    fn from_lock_error(error: LockError) -> Self {
        Err(E::from(error))
    }
}

/// What `manager = EXPR` may yield.
#[diagnostic::on_unimplemented(
    message = "`manager = ...` must yield a `LockManager`, a `&LockManager` or an `Arc<LockManager>`, not `{Self}`",
    label = "not a LockManager"
)]
pub trait IntoManager {
    /// The manager, owned (a clone is cheap).
    fn into_manager(self) -> LockManager;
}

impl IntoManager for LockManager {
    fn into_manager(self) -> LockManager {
        self
    }
}

impl IntoManager for &LockManager {
    fn into_manager(self) -> LockManager {
        self.clone()
    }
}

impl IntoManager for std::sync::Arc<LockManager> {
    fn into_manager(self) -> LockManager {
        (*self).clone()
    }
}

impl IntoManager for &std::sync::Arc<LockManager> {
    fn into_manager(self) -> LockManager {
        (**self).clone()
    }
}

/// `manager = EXPR`.
pub fn manager(manager: impl IntoManager) -> Result<LockManager, LockError> {
    Ok(manager.into_manager())
}

/// No `manager = ..`: the default manager.
pub fn default_manager() -> Result<LockManager, LockError> {
    crate::default_manager()
}

/// A piece of a key template.
#[derive(Clone, Copy)]
pub enum KeyPart<'a> {
    /// Literal text of the template, written as is.
    Text(&'a str),
    /// A placeholder's value, written with `Display` and escaped.
    Value(&'a dyn Display),
}

/// Renders a key template: text as written, values percent-encoded for `%`, `:`, `{` and `}`,
/// so two different values never render the same key and a value cannot pick a Redis Cluster
/// hash slot (`{...}`).
pub fn render_key(parts: &[KeyPart<'_>]) -> String {
    let mut key = String::new();
    for part in parts {
        match part {
            KeyPart::Text(text) => key.push_str(text),
            KeyPart::Value(value) => {
                // Writing into a String cannot fail; a Display impl that errors leaves what it
                // wrote so far.
                let _ = write!(Escaped(&mut key), "{value}");
            }
        }
    }
    key
}

/// Percent-encodes the characters that carry meaning in a key as it is written.
struct Escaped<'a>(&'a mut String);

impl Write for Escaped<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            match c {
                '%' | ':' | '{' | '}' => write!(self.0, "%{:02X}", u32::from(c))?,
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

pub use crate::reentrancy::CurrentLease;

/// `lease = NAME`: the lease of the body it is bound in, evaluated at the body's first poll,
/// which always runs inside the lease's scope.
///
/// # Panics
/// Outside a locked body, which the expansion never does.
pub fn body_lease() -> CurrentLease {
    crate::reentrancy::current_lease()
        .expect("distlock bug: an annotated fn's body ran outside its lease; please report it")
}

/// Runs `body` under the lock on `keys` (exclusive, or one of `options.permits`) and
/// `options.read` (shared), taken together: the whole expansion of an annotated fn. `on_error` is
/// `<ReturnType as LockResult>::from_lock_error`, named in the expansion so that a return type
/// that cannot carry a `LockError` is reported once, on the return type.
pub async fn run<R, F>(
    manager: Result<LockManager, LockError>,
    keys: Vec<String>,
    options: Options,
    on_error: fn(LockError) -> R,
    body: F,
) -> R
where
    F: Future<Output = R>,
{
    match request(manager, keys, options) {
        Ok(request) => request.run(body).await.unwrap_or_else(on_error),
        Err(error) => on_error(error),
    }
}

/// The request of an annotated call: `manager`'s lock on `keys` with the attribute's `options`,
/// or the first error among the manager and the options converted at the call.
fn request(
    manager: Result<LockManager, LockError>,
    keys: Vec<String>,
    options: Options,
) -> Result<LockRequest, LockError> {
    let mut request = manager?
        .lock_all(keys)
        .read_keys(options.read)
        .renew(options.renew)
        .metrics_label(options.template)
        .attribute(options.classes, options.name);
    if let Some(ttl) = options.ttl.transpose()? {
        request = request.ttl(ttl);
    }
    if let Some(wait) = options.wait.transpose()? {
        request = request.wait(wait);
    }
    if let Some(fair) = options.fair {
        request = request.fair(fair);
    }
    if let Some(hold) = options.hold_at_least.transpose()? {
        request = request.hold_at_least(hold);
    }
    if let Some(permits) = options.permits.transpose()? {
        request = request.permits(permits);
    }
    Ok(request)
}

/// Every Lua script distlock sends, as Redis receives it, by the name of its file in the
/// runtime's `src/scripts/` (without `.lua`; each file states the script's contract): for tests
/// that run the scripts directly.
pub fn scripts() -> Vec<(&'static str, &'static str)> {
    crate::catalog::all()
        .into_iter()
        .map(|(name, lua)| (name, lua.code()))
        .collect()
}

/// The script named `name` (one of [`scripts`]), as Redis receives it.
///
/// # Panics
/// When no script has that name; the message lists the names.
pub fn script(name: &str) -> &'static str {
    let scripts = scripts();
    if let Some((_, code)) = scripts.iter().find(|(script, _)| *script == name) {
        return code;
    }
    let names: Vec<&str> = scripts.iter().map(|(name, _)| *name).collect();
    panic!("no script is named `{name}`; the scripts are {names:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_from_any_integer_type() {
        assert_eq!(8u8.into_permits().ok(), Some(8));
        assert_eq!((&8i64).into_permits().ok(), Some(8));
        assert_eq!(u32::MAX.into_permits().ok(), Some(u32::MAX));
        for refused in [
            0i64.into_permits(),
            (-1i32).into_permits(),
            (u64::from(u32::MAX) + 1).into_permits(),
        ] {
            assert!(
                matches!(
                    refused,
                    Err(LockError::InvalidConfig {
                        what: "permits",
                        ..
                    })
                ),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn plain_values_render_as_they_are() {
        let id = 42;
        assert_eq!(
            render_key(&[KeyPart::Text("order:"), KeyPart::Value(&id)]),
            "order:42"
        );
    }

    #[test]
    fn meaningful_characters_in_values_are_escaped_but_not_in_text() {
        let value = "a:b{c}%d";
        assert_eq!(
            render_key(&[KeyPart::Text("k:{x}:"), KeyPart::Value(&value)]),
            "k:{x}:a%3Ab%7Bc%7D%25d"
        );
    }

    #[test]
    fn escaped_values_never_contain_a_separator() {
        // The attribute accepts these between two placeholders (distlock-macros'
        // `check::SEPARATORS`): sound only because no escaped value ever contains one.
        const SEPARATORS: [char; 3] = [':', '{', '}'];
        let every_char: String = (0..=0x10FFFF).filter_map(char::from_u32).collect();
        let rendered = render_key(&[KeyPart::Value(&every_char)]);
        assert!(!rendered.contains(SEPARATORS), "{rendered:.80}");
        // And escaping does write `%`, so `%` can never be one.
        assert!(render_key(&[KeyPart::Value(&"50%")]).contains('%'));
    }

    #[test]
    fn distinct_arguments_never_render_the_same_key() {
        // Without escaping, ("a:b", "c") and ("a", "b:c") would both render "a:b:c".
        let render = |x: &str, y: &str| {
            render_key(&[KeyPart::Value(&x), KeyPart::Text(":"), KeyPart::Value(&y)])
        };
        assert_ne!(render("a:b", "c"), render("a", "b:c"));
        assert_ne!(render("%3A", ""), render(":", ""));
    }
}
