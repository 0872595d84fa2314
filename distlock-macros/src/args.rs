//! The attribute's arguments as a spanned model: `KEYS, read = .., permits = .., ttl = ..,
//! wait = .., renew = .., fair = .., hold_at_least = .., lease = .., manager = ..,
//! crate = ".."`, each option set at most once. `KEYS` may be left out when `read` names keys.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, Lit, LitStr, Token};

use crate::errors::Errors;

/// The longest ttl the runtime accepts (`distlock_runtime::MAX_TTL`), in milliseconds.
const MAX_TTL_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// The options the attribute accepts, for "unknown option" messages.
pub(crate) const OPTIONS: &str =
    "`read`, `permits`, `ttl`, `wait`, `renew`, `fair`, `hold_at_least`, `lease`, `manager`, `crate`";

/// The options' names, as in [`OPTIONS`].
const NAMES: [&str; 10] = [
    "read",
    "permits",
    "ttl",
    "wait",
    "renew",
    "fair",
    "hold_at_least",
    "lease",
    "manager",
    "crate",
];

/// The parsed attribute.
pub(crate) struct Args {
    /// The key templates held exclusively (the positional `KEYS`), in the order written; empty
    /// when only `read` names keys.
    pub(crate) keys: Vec<LitStr>,
    pub(crate) read: Option<Read>,
    pub(crate) permits: Option<Permits>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) renew: Option<syn::LitBool>,
    pub(crate) fair: Option<syn::LitBool>,
    pub(crate) hold_at_least: Option<DurationArg>,
    /// `lease = NAME`: the variable the body's lease is bound to.
    pub(crate) lease: Option<syn::Ident>,
    pub(crate) manager: Option<Expr>,
    pub(crate) krate: Option<syn::Path>,
}

/// `read = "tpl"` or `read = ["tpl", ...]`: key templates held shared.
pub(crate) struct Read {
    /// The option's name, where errors about combining it land.
    pub(crate) name: syn::Ident,
    /// The templates, in the order written; never empty.
    pub(crate) keys: Vec<LitStr>,
}

/// `permits = N`: the one exclusive key becomes a semaphore of N permits.
pub(crate) struct Permits {
    /// The option's name, where errors about combining it land.
    pub(crate) name: syn::Ident,
    pub(crate) count: PermitCount,
}

/// How many permits: a literal, checked here (at least 1), or an expression converted at every
/// call (the runtime's `IntoPermits`).
pub(crate) enum PermitCount {
    Literal { count: u32, span: Span },
    Expr(Expr),
}

/// A duration option's value: a literal, checked here, or an expression evaluated at every call
/// (a `const`, a setting), checked at run time.
pub(crate) enum DurationArg {
    Literal(Millis),
    /// Integer seconds or a `Duration` (the runtime's `IntoDuration`).
    Expr(Expr),
}

/// A duration given to `ttl` or `wait`, in milliseconds, with the span of its value.
pub(crate) struct Millis {
    pub(crate) millis: u64,
    pub(crate) span: Span,
}

/// The arguments, and the errors found in the options (the keys parsed, so the fn's
/// placeholders can still be checked and every problem reported at once).
pub(crate) struct Parsed {
    pub(crate) args: Args,
    pub(crate) errors: Errors,
}

impl Parse for Parsed {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        if input.is_empty() {
            return Err(syn::Error::new(
                proc_macro2::Span::call_site(),
                "missing lock key: write #[distributed_lock(\"order:{order_id}\")] or \
                 #[distributed_lock([\"a:{x}\", \"b:{y}\"])]",
            ));
        }
        let first = input.span();
        // Without exclusive keys the options come first: `read = "doc:{id}"` may stand alone.
        let keys = if starts_with_option(input) {
            Vec::new()
        } else {
            parse_keys(input)?
        };
        let mut leading = keys.is_empty();
        let mut args = Args {
            keys,
            read: None,
            permits: None,
            ttl: None,
            wait: None,
            renew: None,
            fair: None,
            hold_at_least: None,
            lease: None,
            manager: None,
            krate: None,
        };
        let mut errors = Errors::default();
        // A `read` written with a bad value names keys all the same: its own error says enough.
        let mut read_written = false;
        while !input.is_empty() {
            if !std::mem::take(&mut leading) {
                if let Err(error) = input.parse::<Token![,]>() {
                    errors.push(error);
                    skip_to_comma(input);
                    continue;
                }
                if input.is_empty() {
                    break;
                }
            }
            if input.peek(LitStr) {
                let literal: LitStr = input.parse()?;
                errors.push(syn::Error::new_spanned(
                    literal,
                    if args.keys.is_empty() {
                        "the keys held exclusively come first, before the options: \
                         #[distributed_lock(\"a:{x}\", read = \"b:{y}\")]"
                    } else {
                        "several keys go in one array: #[distributed_lock([\"a:{x}\", \"b:{y}\"])]"
                    },
                ));
                continue;
            }
            read_written |= input
                .fork()
                .parse::<syn::Ident>()
                .is_ok_and(|n| n == "read");
            if let Err(error) = args.parse_option(input) {
                errors.push(error);
            }
        }
        if args.keys.is_empty() && args.read.is_none() && !read_written {
            let mut error = syn::Error::new(
                first,
                "the first argument is the lock key, a string literal such as \"order:{order_id}\"; \
                 options come after it",
            );
            if let Err(others) = errors.finish() {
                error.combine(others);
            }
            return Err(error);
        }
        Ok(Parsed { args, errors })
    }
}

/// Whether the attribute starts with an option (`name = ..`, or `read` even without its value)
/// rather than the exclusive keys.
fn starts_with_option(input: ParseStream<'_>) -> bool {
    let named = input.peek(syn::Ident) || input.peek(Token![crate]);
    (named && input.peek2(Token![=]))
        || input
            .fork()
            .parse::<syn::Ident>()
            .is_ok_and(|n| n == "read")
}

impl Args {
    /// Parses one `name = value`; on a bad value, skips to the next comma so later options are
    /// still checked.
    fn parse_option(&mut self, input: ParseStream<'_>) -> syn::Result<()> {
        let name: syn::Ident = if input.peek(Token![crate]) {
            let token: Token![crate] = input.parse()?;
            syn::Ident::new("crate", token.span)
        } else {
            match input.parse() {
                Ok(name) => name,
                Err(error) => {
                    skip_to_comma(input);
                    return Err(syn::Error::new(
                        error.span(),
                        format!("expected an option: one of {OPTIONS}"),
                    ));
                }
            }
        };
        let key = name.to_string();
        if !input.peek(Token![=]) {
            skip_to_comma(input);
            return Err(syn::Error::new_spanned(
                &name,
                if NAMES.contains(&key.as_str()) {
                    format!("`{key}` needs a value: `{key} = ...`")
                } else {
                    format!("unknown option `{key}`; valid options are {OPTIONS}")
                },
            ));
        }
        input.parse::<Token![=]>()?;
        if input.is_empty() || input.peek(Token![,]) {
            return Err(syn::Error::new_spanned(
                &name,
                format!("`{key}` needs a value after `=`"),
            ));
        }
        let value: Expr = match input.parse() {
            Ok(value) => value,
            Err(error) => {
                skip_to_comma(input);
                return Err(error);
            }
        };
        let second = name.clone();
        let duplicate = || syn::Error::new_spanned(&second, format!("`{key}` is given twice"));
        match key.as_str() {
            "read" => {
                let keys = read_keys(&value)?;
                set_once(&mut self.read, Read { name, keys }, duplicate)
            }
            "permits" => {
                let count = permit_count(&value)?;
                set_once(&mut self.permits, Permits { name, count }, duplicate)
            }
            "ttl" => set_once(&mut self.ttl, duration(&value, "ttl", false)?, duplicate),
            "wait" => set_once(&mut self.wait, duration(&value, "wait", true)?, duplicate),
            "renew" => set_once(&mut self.renew, boolean(&value, "renew")?, duplicate),
            "fair" => set_once(&mut self.fair, boolean(&value, "fair")?, duplicate),
            "hold_at_least" => set_once(
                &mut self.hold_at_least,
                duration(&value, "hold_at_least", true)?,
                duplicate,
            ),
            "lease" => set_once(&mut self.lease, variable(&value)?, duplicate),
            "manager" => set_once(&mut self.manager, value, duplicate),
            "crate" => set_once(&mut self.krate, path(&value)?, duplicate),
            _ => Err(syn::Error::new_spanned(
                &name,
                format!("unknown option `{key}`; valid options are {OPTIONS}"),
            )),
        }
    }
}

/// `lease = NAME`: a plain identifier, the variable the body sees.
fn variable(value: &Expr) -> syn::Result<syn::Ident> {
    if let Expr::Path(path) = value {
        if path.qself.is_none() && path.attrs.is_empty() {
            if let Some(name) = path.path.get_ident().filter(|name| *name != "self") {
                return Ok(name.clone());
            }
        }
    }
    Err(syn::Error::new_spanned(
        value,
        "`lease` names the variable that holds the body's lease: write `lease = lease`, then \
         `lease.fencing_token()` in the body",
    ))
}

fn set_once<T>(
    slot: &mut Option<T>,
    value: T,
    duplicate: impl Fn() -> syn::Error,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(duplicate());
    }
    *slot = Some(value);
    Ok(())
}

fn skip_to_comma(input: ParseStream<'_>) {
    while !input.is_empty() && !input.peek(Token![,]) {
        let _ = input.parse::<proc_macro2::TokenTree>();
    }
}

/// `"key"` or `["key", ...]`.
fn parse_keys(input: ParseStream<'_>) -> syn::Result<Vec<LitStr>> {
    if input.peek(syn::token::Bracket) {
        let content;
        let bracket = syn::bracketed!(content in input);
        let keys = content.parse_terminated(|p| key_literal(p), Token![,])?;
        if keys.is_empty() {
            return Err(syn::Error::new(
                bracket.span.join(),
                "the key list is empty: give at least one key template",
            ));
        }
        return Ok(keys.into_iter().collect());
    }
    Ok(vec![key_literal(input)?])
}

fn key_literal(input: ParseStream<'_>) -> syn::Result<LitStr> {
    if input.peek(LitStr) {
        return input.parse();
    }
    if input.peek(syn::Ident) && input.peek2(Token![=]) {
        return Err(input.error(
            "the first argument is the lock key, a string literal such as \"order:{order_id}\"; \
             options come after it",
        ));
    }
    if input.peek(syn::Ident) {
        let name: syn::Ident = input.fork().parse()?;
        return Err(syn::Error::new_spanned(
            &name,
            format!(
                "the lock key is a string literal, not an expression: write `{name}` in braces \
                 inside one, as in \"{name}:{{{name}}}\""
            ),
        ));
    }
    Err(input.error("expected the lock key: a string literal such as \"order:{order_id}\""))
}

/// An integer of seconds, or a string with a unit: `"1500ms"`, `"2s"`, `"5m"`, `"1h"`, checked
/// here; any expression that is not a literal is evaluated per call.
fn duration(value: &Expr, what: &str, zero_ok: bool) -> syn::Result<DurationArg> {
    match value {
        Expr::Lit(_) | Expr::Unary(_) => {
            literal_duration(value, what, zero_ok).map(DurationArg::Literal)
        }
        Expr::Group(group) => duration(&group.expr, what, zero_ok),
        Expr::Paren(paren) => duration(&paren.expr, what, zero_ok),
        _ => Ok(DurationArg::Expr(value.clone())),
    }
}

fn literal_duration(value: &Expr, what: &str, zero_ok: bool) -> syn::Result<Millis> {
    let span = value.span();
    let bad = |message: String| Err(syn::Error::new(span, message));
    let millis = match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            if !int.suffix().is_empty() {
                return bad(format!(
                    "`{what}` takes whole seconds without a type suffix, or a string such as \"1500ms\""
                ));
            }
            let Ok(seconds) = int.base10_parse::<u64>() else {
                return bad(format!("`{what}` is too large"));
            };
            seconds.checked_mul(1000)
        }
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(text),
            ..
        }) => match parse_with_unit(&text.value()) {
            Ok(millis) => Some(millis),
            Err(why) => return bad(format!("`{what} = {:?}`: {why}", text.value())),
        },
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            ..
        }) => {
            return bad(format!("`{what}` cannot be negative"));
        }
        _ => {
            return bad(format!(
                "`{what}` takes an integer of seconds (`{what} = 30`) or a string with a unit \
                 (`{what} = \"1500ms\"`, \"2s\", \"5m\", \"1h\")"
            ))
        }
    };
    let Some(millis) = millis else {
        return bad(format!("`{what}` is too large"));
    };
    if millis == 0 && !zero_ok {
        return bad(format!("`{what}` must be greater than zero"));
    }
    if what == "ttl" && millis < 10 {
        return bad("`ttl` must be at least 10ms".to_owned());
    }
    if what == "ttl" && millis > MAX_TTL_MS {
        return bad(
            "`ttl` must be at most a year (365 days); use renewal for long work".to_owned(),
        );
    }
    Ok(Millis { millis, span })
}

/// `"1500ms"`, `"2s"`, `"5m"`, `"1h"` (spaces allowed between number and unit) in milliseconds.
pub(crate) fn parse_with_unit(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err("expected a whole number followed by a unit: ms, s, m or h".to_owned());
    }
    if unit.starts_with('.') {
        return Err("fractions are not supported: use a smaller unit, as in \"1500ms\"".to_owned());
    }
    let number: u64 = number
        .parse()
        .map_err(|_| "the number is too large".to_owned())?;
    let factor = match unit.trim() {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err("missing unit: write ms, s, m or h after the number".to_owned()),
        other => return Err(format!("unknown unit `{other}`: use ms, s, m or h")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| "the duration is too large".to_owned())
}

/// `read = "tpl"` or `read = ["tpl", ...]`, as written; the templates are checked with the
/// exclusive keys'.
fn read_keys(value: &Expr) -> syn::Result<Vec<LitStr>> {
    match value {
        Expr::Array(array) => {
            if array.elems.is_empty() {
                return Err(syn::Error::new(
                    array.bracket_token.span.join(),
                    "`read = []` names no key: give at least one key template, as in \
                     `read = [\"doc:{id}\"]`, or drop `read`",
                ));
            }
            let mut errors = Errors::default();
            let mut keys = Vec::new();
            for element in &array.elems {
                match read_key(element) {
                    Ok(key) => keys.push(key),
                    Err(error) => errors.push(error),
                }
            }
            errors.finish().map(|()| keys)
        }
        Expr::Group(group) => read_keys(&group.expr),
        _ => read_key(value).map(|key| vec![key]),
    }
}

fn read_key(value: &Expr) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(text),
            ..
        }) => Ok(text.clone()),
        Expr::Group(group) => read_key(&group.expr),
        Expr::Path(path) if path.path.get_ident().is_some() => {
            let name = path
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            Err(syn::Error::new_spanned(
                value,
                format!(
                    "a `read` key is a string literal, not an expression: write `{name}` in \
                     braces inside one, as in `read = \"{name}:{{{name}}}\"`"
                ),
            ))
        }
        _ => Err(syn::Error::new_spanned(
            value,
            "`read` takes a key template (`read = \"doc:{id}\"`) or an array of them \
             (`read = [\"a:{x}\", \"b:{y}\"]`)",
        )),
    }
}

/// `permits = 8` (checked here: at least one, at most `u32::MAX`), or any other expression of
/// an integer type, converted at every call.
fn permit_count(value: &Expr) -> syn::Result<PermitCount> {
    let bad = |message: &str| Err(syn::Error::new_spanned(value, message));
    match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(int), ..
        }) => {
            const INTEGERS: [&str; 12] = [
                "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128",
                "isize",
            ];
            if !int.suffix().is_empty() && !INTEGERS.contains(&int.suffix()) {
                return bad("`permits` takes a whole number of permits, such as `permits = 8`");
            }
            match int.base10_parse::<u32>() {
                Ok(0) => bad(
                    "`permits = 0` would never let anyone in: a semaphore needs at least one \
                     permit; write `permits = 1` or more",
                ),
                Ok(count) => Ok(PermitCount::Literal {
                    count,
                    span: value.span(),
                }),
                Err(_) => bad("`permits` is too large: at most 4294967295 (`u32::MAX`)"),
            }
        }
        Expr::Lit(_) => bad(
            "`permits` takes a whole number of permits (`permits = 8`), or an integer \
             expression evaluated at each call (`permits = settings.exports`)",
        ),
        Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr,
            ..
        }) if matches!(**expr, Expr::Lit(_)) => bad(
            "`permits` cannot be negative: a semaphore needs at least one permit; write \
             `permits = 1` or more",
        ),
        Expr::Group(group) => permit_count(&group.expr),
        Expr::Paren(paren) => permit_count(&paren.expr),
        _ => Ok(PermitCount::Expr(value.clone())),
    }
}

fn boolean(value: &Expr, what: &str) -> syn::Result<syn::LitBool> {
    match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Bool(b), ..
        }) => Ok(b.clone()),
        _ => Err(syn::Error::new_spanned(
            value,
            format!("`{what}` takes `true` or `false`"),
        )),
    }
}

fn path(value: &Expr) -> syn::Result<syn::Path> {
    match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(text),
            ..
        }) => text.parse().map_err(|_| {
            syn::Error::new_spanned(
                text,
                format!(
                    "`crate` takes the path of the distlock runtime as a string, such as \
                     `crate = \"distlock_runtime\"`; {:?} is not a path",
                    text.value()
                ),
            )
        }),
        _ => Err(syn::Error::new_spanned(
            value,
            "`crate` takes a string: `crate = \"path::to::distlock_runtime\"`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_with_unit, Args, Parsed, PermitCount};

    /// The attribute's arguments, and the option errors' messages.
    fn parse(attr: &str) -> (Args, Vec<String>) {
        let Parsed { args, errors } = syn::parse_str(attr).expect("the keys parse");
        let messages = match errors.finish() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        };
        (args, messages)
    }

    #[test]
    fn fair_takes_a_bool_once() {
        let (args, errors) = parse(r#""a:{id}", fair = true"#);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(args.fair.is_some_and(|fair| fair.value));
        let (args, errors) = parse(r#""a:{id}", fair = false"#);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(args.fair.is_some_and(|fair| !fair.value));
        assert!(parse(r#""a:{id}""#).0.fair.is_none());

        assert_eq!(
            parse(r#""a:{id}", fair = "yes""#).1,
            ["`fair` takes `true` or `false`"]
        );
        assert_eq!(
            parse(r#""a:{id}", fair = true, fair = false"#).1,
            ["`fair` is given twice"]
        );
        assert_eq!(
            parse(r#""a:{id}", fair"#).1,
            ["`fair` needs a value: `fair = ...`"]
        );
        assert!(parse(r#""a:{id}", fiar = true"#).1[0]
            .contains("`renew`, `fair`, `hold_at_least`, `lease`, `manager`"));
    }

    #[test]
    fn lease_takes_one_variable_name_once() {
        let name = |attribute: &str| {
            let parsed: Parsed = syn::parse_str(attribute).expect("parses");
            parsed.args.lease.map(|ident| ident.to_string())
        };
        assert_eq!(name(r#""a:{id}", lease = lease"#).as_deref(), Some("lease"));
        assert_eq!(
            name(r#""a:{id}", lease = held, ttl = 5"#).as_deref(),
            Some("held")
        );
        assert_eq!(name(r#""a:{id}""#), None);
        let refused = "`lease` names the variable that holds the body's lease: write \
                       `lease = lease`, then `lease.fencing_token()` in the body";
        assert_eq!(parse(r#""a:{id}", lease = "lease""#).1, [refused]);
        assert_eq!(parse(r#""a:{id}", lease = a.b"#).1, [refused]);
        assert_eq!(parse(r#""a:{id}", lease = ::a"#).1, [refused]);
        assert_eq!(parse(r#""a:{id}", lease = self"#).1, [refused]);
        assert_eq!(
            parse(r#""a:{id}", lease = a, lease = b"#).1,
            ["`lease` is given twice"]
        );
        assert_eq!(
            parse(r#""a:{id}", lease"#).1,
            ["`lease` needs a value: `lease = ...`"]
        );
    }

    /// The keys as written: exclusive, then shared.
    fn keys(args: &Args) -> (Vec<String>, Vec<String>) {
        let values = |keys: &[syn::LitStr]| keys.iter().map(syn::LitStr::value).collect();
        let read = args
            .read
            .as_ref()
            .map_or(Vec::new(), |read| values(&read.keys));
        (values(&args.keys), read)
    }

    #[test]
    fn read_takes_one_template_or_an_array_alone_or_after_the_keys() {
        for (attr, exclusive, shared) in [
            (r#"read = "doc:{id}""#, &[][..], &["doc:{id}"][..]),
            (
                r#"read = ["a:{x}", "b:{y}"], ttl = 5"#,
                &[],
                &["a:{x}", "b:{y}"],
            ),
            (r#"ttl = 5, read = "doc:{id}""#, &[], &["doc:{id}"]),
            (r#""w:{id}", read = "r:{id}""#, &["w:{id}"], &["r:{id}"]),
            (
                r#"["w:{id}", "v:{id}"], read = ["r:{id}"]"#,
                &["w:{id}", "v:{id}"],
                &["r:{id}"],
            ),
        ] {
            let (args, errors) = parse(attr);
            assert!(errors.is_empty(), "{attr}: {errors:?}");
            assert_eq!(
                keys(&args),
                (
                    exclusive.iter().map(|k| k.to_string()).collect(),
                    shared.iter().map(|k| k.to_string()).collect()
                ),
                "{attr}"
            );
        }
    }

    #[test]
    fn read_refuses_no_key_and_expressions() {
        assert_eq!(
            parse(r#""a:{id}", read = []"#).1,
            [
                "`read = []` names no key: give at least one key template, as in \
              `read = [\"doc:{id}\"]`, or drop `read`"
            ]
        );
        assert_eq!(
            parse(r#""a:{id}", read"#).1,
            ["`read` needs a value: `read = ...`"]
        );
        assert_eq!(
            parse(r#""a:{id}", read = , ttl = 5"#).1,
            ["`read` needs a value after `=`"]
        );
        assert_eq!(
            parse(r#""a:{id}", read = "b:{id}", read = "c:{id}""#).1,
            ["`read` is given twice"]
        );
        assert!(parse(r#""a:{id}", read = id"#).1[0].contains(r#"read = "id:{id}""#));
        assert!(parse(r#""a:{id}", read = ["b:{id}", 5]"#).1[0]
            .starts_with("`read` takes a key template"));
        // Without exclusive keys, a bad `read` is reported alone, not as a missing key too.
        for attr in [r#"read = []"#, r#"read"#, r#"read = 5, ttl = 1"#] {
            let Parsed { args, errors } = syn::parse_str(attr).expect("a `read` names keys");
            assert!(args.keys.is_empty() && args.read.is_none(), "{attr}");
            assert_eq!(
                errors.finish().map_err(|e| e.into_iter().count()),
                Err(1),
                "{attr}"
            );
        }
    }

    #[test]
    fn options_alone_still_need_a_key() {
        for attr in ["ttl = 5", "fair = true, permits = 2", r#"crate = "lock""#] {
            let error = syn::parse_str::<Parsed>(attr).err().expect("no key");
            assert!(
                error
                    .to_string()
                    .starts_with("the first argument is the lock key"),
                "{attr}: {error}"
            );
        }
        // A key after the options.
        assert!(parse(r#"read = "r:{id}", "w:{id}""#).1[0]
            .starts_with("the keys held exclusively come first"));
    }

    #[test]
    fn permits_take_a_positive_literal_or_an_expression() {
        for (attr, count) in [
            ("8", 8),
            ("1", 1),
            ("8u64", 8),
            ("(3)", 3),
            ("4294967295", u32::MAX),
        ] {
            let (args, errors) = parse(&format!(r#""a", permits = {attr}"#));
            assert!(errors.is_empty(), "{attr}: {errors:?}");
            assert!(
                matches!(args.permits.map(|p| p.count), Some(PermitCount::Literal { count: c, .. }) if c == count),
                "{attr}"
            );
        }
        for attr in ["settings.permits", "PERMITS", "n * 2", "-n"] {
            let (args, errors) = parse(&format!(r#""a", permits = {attr}"#));
            assert!(errors.is_empty(), "{attr}: {errors:?}");
            assert!(
                matches!(args.permits.map(|p| p.count), Some(PermitCount::Expr(_))),
                "{attr}"
            );
        }
        for (attr, message) in [
            ("0", "`permits = 0` would never let anyone in"),
            ("-1", "`permits` cannot be negative"),
            ("4294967296", "`permits` is too large"),
            ("\"8\"", "`permits` takes a whole number of permits"),
            ("8.0", "`permits` takes a whole number of permits"),
            ("8f32", "`permits` takes a whole number of permits"),
        ] {
            let errors = parse(&format!(r#""a", permits = {attr}"#)).1;
            assert!(
                errors.len() == 1 && errors[0].starts_with(message),
                "{attr}: {errors:?}"
            );
        }
        assert_eq!(
            parse(r#""a", permits = 2, permits = 3"#).1,
            ["`permits` is given twice"]
        );
    }

    #[test]
    fn durations_with_units() {
        assert_eq!(parse_with_unit("1500ms"), Ok(1500));
        assert_eq!(parse_with_unit("2s"), Ok(2000));
        assert_eq!(parse_with_unit("5 m"), Ok(300_000));
        assert_eq!(parse_with_unit("1h"), Ok(3_600_000));
        assert!(parse_with_unit("5 parsecs")
            .unwrap_err()
            .contains("parsecs"));
        assert!(parse_with_unit("abc").is_err());
        assert!(parse_with_unit("10").unwrap_err().contains("missing unit"));
        assert!(parse_with_unit("99999999999999999999s").is_err());
        assert!(parse_with_unit("1.5s").unwrap_err().contains("1500ms"));
    }
}
