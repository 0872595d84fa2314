//! The annotated fn, parsed lightly: attributes, visibility and signature are parsed; the body
//! is kept as tokens, quoted once into the expansion.

use proc_macro2::{TokenStream, TokenTree};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, FnArg, Pat, Signature, Visibility};

/// An `async fn` with a body, as written.
pub(crate) struct LockedFn {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    /// The body, braces included.
    pub(crate) body: TokenStream,
}

impl Parse for LockedFn {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        // rustc hands attribute macros only well-formed items, so a signature that does not
        // parse means the attribute sits on something else (a struct, an impl block, ...).
        let sig: Signature = input.parse().map_err(|error| {
            syn::Error::new(
                error.span(),
                format!("{error}: `#[distributed_lock]` goes on an `async fn`"),
            )
        })?;
        if !input.peek(syn::token::Brace) {
            return Err(syn::Error::new_spanned(
                &sig.ident,
                "`#[distributed_lock]` goes on a fn with a body (in an impl block, not a trait \
                 declaration)",
            ));
        }
        let body = TokenStream::from(input.parse::<TokenTree>()?);
        Ok(Self {
            attrs,
            vis,
            sig,
            body,
        })
    }
}

impl LockedFn {
    /// Whether the fn takes `self` in some form.
    pub(crate) fn has_receiver(&self) -> bool {
        self.sig.receiver().is_some()
    }

    /// The names the parameters bind (through patterns too: `Path(id): Path<u64>` binds `id`).
    pub(crate) fn parameter_names(&self) -> Vec<syn::Ident> {
        let mut names = Vec::new();
        for input in &self.sig.inputs {
            if let FnArg::Typed(typed) = input {
                bound_names(&typed.pat, &mut names);
            }
        }
        names
    }
}

fn bound_names(pat: &Pat, names: &mut Vec<syn::Ident>) {
    match pat {
        Pat::Ident(ident) => {
            names.push(ident.ident.clone());
            if let Some((_, sub)) = &ident.subpat {
                bound_names(sub, names);
            }
        }
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(structure) => structure
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        _ => {}
    }
}
