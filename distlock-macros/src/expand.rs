//! The generated wrapper: render the keys, pick the manager, and hand the body to the runtime
//! in one call. Also the fallback that keeps the user's fn alive beside a compile error.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ReturnType;

use crate::args::{Args, Millis};
use crate::item::LockedFn;
use crate::key::{Part, Template};

/// The annotated fn, rewritten to run its body under the lock.
pub(crate) fn expand(args: &Args, templates: &[Template], item: &LockedFn) -> TokenStream {
    let krate = match &args.krate {
        Some(path) => path.to_token_stream(),
        None => quote!(::distlock_runtime),
    };
    let private = quote!(#krate::__private);
    let LockedFn {
        attrs,
        vis,
        sig,
        body,
    } = item;
    let output = match &sig.output {
        ReturnType::Type(_, ty) => ty.to_token_stream(),
        // Refused by the checks; kept total for the fallback path.
        ReturnType::Default => quote!(()),
    };
    // Spanned on the return type: "not a Result" / "no From<LockError>" point there, once.
    let on_error = quote_spanned!(expr_span_of(&output)=>
        <#output as #private::LockResult>::from_lock_error
    );
    let keys = templates.iter().map(|t| render(t, &private));
    let manager = match &args.manager {
        Some(expr) => quote_spanned!(expr_span(expr)=> #private::manager(#expr)),
        None => quote!(#private::default_manager()),
    };
    let ttl = option_duration(args.ttl.as_ref());
    let wait = option_duration(args.wait.as_ref());
    let renew = args.renew.as_ref().is_none_or(syn::LitBool::value);

    quote! {
        #(#attrs)*
        #vis #sig {
            let __distlock_keys: ::std::vec::Vec<::std::string::String> = ::std::vec![#(#keys),*];
            let __distlock_manager = #manager;
            #private::run(
                __distlock_manager,
                __distlock_keys,
                #private::Options { ttl: #ttl, wait: #wait, renew: #renew },
                #on_error,
                async move {
                    // Fixes the block's type to the fn's return type, so `?` in the body
                    // converts errors as it would in the fn itself.
                    #[allow(unreachable_code, clippy::diverging_sub_expression, clippy::empty_loop)]
                    if false {
                        let __distlock_return: #output = loop {};
                        return __distlock_return;
                    }
                    #body
                },
            )
            .await
        }
    }
}

/// One key template as an expression rendering it (parameters escaped by the runtime).
fn render(template: &Template, private: &TokenStream) -> TokenStream {
    let span = template.literal.span();
    let parts = template.parts.iter().map(|part| match part {
        Part::Text(text) => quote_spanned!(span=> #private::KeyPart::Text(#text)),
        Part::Placeholder { root, fields } => {
            let root = if root == "self" {
                quote_spanned!(span=> self)
            } else {
                syn::Ident::new(root, span).to_token_stream()
            };
            let fields = fields.iter().map(|field| match field.parse::<u32>() {
                Ok(index) => syn::Index { index, span }.to_token_stream(),
                Err(_) => syn::Ident::new(field, span).to_token_stream(),
            });
            quote_spanned!(span=> #private::KeyPart::Value(&#root #(.#fields)*))
        }
    });
    quote_spanned!(span=> #private::render_key(&[#(#parts),*]))
}

fn option_duration(value: Option<&Millis>) -> TokenStream {
    match value {
        Some(Millis { millis, span }) => {
            quote_spanned!(*span=> ::core::option::Option::Some(::core::time::Duration::from_millis(#millis)))
        }
        None => quote!(::core::option::Option::None),
    }
}

fn expr_span(expr: &syn::Expr) -> Span {
    syn::spanned::Spanned::span(expr)
}

fn expr_span_of(tokens: &TokenStream) -> Span {
    syn::spanned::Spanned::span(tokens)
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
