//! Key templates: `"order:{order_id}"`, `"user:{user.id}"`, `"{self.shard}"`, with `{{` and `}}`
//! for literal braces. Parsed at compile time into text and placeholders; each placeholder is a
//! path rooted at a parameter of the fn (or `self`).

use std::ops::Range;

use syn::LitStr;

/// One parsed key template.
pub(crate) struct Template {
    pub(crate) literal: LitStr,
    pub(crate) parts: Vec<Part>,
}

/// A piece of a template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Part {
    /// Literal text, braces already unescaped.
    Text(String),
    /// `{root.field.sub}`: the root names a parameter or `self`, then zero or more fields.
    Placeholder { root: String, fields: Vec<Field> },
}

/// A field of a placeholder's path, and where it is written: its byte range in the template's
/// value, so an error about the field can point at it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Field {
    pub(crate) name: String,
    pub(crate) at: Range<usize>,
}

impl Template {
    /// The template's lock class: its text with each placeholder blanked (`acct:{a}` is
    /// `acct:{}`), so every key it renders is of one class.
    pub(crate) fn class(&self) -> String {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Text(text) => text.as_str(),
                Part::Placeholder { .. } => "{}",
            })
            .collect()
    }

    pub(crate) fn parse(literal: &LitStr) -> syn::Result<Self> {
        let parts = parse_parts(&literal.value())
            .map_err(|message| syn::Error::new_spanned(literal, message))?;
        Ok(Self {
            literal: literal.clone(),
            parts,
        })
    }

    /// The roots its placeholders name.
    pub(crate) fn roots(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::Placeholder { root, .. } => Some(root.as_str()),
            Part::Text(_) => None,
        })
    }
}

fn parse_parts(text: &str) -> Result<Vec<Part>, String> {
    if text.is_empty() {
        return Err("the lock key is empty: give a key such as \"order:{order_id}\"".to_owned());
    }
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                chars.next();
                literal.push('{');
            }
            '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                chars.next();
                literal.push('}');
            }
            '}' => {
                return Err(format!(
                    "unmatched `}}` at byte {at} of the key: write `}}}}` for a literal brace"
                ))
            }
            '{' => {
                let rest = &text[at + 1..];
                let Some(end) = rest.find('}') else {
                    return Err(format!(
                        "unclosed `{{` at byte {at} of the key: close the placeholder with `}}`, \
                         or write `{{{{` for a literal brace"
                    ));
                };
                let inner = &rest[..end];
                for _ in 0..inner.chars().count() + 1 {
                    chars.next();
                }
                if !literal.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut literal)));
                }
                parts.push(placeholder(inner, at + 1)?);
            }
            c => literal.push(c),
        }
    }
    if !literal.is_empty() {
        parts.push(Part::Text(literal));
    }
    Ok(parts)
}

/// `name`, `name.field.sub` or `self.field` (spaces around it allowed), written at byte `start`
/// of the template.
fn placeholder(inner: &str, start: usize) -> Result<Part, String> {
    let trimmed = inner.trim();
    if trimmed.is_empty() {
        return Err(
            "empty placeholder `{}`: name a parameter, as in \"order:{order_id}\"".to_owned(),
        );
    }
    // Each segment, trimmed, with the byte where it starts in the template.
    let mut segments = Vec::new();
    let mut offset = start;
    for segment in inner.split('.') {
        let name = segment.trim();
        segments.push((name, offset + segment.len() - segment.trim_start().len()));
        offset += segment.len() + 1;
    }
    let (root, _) = segments.remove(0);
    let is_ident = |s: &str| syn::parse_str::<syn::Ident>(s).is_ok() || s == "self";
    let is_field = |s: &str| syn::parse_str::<syn::Member>(s).is_ok();
    if !is_ident(root) || !segments.iter().all(|(f, _)| is_field(f)) {
        return Err(format!(
            "placeholder `{{{inner}}}` is not a parameter or field path: placeholders name a \
             parameter, optionally with fields (`{{order.id}}`, `{{self.shard}}`); compute \
             anything else into a parameter first"
        ));
    }
    Ok(Part::Placeholder {
        root: root.to_owned(),
        fields: segments
            .into_iter()
            .map(|(name, at)| Field {
                name: name.to_owned(),
                at: at..at + name.len(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A placeholder, its fields given with the byte where each starts in the template.
    fn ph(root: &str, fields: &[(&str, usize)]) -> Part {
        Part::Placeholder {
            root: root.to_owned(),
            fields: fields
                .iter()
                .map(|&(name, at)| Field {
                    name: name.to_owned(),
                    at: at..at + name.len(),
                })
                .collect(),
        }
    }

    #[test]
    fn text_and_placeholders() {
        assert_eq!(
            parse_parts("order:{order_id}").unwrap(),
            [Part::Text("order:".into()), ph("order_id", &[])]
        );
        assert_eq!(
            parse_parts("{user.id}:{ self.shard }:{pair.0}").unwrap(),
            [
                ph("user", &[("id", 6)]),
                Part::Text(":".into()),
                ph("self", &[("shard", 17)]),
                Part::Text(":".into()),
                ph("pair", &[("0", 31)]),
            ]
        );
    }

    #[test]
    fn a_class_blanks_every_placeholder() {
        let class = |text: &str| {
            Template::parse(&LitStr::new(text, proc_macro2::Span::call_site()))
                .unwrap()
                .class()
        };
        assert_eq!(class("acct:{a}"), "acct:{}");
        assert_eq!(class("acct:{ b.id }:{c.0}"), "acct:{}:{}");
        assert_eq!(class("{{tag}}:{id}"), "{tag}:{}");
        assert_eq!(class("plain"), "plain");
    }

    #[test]
    fn fields_know_where_they_are_written() {
        let text = "é:{ req . from .x }";
        let parts = parse_parts(text).unwrap();
        assert_eq!(parts[1], ph("req", &[("from", 11), ("x", 17)]));
        let Part::Placeholder { fields, .. } = &parts[1] else {
            unreachable!("a placeholder")
        };
        for field in fields {
            assert_eq!(text[field.at.clone()], field.name);
        }
    }

    #[test]
    fn doubled_braces_are_literal() {
        assert_eq!(
            parse_parts("a{{b}}c{x}").unwrap(),
            [Part::Text("a{b}c".into()), ph("x", &[])]
        );
        assert_eq!(parse_parts("{{}}").unwrap(), [Part::Text("{}".into())]);
    }

    #[test]
    fn malformed_templates_are_refused() {
        assert!(parse_parts("").unwrap_err().contains("empty"));
        assert!(parse_parts("order:{id").unwrap_err().contains("unclosed"));
        assert!(parse_parts("order:}").unwrap_err().contains("unmatched"));
        assert!(parse_parts("{}").unwrap_err().contains("empty placeholder"));
        assert!(parse_parts("{a + b}")
            .unwrap_err()
            .contains("not a parameter"));
        assert!(parse_parts("{a.b()}")
            .unwrap_err()
            .contains("not a parameter"));
        assert!(parse_parts("{x.self}")
            .unwrap_err()
            .contains("not a parameter"));
    }

    #[test]
    fn non_ascii_text_survives() {
        assert_eq!(
            parse_parts("é:{x}ü").unwrap(),
            [
                Part::Text("é:".into()),
                ph("x", &[]),
                Part::Text("ü".into())
            ]
        );
    }
}
