//! The attribute's arguments as a spanned model: `KEYS, ttl = .., wait = .., renew = ..,
//! fair = .., manager = .., crate = ".."`, each option set at most once.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, Lit, LitStr, Token};

use crate::errors::Errors;

/// The longest ttl the runtime accepts (`distlock_runtime::MAX_TTL`), in milliseconds.
const MAX_TTL_MS: u64 = 365 * 24 * 60 * 60 * 1000;

/// The options the attribute accepts, for "unknown option" messages.
pub(crate) const OPTIONS: &str =
    "`ttl`, `wait`, `renew`, `fair`, `hold_at_least`, `manager`, `crate`";

/// The parsed attribute.
pub(crate) struct Args {
    /// The key templates, in the order written.
    pub(crate) keys: Vec<LitStr>,
    pub(crate) ttl: Option<DurationArg>,
    pub(crate) wait: Option<DurationArg>,
    pub(crate) renew: Option<syn::LitBool>,
    pub(crate) fair: Option<syn::LitBool>,
    pub(crate) hold_at_least: Option<DurationArg>,
    pub(crate) manager: Option<Expr>,
    pub(crate) krate: Option<syn::Path>,
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
        let keys = parse_keys(input)?;
        let mut args = Args {
            keys,
            ttl: None,
            wait: None,
            renew: None,
            fair: None,
            hold_at_least: None,
            manager: None,
            krate: None,
        };
        let mut errors = Errors::default();
        while !input.is_empty() {
            if let Err(error) = input.parse::<Token![,]>() {
                errors.push(error);
                skip_to_comma(input);
                continue;
            }
            if input.is_empty() {
                break;
            }
            if input.peek(LitStr) {
                let literal: LitStr = input.parse()?;
                errors.push(syn::Error::new_spanned(
                    literal,
                    "several keys go in one array: #[distributed_lock([\"a:{x}\", \"b:{y}\"])]",
                ));
                continue;
            }
            if let Err(error) = args.parse_option(input) {
                errors.push(error);
            }
        }
        Ok(Parsed { args, errors })
    }
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
                match key.as_str() {
                    "ttl" | "wait" | "renew" | "fair" | "hold_at_least" | "manager" | "crate" => {
                        format!("`{key}` needs a value: `{key} = ...`")
                    }
                    _ => format!("unknown option `{key}`; valid options are {OPTIONS}"),
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
        let duplicate = || syn::Error::new_spanned(&name, format!("`{key}` is given twice"));
        match key.as_str() {
            "ttl" => set_once(&mut self.ttl, duration(&value, "ttl", false)?, duplicate),
            "wait" => set_once(&mut self.wait, duration(&value, "wait", true)?, duplicate),
            "renew" => set_once(&mut self.renew, boolean(&value, "renew")?, duplicate),
            "fair" => set_once(&mut self.fair, boolean(&value, "fair")?, duplicate),
            "hold_at_least" => set_once(
                &mut self.hold_at_least,
                duration(&value, "hold_at_least", true)?,
                duplicate,
            ),
            "manager" => set_once(&mut self.manager, value, duplicate),
            "crate" => set_once(&mut self.krate, path(&value)?, duplicate),
            _ => Err(syn::Error::new_spanned(
                &name,
                format!("unknown option `{key}`; valid options are {OPTIONS}"),
            )),
        }
    }
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
    use super::{parse_with_unit, Args, Parsed};

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
            .contains("`renew`, `fair`, `hold_at_least`, `manager`"));
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
