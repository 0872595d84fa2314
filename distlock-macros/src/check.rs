//! Checks across the attribute and the fn: an `async fn` returning a `Result`, every
//! placeholder naming a parameter, `fair = true` on a single key, `permits` on a single
//! exclusive key without `read`, and no key both exclusive and shared. All problems are
//! reported at once, each on its own token.

use syn::{LitStr, ReturnType, Type};

use crate::args::Args;
use crate::errors::Errors;
use crate::item::LockedFn;
use crate::key::{Part, Template};

/// Checks the signature: an `async fn` returning something that can be a `Result`.
pub(crate) fn signature(item: &LockedFn, errors: &mut Errors) {
    if item.sig.asyncness.is_none() {
        errors.push(syn::Error::new_spanned(
            item.sig.fn_token,
            "`#[distributed_lock]` needs an `async fn`: the lock is held across the body's awaits",
        ));
    }
    match &item.sig.output {
        ReturnType::Default => errors.push(syn::Error::new(
            item.sig.paren_token.span.join(),
            "`#[distributed_lock]` functions must return `Result<T, E>` with \
             `E: From<distlock_runtime::LockError>`, so a lock failure can be returned",
        )),
        ReturnType::Type(_, ty) => {
            if let Type::ImplTrait(_) = &**ty {
                errors.push(syn::Error::new_spanned(
                    ty,
                    "`#[distributed_lock]` functions must return `Result<T, E>` with \
                     `E: From<distlock_runtime::LockError>`, not `impl Trait`; \
                     `Result<impl Trait, E>` keeps the value opaque",
                ));
            }
        }
    }
}

/// Checks options against each other and the keys: `fair = true` and `permits` lock a single
/// key, and a key is either exclusive or shared.
pub(crate) fn options(args: &Args, errors: &mut Errors) {
    let read = args.read.as_ref().map_or(&[][..], |read| &read.keys[..]);
    // Fair waiters queue on one lock key; a lease over several keys has no single queue to
    // wait in, so it cannot keep arrival order. Literals are counted as written, shared or not.
    if let Some(fair) = args.fair.as_ref().filter(|fair| fair.value) {
        if args.keys.len() + read.len() > 1 {
            let shared_too = if read.is_empty() {
                ""
            } else {
                " (the `read` keys count too)"
            };
            errors.push(syn::Error::new_spanned(
                fair,
                format!(
                    "`fair = true` needs a single key{shared_too}: waiters queue on one key at a \
                     time, so several keys cannot be fair; lock one key, or drop `fair`"
                ),
            ));
        }
    }
    // A semaphore is one key whose holders each take a permit; the runtime refuses the rest
    // too, but only once the call runs.
    if let Some(permits) = &args.permits {
        if args.keys.len() > 1 {
            errors.push(syn::Error::new_spanned(
                &permits.name,
                format!(
                    "`permits` makes one key a semaphore, and {} keys are given: write a single \
                     key, as in #[distributed_lock(\"exports\", permits = 8)], or drop `permits` \
                     to lock the keys exclusively",
                    args.keys.len()
                ),
            ));
        }
        if let Some(read) = &args.read {
            errors.push(syn::Error::new_spanned(
                &read.name,
                "`read` cannot be combined with `permits`: a semaphore is one key, each holder \
                 taking a permit; take the shared keys in a call of their own, or drop `permits`",
            ));
        }
    }
    // Compared as written: the same template both ways is a mistake whatever the arguments.
    for shared in read {
        if args.keys.iter().any(|key| key.value() == shared.value()) {
            errors.push(syn::Error::new_spanned(
                shared,
                format!(
                    "{:?} is also a key held exclusively, which already keeps readers and \
                     writers out: remove it from `read`, or from the exclusive keys to hold it \
                     shared",
                    shared.value()
                ),
            ));
        }
    }
}

/// The parsed templates of the keys held exclusively and of those held shared (`read`).
pub(crate) struct Templates {
    pub(crate) keys: Vec<Template>,
    pub(crate) read: Vec<Template>,
}

/// Parses the key templates, exclusive and shared, and checks each placeholder against the
/// fn's parameters.
pub(crate) fn templates(args: &Args, item: &LockedFn, errors: &mut Errors) -> Templates {
    let parameters = item.parameter_names();
    // `lease = id` would hide the parameter `id` from the body: surely a slip.
    if let Some(lease) = args.lease.as_ref().filter(|l| parameters.contains(l)) {
        errors.push(syn::Error::new_spanned(
            lease,
            format!(
                "`lease = {lease}` would hide the parameter `{lease}` in the body; name the \
                 lease's variable otherwise, as in `lease = lease`"
            ),
        ));
    }
    let mut parse = |literals: &[LitStr]| {
        literals
            .iter()
            .filter_map(|literal| template(literal, &parameters, item, errors))
            .collect()
    };
    let keys = parse(&args.keys);
    let read = parse(args.read.as_ref().map_or(&[][..], |read| &read.keys[..]));
    Templates { keys, read }
}

/// One template, parsed and checked; `None` when it does not parse.
fn template(
    literal: &LitStr,
    parameters: &[syn::Ident],
    item: &LockedFn,
    errors: &mut Errors,
) -> Option<Template> {
    let template = match Template::parse(literal) {
        Ok(template) => template,
        Err(error) => {
            errors.push(error);
            return None;
        }
    };
    if let Some(message) = unseparated_placeholders(&template) {
        errors.push(syn::Error::new_spanned(literal, message));
    }
    for root in template.roots() {
        let known = if root == "self" {
            item.has_receiver()
        } else {
            parameters.iter().any(|p| p == root)
        };
        if !known {
            errors.push(syn::Error::new_spanned(
                literal,
                unknown_placeholder(root, parameters, item.has_receiver()),
            ));
        }
    }
    Some(template)
}

/// Two placeholders need text with an escaped character (`:`, `{`, `}`, `%`) between them:
/// values never contain one, so the rendered key splits back into the same values, and distinct
/// arguments never render the same key. `"{a}{b}"` would render `ab` for both `("a", "b")` and
/// `("ab", "")`.
/// Characters that can separate two placeholders: the runtime's escaping turns each of them
/// into `%XX` inside a value, so a value never contains one, and the first one after a value
/// marks where it ends. `%` is not among them: escaping writes it into values.
pub(crate) const SEPARATORS: [char; 3] = [':', '{', '}'];

fn unseparated_placeholders(template: &Template) -> Option<String> {
    let mut previous: Option<&str> = None;
    let mut separated = true;
    let mut percent = false;
    for part in &template.parts {
        match part {
            Part::Text(text) => {
                separated |= text.contains(SEPARATORS);
                percent |= text.contains('%');
            }
            Part::Placeholder { root, .. } => {
                if let (Some(before), false) = (previous, separated) {
                    let why = if percent {
                        "; `%` does not separate them, because values are percent-encoded \
                         and contain `%` themselves"
                    } else {
                        ""
                    };
                    return Some(format!(
                        "placeholders `{{{before}}}` and `{{{root}}}` need a `:` between \
                         them (as in \"{{{before}}}:{{{root}}}\"), or different arguments could \
                         render the same key{why}"
                    ));
                }
                previous = Some(root);
                separated = false;
                percent = false;
            }
        }
    }
    None
}

fn unknown_placeholder(root: &str, parameters: &[syn::Ident], has_self: bool) -> String {
    let mut names: Vec<String> = parameters.iter().map(|p| format!("`{p}`")).collect();
    if has_self {
        names.insert(0, "`self`".to_owned());
    }
    if root == "self" {
        return "placeholder `{self...}` in a fn without a `self` parameter".to_owned();
    }
    if names.is_empty() {
        return format!("placeholder `{{{root}}}` names no parameter: this fn has no parameters");
    }
    format!(
        "placeholder `{{{root}}}` names no parameter; the parameters are {}",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::{options, unseparated_placeholders};
    use crate::args::Parsed;
    use crate::errors::Errors;
    use crate::key::Template;

    fn separated(template: &str) -> Result<(), String> {
        let literal = syn::LitStr::new(template, proc_macro2::Span::call_site());
        let template = Template::parse(&literal).expect("the template parses");
        unseparated_placeholders(&template).map_or(Ok(()), Err)
    }

    #[test]
    fn placeholders_need_a_separator_that_escaping_never_writes() {
        for ok in [
            "{a}:{b}",
            "{a}-:-{b}",
            "{a}{{{b}",
            "{a}}}{b}",
            "x{a}y",
            "{a}%",
            "%{a}",
        ] {
            assert_eq!(separated(ok), Ok(()), "{ok}");
        }
        for bad in ["{a}{b}", "{a}-{b}", "{a}.{b}", "{a}/{b}"] {
            assert!(separated(bad).is_err(), "{bad}");
        }
        let percent = separated("{a}%{b}").unwrap_err();
        assert!(percent.contains("`%` does not separate them"), "{percent}");
        // `%` beside a real separator is fine.
        assert_eq!(separated("{a}%:{b}"), Ok(()));
    }

    fn option_errors(attr: &str) -> Vec<String> {
        let parsed: Parsed = syn::parse_str(attr).expect("the keys parse");
        let mut errors = Errors::default();
        options(&parsed.args, &mut errors);
        match errors.finish() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn fair_needs_a_single_key() {
        assert!(option_errors(r#""a:{id}", fair = true"#).is_empty());
        assert!(option_errors(r#"["a:{id}"], fair = true"#).is_empty());
        assert!(option_errors(r#"["a:{id}", "b:{id}"], fair = false"#).is_empty());
        assert!(option_errors(r#"["a:{id}", "b:{id}"]"#).is_empty());
        let errors = option_errors(r#"["a:{id}", "b:{id}"], fair = true"#);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("`fair = true` needs a single key:"));
    }

    #[test]
    fn fair_counts_the_read_keys_too() {
        assert!(option_errors(r#"read = "a:{id}", fair = true"#).is_empty());
        assert!(option_errors(r#""a:{id}", read = "b:{id}", fair = false"#).is_empty());
        for attr in [
            r#""a:{id}", read = "b:{id}", fair = true"#,
            r#"read = ["a:{id}", "b:{id}"], fair = true"#,
        ] {
            let errors = option_errors(attr);
            assert_eq!(errors.len(), 1, "{attr}");
            assert!(
                errors[0]
                    .starts_with("`fair = true` needs a single key (the `read` keys count too)"),
                "{attr}: {errors:?}"
            );
        }
    }

    #[test]
    fn permits_take_one_exclusive_key_and_no_read() {
        assert!(option_errors(r#""exports", permits = 8"#).is_empty());
        assert!(option_errors(r#"["exports"], permits = n, fair = true"#).is_empty());
        let several = option_errors(r#"["a:{id}", "b:{id}"], permits = 2"#);
        assert_eq!(several.len(), 1);
        assert!(several[0].starts_with("`permits` makes one key a semaphore, and 2 keys are given"));
        for attr in [
            r#""a:{id}", read = "b:{id}", permits = 2"#,
            r#"read = "b:{id}", permits = 2"#,
        ] {
            let errors = option_errors(attr);
            assert_eq!(errors.len(), 1, "{attr}");
            assert!(
                errors[0].starts_with("`read` cannot be combined with `permits`"),
                "{attr}"
            );
        }
    }

    #[test]
    fn a_key_is_either_exclusive_or_shared() {
        assert!(option_errors(r#""a:{id}", read = ["a:{other}", "b:{id}"]"#).is_empty());
        let errors = option_errors(r#"["a:{id}", "b:{id}"], read = ["c:{id}", "b:{id}"]"#);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with(r#""b:{id}" is also a key held exclusively"#),
            "{errors:?}"
        );
    }
}
