//! The generated wrapper: render the keys, pick the manager, and hand the body to the runtime
//! in one call. Also the fallback that keeps the user's fn alive beside a compile error.

use std::ops::Range;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::visit_mut::VisitMut;
use syn::{LitStr, ReturnType, Type};

use crate::args::{Args, DurationArg, Millis, PermitCount};
use crate::check::Templates;
use crate::item::LockedFn;
use crate::key::{Part, Template};

/// The annotated fn, rewritten to run its body under the lock.
pub(crate) fn expand(args: &Args, templates: &Templates, item: &LockedFn) -> TokenStream {
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::distlock_runtime),
    };
    let private = quote!(#krate::__private);
    let LockedFn {
        attrs, vis, sig, ..
    } = item;
    // The return type as it may be named inside the body: `Result<impl Trait, E>` becomes
    // `Result<_, E>` (an `impl Trait` cannot be written in a path or a `let`).
    let output = match &sig.output {
        ReturnType::Type(_, ty) => {
            let mut ty = (**ty).clone();
            InferImplTrait.visit_type_mut(&mut ty);
            ty.to_token_stream()
        }
        // Refused by the checks; kept total for the fallback path.
        ReturnType::Default => quote!(()),
    };
    // Spanned on the return type: "not a Result" / "no From<LockError>" point there, once.
    let on_error = quote_spanned!(span_of(&output)=>
        <#output as #private::LockResult>::from_lock_error
    );
    // Generated locals live in the macro's hygiene: a parameter of the same name is untouched.
    let keys_local = format_ident!("__distlock_keys", span = Span::mixed_site());
    let read_local = format_ident!("__distlock_read", span = Span::mixed_site());
    let manager_local = format_ident!("__distlock_manager", span = Span::mixed_site());
    let return_local = format_ident!("__distlock_return", span = Span::mixed_site());
    let keys = templates.keys.iter().map(|t| render(t, &private, item));
    let read = templates.read.iter().map(|t| render(t, &private, item));
    let manager = match &args.manager {
        Some(expr) => quote_spanned!(span_of(expr)=> #private::manager(#expr)),
        None => quote!(#private::default_manager()),
    };
    let ttl = option_duration(args.ttl.as_ref(), "ttl", &private);
    let wait = option_duration(args.wait.as_ref(), "wait", &private);
    let renew = args.renew.as_ref().is_none_or(syn::LitBool::value);
    let hold_at_least = option_duration(args.hold_at_least.as_ref(), "hold_at_least", &private);
    let permits = match args.permits.as_ref().map(|permits| &permits.count) {
        Some(PermitCount::Literal { count, span }) => quote_spanned!(*span=>
            ::core::option::Option::Some(::core::result::Result::Ok(#count))
        ),
        Some(PermitCount::Expr(expr)) => quote_spanned!(span_of(expr)=>
            ::core::option::Option::Some(#private::IntoPermits::into_permits(#expr))
        ),
        None => quote!(::core::option::Option::None),
    };
    // The templates as written, exclusive then shared, for metrics: never the rendered keys.
    let template = args
        .keys
        .iter()
        .chain(args.read.iter().flat_map(|read| &read.keys))
        .map(syn::LitStr::value)
        .collect::<Vec<_>>()
        .join(",");
    // The lock order check's classes: each key's template with its placeholders blanked, in
    // the keys' order (exclusive, then shared), and the fn's path for its warnings.
    let classes = templates
        .keys
        .iter()
        .chain(&templates.read)
        .map(Template::class);
    let name = item.sig.ident.to_string();
    let fair = match &args.fair {
        Some(fair) => quote!(::core::option::Option::Some(#fair)),
        None => quote!(::core::option::Option::None),
    };
    let body = rebrace(&item.body);
    // `lease = NAME`: the body's lease, bound before the body's first statement (inside the
    // lease's scope, where the runtime always has one).
    let lease = args.lease.as_ref().map(|name| {
        quote_spanned!(name.span()=>
            let #name: #private::CurrentLease = #private::body_lease();
        )
    });

    quote! {
        #(#attrs)*
        #vis #sig {
            let #keys_local: ::std::vec::Vec<::std::string::String> = ::std::vec![#(#keys),*];
            let #read_local: ::std::vec::Vec<::std::string::String> = ::std::vec![#(#read),*];
            let #manager_local = #manager;
            #private::run(
                #manager_local,
                #keys_local,
                #private::Options {
                    read: #read_local,
                    permits: #permits,
                    ttl: #ttl,
                    wait: #wait,
                    renew: #renew,
                    fair: #fair,
                    hold_at_least: #hold_at_least,
                    template: #template,
                    classes: &[#(#classes),*],
                    name: ::core::concat!(::core::module_path!(), "::", #name),
                },
                #on_error,
                // Boxed once, so nesting annotated calls does not multiply the future's size.
                ::std::boxed::Box::pin(async move {
                    // Fixes the block's type to the fn's return type, so `?` in the body
                    // converts errors as it would in the fn itself.
                    #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop)]
                    if false {
                        let #return_local: #output = loop {};
                        return #return_local;
                    }
                    #lease
                    #body
                }),
            )
            .await
        }
    }
}

/// The body's statements in braces of the macro's own: as the tail of the generated block, the
/// user's braces would trip `unused_braces` on a one-line body.
fn rebrace(body: &TokenStream) -> TokenStream {
    match body.clone().into_iter().next() {
        Some(TokenTree::Group(group)) => {
            let inner = group.stream();
            quote!({ #inner })
        }
        _ => body.clone(),
    }
}

/// Replaces every `impl Trait` in a type with `_`.
struct InferImplTrait;

impl VisitMut for InferImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            let span = syn::spanned::Spanned::span(&*impl_trait);
            *ty = Type::Infer(syn::TypeInfer {
                underscore_token: syn::Token![_](span),
            });
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}

/// One key template as an expression rendering it (parameters escaped by the runtime).
fn render(template: &Template, private: &TokenStream, item: &LockedFn) -> TokenStream {
    let span = template.literal.span();
    let parts = template.parts.iter().map(|part| match part {
        Part::Text(text) => quote_spanned!(span=> #private::KeyPart::Text(#text)),
        Part::Placeholder { root, fields } => {
            // Errors point at the literal; names resolve where the parameter was declared
            // (which differs when the literal came from a `macro_rules!` argument).
            let root = if root == "self" {
                let at = item
                    .sig
                    .receiver()
                    .map_or(span, |r| span.resolved_at(r.self_token.span));
                quote_spanned!(at=> self)
            } else {
                let param = item.parameter_names().into_iter().find(|p| p == root);
                let mut ident = syn::parse_str::<syn::Ident>(root)
                    .unwrap_or_else(|_| syn::Ident::new("__distlock_checked_in_key_rs", span));
                ident.set_span(param.map_or(span, |p| span.resolved_at(p.span())));
                ident.to_token_stream()
            };
            let fields = fields.iter().map(|field| {
                let span = field_span(&template.literal, &field.at);
                match syn::parse_str::<syn::Member>(&field.name) {
                    Ok(syn::Member::Named(mut ident)) => {
                        ident.set_span(span);
                        ident.to_token_stream()
                    }
                    Ok(syn::Member::Unnamed(index)) => syn::Index {
                        index: index.index,
                        span,
                    }
                    .to_token_stream(),
                    Err(_) => quote!(__distlock_checked_in_key_rs),
                }
            });
            quote_spanned!(span=> #private::KeyPart::Value(&#root #(.#fields)*))
        }
    });
    quote_spanned!(span=> #private::render_key(&[#(#parts),*]))
}

/// Where an error about a placeholder's field lands (no field `fromm` on type `Req`): on the
/// field's own bytes where the compiler can point inside a literal (nightly), else on the whole
/// literal, resolved at the call site. Spanned on the user's literal itself, rustc would suggest
/// replacing the whole key with the field it guesses was meant.
fn field_span(literal: &LitStr, at: &Range<usize>) -> Span {
    let fallback = literal.span().resolved_at(Span::call_site());
    let token = literal.token();
    let source = token.to_string();
    let value = literal.value();
    // The value's bytes sit at a fixed offset only in a literal without escapes: exactly the
    // value between `"` (or `r#"`) and `"` (or `"#`).
    let Some(start) = source.find('"').map(|quote| quote + 1) else {
        return fallback;
    };
    let end = start + value.len();
    let unescaped = source.get(start..end) == Some(value.as_str())
        && source
            .get(end..)
            .and_then(|rest| rest.strip_prefix('"'))
            .is_some_and(|hashes| hashes.chars().all(|c| c == '#'));
    if !unescaped {
        return fallback;
    }
    token
        .subspan(start + at.start..start + at.end)
        .unwrap_or(fallback)
}

/// `Option<Result<Duration, LockError>>`: a literal's milliseconds, or the expression converted
/// at run time (an error there is the call's error).
fn option_duration(value: Option<&DurationArg>, what: &str, private: &TokenStream) -> TokenStream {
    match value {
        Some(DurationArg::Literal(Millis { millis, span })) => quote_spanned!(*span=>
            ::core::option::Option::Some(::core::result::Result::Ok(
                ::core::time::Duration::from_millis(#millis)
            ))
        ),
        Some(DurationArg::Expr(expr)) => quote_spanned!(span_of(expr)=>
            ::core::option::Option::Some(#private::IntoDuration::into_duration(#expr, #what))
        ),
        None => quote!(::core::option::Option::None),
    }
}

fn span_of(tokens: &impl ToTokens) -> Span {
    syn::spanned::Spanned::span(&tokens.to_token_stream())
}

/// The user's item unchanged, beside the errors, so the rest of the crate and IDEs still see
/// the fn.
pub(crate) fn fallback(item: TokenStream, error: &syn::Error) -> TokenStream {
    let error = error.to_compile_error();
    quote! {
        #error
        #item
    }
}
