//! The function the attribute is on: that it is async and can return a
//! denial, and where each key placeholder binds among its parameters.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt as _;
use syn::{FnArg, GenericArgument, Ident, Member, Pat, PathArguments, ReturnType, Type};

use crate::body::Body;

use super::{Function, Param};

/// Checks that the attribute can apply to this function: an `async fn`, or a
/// `fn` returning an async block (see [`Body`]). Whether its output can
/// carry a denial is the compiler's to check (`ReturnsDenial`), since an
/// alias such as `ApiResult<T>` hides what it stands for.
pub(crate) fn function<'a>(sig: &'a syn::Signature, body: &Body<'a>) -> syn::Result<Function<'a>> {
    if let Some(constness) = &sig.constness {
        return Err(syn::Error::new(
            constness.span,
            "`#[rate_limit]` cannot apply to a `const fn`; remove `const` and make the function \
             `async`",
        ));
    }
    let return_span = match (body, &sig.output) {
        // A future built another way (`.boxed()`, a combinator): adding
        // `async` would make it a future of a future.
        (Body::Other, ReturnType::Type(_, ty)) if returns_a_future(ty) => {
            return Err(syn::Error::new(
                sig.fn_token.span,
                "`#[rate_limit]` on a `fn` returning a future needs its body to end with the \
                 future as `async move { ... }` or `Box::pin(async move { ... })`, which it \
                 checks in; write `.boxed()` as `Box::pin(...)`",
            ))
        }
        (Body::Other, _) => {
            return Err(syn::Error::new(
                sig.fn_token.span,
                "`#[rate_limit]` requires an `async fn`; add `async` before `fn`",
            ))
        }
        // Said here rather than by the compiler: "`()` cannot return a
        // denial" would not say where to write the type.
        (Body::Async, ReturnType::Default) => {
            return Err(syn::Error::new(
                sig.ident.span(),
                "`#[rate_limit]` requires a function returning `Result<T, E>` where \
                 `E: From<RateLimited>`; add a return type, such as `-> Result<(), MyError>`",
            ))
        }
        (Body::Async, ReturnType::Type(_, ty)) => return_span(ty),
        (Body::Returned { output, .. }, returned) => match output {
            Some(output) => return_span(output),
            None => token_spans(returned.to_token_stream()),
        },
    };
    let moved = match body {
        Body::Returned { patterns, .. } => &patterns[..],
        _ => &[],
    };
    let params = sig
        .inputs
        .iter()
        .map(|input| match input {
            FnArg::Receiver(receiver) => Param::Receiver(receiver.self_token.span),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(binding) if binding.subpat.is_none() => {
                    // async-trait names a parameter bound by a pattern
                    // `__argN` and binds the pattern inside its block.
                    match moved.iter().find(|(ident, _)| **ident == binding.ident) {
                        Some((_, pat)) => Param::Pattern(pat),
                        None => Param::Named(&binding.ident),
                    }
                }
                pat => Param::Pattern(pat),
            },
        })
        .collect();
    Ok(Function {
        name: &sig.ident,
        params,
        return_span,
    })
}

/// Where a return type that cannot carry a denial is reported: for
/// `Result<T, E>` written out, `E` (the type that lacks `From<RateLimited>`);
/// for anything else, such as an alias, the whole type.
pub(super) fn return_span(ty: &Type) -> (Span, Span) {
    let inner = match ty {
        Type::Paren(paren) => &*paren.elem,
        Type::Group(group) => &*group.elem,
        ty => ty,
    };
    let error_type = match inner {
        Type::Path(path) if path.qself.is_none() => {
            path.path
                .segments
                .last()
                .and_then(|last| match &last.arguments {
                    PathArguments::AngleBracketed(args) if last.ident == "Result" => args
                        .args
                        .iter()
                        .filter_map(|arg| match arg {
                            GenericArgument::Type(ty) => Some(ty),
                            _ => None,
                        })
                        .nth(1),
                    _ => None,
                })
        }
        _ => None,
    };
    token_spans(error_type.unwrap_or(ty).to_token_stream())
}

/// The spans of the first and last tokens: code given the first span at its
/// start and the last at its end is reported over all of them, as
/// `syn::Error::new_spanned` is (one span cannot cover several tokens).
pub(super) fn token_spans(tokens: TokenStream) -> (Span, Span) {
    let mut tokens = tokens.into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| match t {
        proc_macro2::TokenTree::Group(group) => group.span_close(),
        t => t.span(),
    });
    (first, last)
}

/// `.field` or `.0` of a placeholder, as a member expression.
pub(super) fn member(field: &str, span: Span) -> Member {
    if let Ok(index) = field.parse::<u32>() {
        return Member::Unnamed(syn::Index { index, span });
    }
    // A field named like a keyword (`<x.type>`) needs the raw form; the few
    // that cannot be raw are left for the compiler to reject.
    const NEVER_RAW: [&str; 5] = ["_", "self", "Self", "super", "crate"];
    Member::Named(
        if NEVER_RAW.contains(&field) || syn::parse_str::<Ident>(field).is_ok() {
            Ident::new(field, span)
        } else {
            Ident::new_raw(field, span)
        },
    )
}

/// Where `name` is bound inside `pat`: `Some(Some(".0.x"))` when the field
/// path to it is known, `Some(None)` when it is bound some other way.
pub(super) fn binding_path(pat: &Pat, name: &str) -> Option<Option<String>> {
    let prefixed = |prefix: String, found: Option<String>| found.map(|rest| prefix + &rest);
    match pat {
        Pat::Ident(binding) if binding.ident.unraw() == name => Some(Some(String::new())),
        Pat::Ident(binding) => binding
            .subpat
            .as_ref()
            .and_then(|(_, sub)| binding_path(sub, name)),
        Pat::Reference(reference) => binding_path(&reference.pat, name),
        Pat::Paren(paren) => binding_path(&paren.pat, name),
        Pat::Type(typed) => binding_path(&typed.pat, name),
        Pat::Tuple(tuple) => elements_path(tuple.elems.iter(), name, prefixed),
        Pat::TupleStruct(tuple) => elements_path(tuple.elems.iter(), name, prefixed),
        Pat::Struct(structure) => structure.fields.iter().find_map(|field| {
            let found = binding_path(&field.pat, name)?;
            let member = match &field.member {
                Member::Named(ident) => ident.unraw().to_string(),
                Member::Unnamed(index) => index.index.to_string(),
            };
            Some(prefixed(format!(".{member}"), found))
        }),
        Pat::Slice(slice) => slice
            .elems
            .iter()
            .find_map(|elem| binding_path(elem, name).map(|_| None)),
        Pat::Or(or) => or
            .cases
            .iter()
            .find_map(|case| binding_path(case, name).map(|_| None)),
        _ => None,
    }
}

pub(super) fn elements_path<'a>(
    elems: impl Iterator<Item = &'a Pat>,
    name: &str,
    prefixed: impl Fn(String, Option<String>) -> Option<String>,
) -> Option<Option<String>> {
    let mut after_rest = false;
    for (index, elem) in elems.enumerate() {
        after_rest |= matches!(elem, Pat::Rest(_));
        if let Some(found) = binding_path(elem, name) {
            // Past `..` the index of an element is not known from the pattern.
            return Some(if after_rest {
                None
            } else {
                prefixed(format!(".{index}"), found)
            });
        }
    }
    None
}

/// Whether `ty` names a future: `impl Future<..>`, or a type whose name
/// ends in `Future` (`BoxFuture`, `Pin<Box<dyn Future<..>>>`).
fn returns_a_future(ty: &syn::Type) -> bool {
    fn mentions_future(tokens: proc_macro2::TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            proc_macro2::TokenTree::Ident(ident) => ident.to_string().ends_with("Future"),
            proc_macro2::TokenTree::Group(group) => mentions_future(group.stream()),
            _ => false,
        })
    }
    mentions_future(ty.to_token_stream())
}
