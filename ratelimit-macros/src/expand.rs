//! Writes the checks into the function.

use proc_macro2::{Group, Ident, Literal, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens as _};
use syn::ext::IdentExt as _;
use syn::spanned::Spanned as _;
use syn::{Attribute, Expr, ItemFn, Stmt, TraitItemFn};

use crate::attr::Args;
use crate::body::{self, Body};
use crate::valid::{self, Check, Cost, Function, Key, KeyPart, QuotaArg};

/// The whole expansion: on success the function with its checks, on error
/// the error and the function as written (less any stacked `#[rate_limit]`,
/// which would only repeat the error), so the user sees one error.
pub(crate) fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut function = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(function) => function,
        Err(err) => return not_a_function(item, err),
    };
    let stacked = take_stacked(&mut function.attrs);
    match checks(args, &stacked, &function) {
        Ok(Expansion::First(block)) => {
            body::checked_block(&mut function)
                .stmts
                .insert(0, Stmt::Expr(Expr::Verbatim(block), None));
            function.into_token_stream()
        }
        Ok(Expansion::Around(around)) => {
            let checked = body::checked_block(&mut function);
            let (mut items, stmts) = hoisted_items(std::mem::take(&mut checked.stmts));
            let block = around(quote!(#(#stmts)*));
            items.push(Stmt::Expr(Expr::Verbatim(block), None));
            checked.stmts = items;
            function.into_token_stream()
        }
        Err(err) => {
            let mut tokens = err.to_compile_error();
            function.to_tokens(&mut tokens);
            tokens
        }
    }
}

/// Splits a body, for `refund_on`, into the items that stay in the
/// function's block, seen by the attribute's expressions as without
/// `refund_on` (`quota = tier()` with `fn tier` in the body), and the
/// statements that go in the async block, in order.
///
/// Only the items before the body's first `macro_rules!` move: a macro's
/// scope is the text after it, so moving an item or a definition past
/// another would change what the body means (a `macro_rules! m` shadowing
/// an earlier `m`, a `fn` using the macro). From the first `macro_rules!`
/// on, the body stays as written.
fn hoisted_items(stmts: Vec<Stmt>) -> (Vec<Stmt>, Vec<Stmt>) {
    let defines_macro = |stmt: &Stmt| match stmt {
        Stmt::Item(syn::Item::Macro(item)) => item.mac.path.is_ident("macro_rules"),
        Stmt::Macro(stmt) => stmt.mac.path.is_ident("macro_rules"),
        _ => false,
    };
    let end = stmts.iter().position(defines_macro).unwrap_or(stmts.len());
    let mut items = Vec::new();
    let mut rest = Vec::with_capacity(stmts.len());
    for (i, stmt) in stmts.into_iter().enumerate() {
        if i < end && matches!(stmt, Stmt::Item(_)) {
            items.push(stmt);
        } else {
            rest.push(stmt);
        }
    }
    (items, rest)
}

/// The item is not a function with a body, or uses syntax this macro does
/// not know: either way it must not compile without its limit.
fn not_a_function(item: TokenStream, parse_error: syn::Error) -> TokenStream {
    let err = if let Ok(method) = syn::parse2::<TraitItemFn>(item.clone()) {
        let at = method
            .semi_token
            .map_or_else(|| method.sig.span(), |semi| semi.span);
        syn::Error::new(
            at,
            "`#[rate_limit]` needs the function's body; put it on the method in the `impl` block",
        )
    } else if syn::parse2::<syn::Item>(item.clone()).is_ok() {
        syn::Error::new(
            Span::call_site(),
            "`#[rate_limit]` applies to an `async fn`; put it on the function to limit",
        )
    } else {
        parse_error
    };
    let mut tokens = err.to_compile_error();
    tokens.extend(item);
    tokens
}

/// Removes the other `#[rate_limit]` attributes of the item: this expansion
/// writes them all, in the order they are written, so that every one applies
/// before the body and none sees another's generated code.
fn take_stacked(attrs: &mut Vec<Attribute>) -> Vec<Attribute> {
    let is_rate_limit = |attr: &Attribute| {
        attr.path()
            .segments
            .last()
            .is_some_and(|segment| segment.ident == "rate_limit")
    };
    let (stacked, others) = std::mem::take(attrs).into_iter().partition(is_rate_limit);
    *attrs = others;
    stacked
}

/// Parses and checks every attribute, then writes one block holding every
/// check in the order written.
///
/// Input:
///
/// ```text
/// #[rate_limit(key = "a:<user_id>", capacity = 10, rate = 2)]
/// #[rate_limit(key = "b", capacity = 100, rate = "100/min")]
/// async fn submit_order(user_id: u64) -> Result<(), AppError> { body }
/// ```
///
/// Output:
///
/// ```text
/// async fn submit_order(user_id: u64) -> Result<(), AppError> {
///     {
///         /* the call of `a:<user_id>`, `__ratelimit_call_0` (see `prepare_check`) */
///         /* the call of `b`, `__ratelimit_call_1` */
///         if let ::core::result::Result::Err(__ratelimit_denied) =
///             ::ratelimit::__private::acquire_all(&mut [__ratelimit_call_0, __ratelimit_call_1]).await
///         {
///             return ::ratelimit::__private::ReturnsDenial::denied(__ratelimit_denied);
///         }
///     }
///     body
/// }
/// ```
///
/// A single attribute calls `::ratelimit::__private::acquire(__ratelimit_call)`.
fn checks(args: TokenStream, stacked: &[Attribute], function: &ItemFn) -> syn::Result<Expansion> {
    let mut all = vec![syn::parse2::<Args>(args)?];
    for attr in stacked {
        all.push(Args::from_attribute(attr)?);
    }
    let body = Body::of(function);
    if matches!(body, Body::Other) && body::run_by_a_runtime(function) {
        return Err(syn::Error::new(
            function.sig.fn_token.span,
            "`#[rate_limit]` needs an `async fn`, and an attribute above it (such as \
             `#[tokio::main]` or `#[tokio::test]`) already made this one a plain `fn` that runs \
             its body in a runtime; put `#[rate_limit]` first, above that attribute",
        ));
    }
    // What comes before the returned future runs when the function is
    // called, whatever the limits answer: nothing may.
    if let (Body::Returned { .. }, [first, _, ..]) = (&body, &function.block.stmts[..]) {
        return Err(syn::Error::new_spanned(
            first,
            "`#[rate_limit]` checks the limits inside the future this function returns, so \
             statements before it would run on every call, even a denied one; move them into \
             the `async` block",
        ));
    }
    let signature = valid::function(&function.sig, &body)?;
    let checks = all
        .into_iter()
        .map(|args| signature.check(args))
        .collect::<syn::Result<Vec<_>>>()?;
    if let Some(refund_on) = refund_on(&checks)? {
        return Ok(refunding(
            &signature,
            &checks,
            refund_on,
            output_type(function, &body),
        ));
    }
    if let [check] = &checks[..] {
        let prepared = prepare_check(&signature, check, "", None);
        let private = private_path(check);
        let deny = deny(
            &signature,
            &private,
            quote!(#private::acquire(__ratelimit_call)),
        );
        return Ok(Expansion::First(quote!({ #prepared #deny })));
    }
    // Stacked: every check prepared, then one call that admits all or none.
    let apart = apart(&checks);
    let prepared = checks
        .iter()
        .enumerate()
        .map(|(i, check)| prepare_check(&signature, check, &format!("_{i}"), apart[i]));
    let calls = (0..checks.len()).map(|i| format_ident!("__ratelimit_call_{}", i));
    let private = private_path(&checks[0]);
    let call = quote!(#private::acquire_all(&mut [#(#calls),*]));
    let deny = deny(&signature, &private, call);
    Ok(Expansion::First(quote!({ #(#prepared)* #deny })))
}

/// Where the checks go.
enum Expansion {
    /// A block first in the body.
    First(TokenStream),
    /// Around the body (its statements given): the checks, the body as an
    /// async block whose output is kept, then the refund (`refund_on`).
    Around(Box<dyn FnOnce(TokenStream) -> TokenStream>),
}

/// The `refund_on` of the checks: the same on every stacked attribute, as
/// they are decided, and so refunded, together.
fn refund_on(checks: &[Check]) -> syn::Result<Option<&'static str>> {
    let Some((first, span)) = checks.iter().find_map(|c| c.refund_on) else {
        return Ok(None);
    };
    for check in checks {
        if check.refund_on.map(|(on, _)| on) != Some(first) {
            let at = check.refund_on.map_or(span, |(_, at)| at);
            return Err(syn::Error::new(
                at,
                "stacked `#[rate_limit]` attributes are decided together and refunded together: \
                 give every one the same `refund_on`",
            ));
        }
    }
    Ok(Some(first))
}

/// The type the body's async block outputs, when it can be named there:
/// the function's return type (or its future's output), unless it holds
/// `impl Trait`, which only inference can fill.
fn output_type(function: &ItemFn, body: &Body<'_>) -> TokenStream {
    let ty = match (body, &function.sig.output) {
        (Body::Async, syn::ReturnType::Type(_, ty)) => Some(&**ty),
        (Body::Returned { output, .. }, _) => *output,
        _ => None,
    };
    ty.map(|ty| ty.to_token_stream())
        .filter(|tokens| !holds_impl(tokens.clone()))
        .unwrap_or_else(|| quote!(_))
}

fn holds_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => holds_impl(group.stream()),
        _ => false,
    })
}

/// The checks around the body, for `refund_on`:
///
/// ```text
/// {
///     /* every call prepared */
///     let __ratelimit_receipt = match ::ratelimit::__private::acquire_kept(&mut [..]).await {
///         Ok(receipt) => receipt,
///         Err(denied) => return ::ratelimit::__private::ReturnsDenial::denied(denied),
///     };
///     let __ratelimit_output = ::ratelimit::__private::output::<R, _>(async {
///         if let Some(output) = None::<R> { return output; }
///         body
///     }).await;
///     ::ratelimit::__private::settle(__ratelimit_receipt, &__ratelimit_output, RefundOn::Err).await;
///     __ratelimit_output
/// }
/// ```
///
/// The body runs in an async block so that its `return`s and `?`s give
/// the output the refund is decided on. It captures as a closure would, so
/// the parameters it uses stay where they are unless it moves them; the
/// receipt owns its keys and a clone of the limiter, so nothing the checks
/// borrowed stays borrowed while the body runs.
fn refunding(
    function: &Function,
    checks: &[Check],
    refund_on: &'static str,
    output: TokenStream,
) -> Expansion {
    let apart = apart(checks);
    let prepared: Vec<TokenStream> = checks
        .iter()
        .enumerate()
        .map(|(i, check)| prepare_check(function, check, &format!("_{i}"), apart[i]))
        .collect();
    let calls: Vec<_> = (0..checks.len())
        .map(|i| format_ident!("__ratelimit_call_{}", i))
        .collect();
    let private = private_path(&checks[0]);
    let (first, last) = function.return_span;
    let path = respan(&quote!(#private::ReturnsDenial::), first);
    let denied = quote_spanned!(at(last)=> denied(__ratelimit_denied));
    let refund_on = proc_macro2::Ident::new(refund_on, Span::call_site());
    Expansion::Around(Box::new(move |body| {
        quote! {{
            #(#prepared)*
            let mut __ratelimit_calls = [#(#calls),*];
            let __ratelimit_receipt = match #private::acquire_kept(&mut __ratelimit_calls).await {
                ::core::result::Result::Ok(receipt) => receipt,
                ::core::result::Result::Err(__ratelimit_denied) => return #path #denied,
            };
            // The receipt owns what it needs: the body may use what the
            // calls borrowed (`limiter = self.limiter` in a `&mut self`
            // method, say).
            ::core::mem::drop(__ratelimit_calls);
            // `move`: the body owns the arguments, as the function's own
            // future did; borrowed, an argument that is `Send` but not
            // `Sync` would make the future not `Send`.
            // The block's output is named before the body's first `return`,
            // which would otherwise fix it, coercions lost (`return
            // Err(Box::new(e))` for a `Box<dyn Error>`).
            let __ratelimit_output = #private::output::<#output, _>(async move {
                #[allow(unreachable_code)]
                if let ::core::option::Option::Some(__ratelimit_output) =
                    ::core::option::Option::None::<#output>
                {
                    return __ratelimit_output;
                }
                #body
            })
            .await;
            #private::settle(
                __ratelimit_receipt,
                &__ratelimit_output,
                #private::RefundOn::#refund_on,
            )
            .await;
            __ratelimit_output
        }}
    }))
}

fn private_path(check: &Check) -> TokenStream {
    let krate = &check.krate;
    quote!(#krate::__private)
}

/// Awaits `call` (a `Result<(), RateLimited>`) and returns the denial as the
/// function's error, through `ReturnsDenial`: the return type may be an alias
/// the attribute cannot see into.
fn deny(function: &Function, private: &TokenStream, call: TokenStream) -> TokenStream {
    // Spanned over the return type, from its first token to its last: a type
    // that cannot carry the denial (not a `Result`, or an error type without
    // `From<RateLimited>`) is reported there.
    let (first, last) = function.return_span;
    let path = respan(&quote!(#private::ReturnsDenial::), first);
    let denied = quote_spanned!(at(last)=> denied(__ratelimit_denied));
    quote! {
        if let ::core::result::Result::Err(__ratelimit_denied) = #call.await {
            return #path #denied;
        }
    }
}

/// One attribute's check, prepared: everything but the call to the limiter.
///
/// Input:
///
/// ```text
/// #[rate_limit(key = "order:submit:<user_id>", rule = "order_submit", capacity = 10, rate = 2,
///              exempt = user_id == 0)]
/// async fn submit_order(user_id: u64) -> Result<Order, AppError>
/// ```
///
/// Output:
///
/// ```text
/// static __RATELIMIT_RULE: ::ratelimit::__private::Rule = ::ratelimit::__private::Rule::new(
///     ::core::concat!(::core::module_path!(), "::", "submit_order")).named("order_submit");
/// static __RATELIMIT_QUOTA: ::ratelimit::__private::Quota =
///     ::ratelimit::__private::quota(::ratelimit::__private::Algorithm::TokenBucket, 10, 1, 500000, 0);
/// let __ratelimit_limiter_tmp: &::ratelimit::__private::Limiter =
///     ::ratelimit::__private::global_limiter();
/// let __ratelimit_limiter: &::ratelimit::__private::Limiter = __ratelimit_limiter_tmp;
/// let __ratelimit_exempt: bool = user_id == 0;
/// let __ratelimit_call: ::core::option::Option<::ratelimit::__private::Call<'_>> =
///     if __ratelimit_exempt {
///         ::core::option::Option::None
///     } else {
///         let __ratelimit_key: ::std::string::String = { /* see `expand_key` */ };
///         let __ratelimit_cost: u64 = 1;
///         let __ratelimit_quota: ::ratelimit::__private::Quota =
///             ::ratelimit::__private::Rule::resolve(&__RATELIMIT_RULE, __ratelimit_limiter,
///                 &__RATELIMIT_QUOTA);
///         ::core::option::Option::Some(::ratelimit::__private::Call::new(
///             __ratelimit_limiter, &__RATELIMIT_RULE, __ratelimit_quota, __ratelimit_key,
///             __ratelimit_cost))
///     };
/// ```
///
/// `quota = <expression>` writes no `__RATELIMIT_QUOTA`, and the call's quota
/// is `::ratelimit::__private::IntoQuota::into_quota(expression)`. Without
/// `exempt`, the call is `Some(...)` at once.
fn prepare_check(
    function: &Function,
    check: &Check,
    suffix: &str,
    apart: Option<u32>,
) -> TokenStream {
    let krate = &check.krate;
    let private = quote!(#krate::__private);
    let name = function.name.unraw().to_string();
    let rule_name = format_ident!("__RATELIMIT_RULE{}", suffix);
    let quota_name = format_ident!("__RATELIMIT_QUOTA{}", suffix);
    let limiter_name = format_ident!("__ratelimit_limiter{}", suffix);
    let exempt_name = format_ident!("__ratelimit_exempt{}", suffix);
    let call_name = format_ident!("__ratelimit_call{}", suffix);
    let limiter = match &check.limiter {
        None => quote!(
            let __ratelimit_limiter_tmp: &#private::Limiter = #private::global_limiter();
        ),
        // `let x = &(expr);` keeps a temporary such as `Arc::clone(&l)` alive
        // for the whole check. Deref coercion then takes a `Limiter`, a
        // reference to one (or to a reference), an `Arc`, a `Box` or a
        // `LazyLock` of one, and a reference to any of these.
        Some(expr) => {
            let source = Ident::new("__ratelimit_limiter_source", at(expr.span()));
            quote!(
                let __ratelimit_limiter_source = &(#expr);
                let __ratelimit_limiter_tmp: &#private::Limiter = #source;
            )
        }
    };
    let key = expand_key(&private, &check.key);
    let mut rule_options = TokenStream::new();
    if let Some(rule) = &check.rule {
        rule_options.extend(quote!(.named(#rule)));
    }
    if let QuotaArg::Fixed(fixed) = &check.quota {
        if !fixed.algorithm.is_default() {
            let algorithm = fixed.algorithm.variant();
            rule_options.extend(quote!(.algorithm(#private::Algorithm::#algorithm)));
        }
    }
    if let Some(policy) = check.on_error {
        let policy = proc_macro2::Ident::new(policy, Span::call_site());
        rule_options.extend(quote!(.on_error(#private::FailurePolicy::#policy)));
    }
    if check.shadow {
        rule_options.extend(quote!(.shadow()));
    }
    if let Some(position) = apart {
        let position = Literal::u32_unsuffixed(position);
        rule_options.extend(quote!(.apart(#position)));
    }
    if let Some(lease) = check.lease {
        let lease = Literal::u64_unsuffixed(lease);
        rule_options.extend(quote!(.lease(#lease)));
    }
    if let Some(wait_us) = check.wait_us {
        let wait_us = Literal::u64_unsuffixed(wait_us);
        rule_options.extend(quote!(.wait_micros(#wait_us)));
    }
    let cost = match &check.cost {
        Cost::Fixed(cost) => Literal::u64_unsuffixed(*cost).into_token_stream(),
        Cost::Expr(expr) => {
            let span = expr.span();
            let private = respan(&private, span);
            quote_spanned!(at(span)=> #private::IntoCost::into_cost(#expr))
        }
    };
    let (quota_static, quota) = match &check.quota {
        QuotaArg::Fixed(fixed) => {
            let algorithm = fixed.algorithm.variant();
            let capacity = Literal::u64_unsuffixed(fixed.capacity);
            let tokens = Literal::u64_unsuffixed(fixed.rate.tokens());
            let period_us = Literal::u64_unsuffixed(crate::valid::period_us(&fixed.rate));
            let window_us = Literal::u64_unsuffixed(fixed.window_us);
            (
                quote! {
                    static #quota_name: #private::Quota = #private::quota(
                        #private::Algorithm::#algorithm,
                        #capacity,
                        #tokens,
                        #period_us,
                        #window_us,
                    );
                },
                quote!(#private::Rule::resolve(&#rule_name, #limiter_name, &#quota_name)),
            )
        }
        QuotaArg::PerCall(expr) => {
            let span = expr.span();
            let private = respan(&private, span);
            (
                TokenStream::new(),
                quote_spanned!(at(span)=> #private::IntoQuota::into_quota(#expr)),
            )
        }
    };
    let call = quote! {
        let __ratelimit_key: ::std::string::String = #key;
        let __ratelimit_cost: u64 = #cost;
        let __ratelimit_quota: #private::Quota = #quota;
        ::core::option::Option::Some(#private::Call::new(
            #limiter_name,
            &#rule_name,
            __ratelimit_quota,
            __ratelimit_key,
            __ratelimit_cost,
        ))
    };
    let call = match &check.exempt {
        None => quote!({ #call }),
        Some(expr) => {
            // The expression's span: a value that is not a `bool` is
            // reported at it.
            let exempt = quote_spanned!(at(expr.span())=> let #exempt_name: bool = #expr;);
            quote! {{
                #exempt
                if #exempt_name {
                    ::core::option::Option::None
                } else {
                    #call
                }
            }}
        }
    };
    quote! {
        static #rule_name: #private::Rule = #private::Rule::new(
            ::core::concat!(::core::module_path!(), "::", #name),
        )#rule_options;
        #quota_static
        #limiter
        let #limiter_name: &#private::Limiter = __ratelimit_limiter_tmp;
        let #call_name: ::core::option::Option<#private::Call<'_>> = #call;
    }
}

/// For each stacked check, its place (from 1) when an earlier check has the
/// same key template: it keeps state of its own under `key~<place>`
/// whatever the other checks' exemptions on a call (see
/// `__private::acquire_all`).
fn apart(checks: &[Check]) -> Vec<Option<u32>> {
    let templates: Vec<String> = checks
        .iter()
        .map(|check| expand_key(&TokenStream::new(), &check.key).to_string())
        .collect();
    (0..checks.len())
        .map(|i| templates[..i].contains(&templates[i]).then(|| i as u32 + 1))
        .collect()
}

/// The key, built from references to the arguments so that none is moved.
///
/// Input: `key = "order:submit:<user.id>"`
///
/// Output:
///
/// ```text
/// {
///     let mut __ratelimit_key_builder = ::ratelimit::__private::KeyBuilder::new();
///     ::ratelimit::__private::KeyBuilder::push_literal(&mut __ratelimit_key_builder, "order:submit:");
///     ::ratelimit::__private::KeyPart::push_to(&(user.id), &mut __ratelimit_key_builder);
///     ::ratelimit::__private::KeyBuilder::finish(__ratelimit_key_builder)
/// }
/// ```
///
/// `key = <expression>` pushes `&(expression)` with `KeyPart::push_whole_to`.
fn expand_key(private: &TokenStream, key: &Key) -> TokenStream {
    let pushes = match key {
        Key::Template { parts, span } => parts
            .iter()
            .map(|part| match part {
                KeyPart::Literal(text) => quote! {
                    #private::KeyBuilder::push_literal(&mut __ratelimit_key_builder, #text);
                },
                // The literal's span: a placeholder that is not `Display`
                // is reported at the template.
                KeyPart::Value(value) => {
                    let private = respan(private, *span);
                    quote_spanned! {at(*span)=>
                        #private::KeyPart::push_to(&(#value), &mut __ratelimit_key_builder);
                    }
                }
            })
            .collect(),
        Key::Expr(expr) => {
            let span = expr.span();
            let private = respan(private, span);
            quote_spanned! {at(span)=>
                #private::KeyPart::push_whole_to(&(#expr), &mut __ratelimit_key_builder);
            }
        }
    };
    quote! {
        {
            let mut __ratelimit_key_builder = #private::KeyBuilder::new();
            #pushes
            #private::KeyBuilder::finish(__ratelimit_key_builder)
        }
    }
}

/// `tokens` located at `span`. A path such as `::ratelimit::__private` in a
/// call made for the user's expression then shares its place, so the
/// compiler underlines that expression only, not the whole attribute. Each
/// token keeps where its names resolve: a `crate = $crate::facade` path
/// given inside another crate's macro still means that crate.
fn respan(tokens: &TokenStream, span: Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|token| match token {
            TokenTree::Group(group) => {
                let mut respanned = Group::new(group.delimiter(), respan(&group.stream(), span));
                respanned.set_span(group.span().located_at(span));
                TokenTree::Group(respanned)
            }
            mut token => {
                token.set_span(token.span().located_at(span));
                token
            }
        })
        .collect()
}

/// A span for generated code placed at the user's `span` (where errors
/// point), whose names resolve where the attribute is written: with the
/// user's span itself, a local the expansion declares would not be found
/// from code that a `macro_rules!` passed in (its return type, its key).
fn at(span: Span) -> Span {
    Span::call_site().located_at(span)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(args: &str, item: &str) -> String {
        rate_limit(args.parse().unwrap(), item.parse().unwrap()).to_string()
    }

    /// Items move out of the body for `refund_on` only before its first
    /// `macro_rules!`; from there on the body keeps its order.
    #[test]
    fn only_items_before_the_first_macro_definition_are_hoisted() {
        let block: syn::Block = syn::parse_str(
            "{ let a = 1; fn f() {} struct S; macro_rules! m { () => {} } let b = m!(); fn g() {} }",
        )
        .unwrap();
        let (items, rest) = hoisted_items(block.stmts);
        let text = |stmts: Vec<Stmt>| -> Vec<String> {
            stmts
                .iter()
                .map(|s| s.to_token_stream().to_string())
                .collect()
        };
        assert_eq!(text(items), ["fn f () { }", "struct S ;"]);
        assert_eq!(
            text(rest),
            [
                "let a = 1 ;",
                "macro_rules ! m { () => { } }",
                "let b = m ! () ;",
                "fn g () { }"
            ]
        );
    }

    #[test]
    fn stacked_attributes_become_one_block_checked_in_written_order() {
        let out = expand(
            r#"key = "first", capacity = 1, rate = 1"#,
            r#"
            #[inline]
            #[rate_limit(key = "second", capacity = 1, rate = 1)]
            #[ratelimit::rate_limit(key = "third", capacity = 1, rate = 1)]
            async fn f() -> Result<(), E> { body(); Ok(()) }
            "#,
        );
        assert!(
            !out.contains("rate_limit ("),
            "stacked attributes are removed: {out}"
        );
        assert!(out.contains("# [inline]"), "other attributes stay: {out}");
        let at = |needle: &str| {
            out.find(needle)
                .unwrap_or_else(|| panic!("{needle} in {out}"))
        };
        assert!(at("\"first\"") < at("\"second\""), "{out}");
        assert!(at("\"second\"") < at("\"third\""), "{out}");
        assert!(
            at("\"third\"") < at("body ()"),
            "every check precedes the body: {out}"
        );
        assert_eq!(out.matches("static __RATELIMIT_RULE").count(), 3, "{out}");
    }

    /// A lease the limiter would never take is refused where it is written.
    #[test]
    fn a_lease_that_is_never_taken_is_refused() {
        for (args, says) in [
            (
                r#"key = "k", algorithm = sliding_log, limit = 5, window = "1s", lease = 3"#,
                "`sliding_log` cannot lease",
            ),
            (
                r#"key = "k", capacity = 5, rate = 1, cost = 2, lease = 2"#,
                "leases nothing for a call of cost 2",
            ),
        ] {
            let out = expand(args, "async fn f() -> Result<(), E> { Ok(()) }");
            assert!(
                out.starts_with(":: core :: compile_error !") && out.contains(says),
                "{args}: {out}"
            );
        }
        let taken = expand(
            r#"key = "k", capacity = 5, rate = 1, cost = 2, lease = 3"#,
            "async fn f() -> Result<(), E> { Ok(()) }",
        );
        assert!(!taken.contains("compile_error"), "{taken}");
    }

    #[test]
    fn statements_before_a_returned_future_are_refused() {
        let out = expand(
            r#"key = "k", capacity = 1, rate = 1"#,
            r#"
            fn f() -> Pin<Box<dyn Future<Output = Result<(), E>> + Send>> {
                COUNTED.fetch_add(1, Relaxed);
                Box::pin(async move { Ok(()) })
            }
            "#,
        );
        assert!(out.starts_with(":: core :: compile_error !"), "{out}");
        assert!(out.contains("move them into"), "{out}");
        let alone = expand(
            r#"key = "k", capacity = 1, rate = 1"#,
            "fn f() -> Pin<Box<dyn Future<Output = Result<(), E>> + Send>> { \
             Box::pin(async move { Ok(()) }) }",
        );
        assert!(!alone.contains("compile_error"), "{alone}");
    }

    #[test]
    fn an_error_keeps_the_function_as_written_without_its_attributes() {
        let out = expand(
            r#"key = "k", capacity = 0, rate = 1"#,
            r#"
            #[rate_limit(key = "other", capacity = 1, rate = 1)]
            async fn f() -> Result<(), E> { Ok(()) }
            "#,
        );
        assert!(out.starts_with(":: core :: compile_error !"), "{out}");
        assert_eq!(out.matches("compile_error").count(), 1, "one error: {out}");
        assert!(
            out.contains("async fn f () -> Result < () , E > { Ok (()) }"),
            "{out}"
        );
        assert!(
            !out.contains("rate_limit (") && !out.contains("__ratelimit"),
            "{out}"
        );
    }

    #[test]
    fn placeholders_are_borrowed_and_the_crate_path_is_used() {
        let out = expand(
            r#"key = "a:<user.id>", capacity = 2, rate = "1/min", cost = n, crate = rl"#,
            "async fn f(user: User, n: u8) -> Result<(), E> { Ok(()) }",
        );
        assert!(
            out.contains("rl :: __private :: KeyPart :: push_to (& (user . id)"),
            "{out}"
        );
        assert!(
            out.contains("rl :: __private :: IntoCost :: into_cost (n)"),
            "{out}"
        );
        assert!(
            out.contains("2 , 1 , 60000000"),
            "capacity, tokens, period_us: {out}"
        );
        assert!(!out.contains("__ratelimit_exempt"), "{out}");
        assert!(
            out.contains(
                "Rule :: resolve (& __RATELIMIT_RULE , __ratelimit_limiter , & __RATELIMIT_QUOTA)"
            ),
            "{out}"
        );
        assert!(!out.contains(":: ratelimit ::"), "{out}");
    }

    #[test]
    fn a_per_call_quota_and_an_exemption_are_evaluated_before_the_body() {
        let out = expand(
            r#"key = "a:<user.id>", quota = tier(&user), exempt = user.staff"#,
            "async fn f(user: User) -> Result<(), E> { body(user); Ok(()) }",
        );
        assert!(!out.contains("__RATELIMIT_QUOTA"), "no fixed quota: {out}");
        let at = |needle: &str| {
            out.find(needle)
                .unwrap_or_else(|| panic!("{needle} in {out}"))
        };
        assert!(at("let __ratelimit_exempt : bool = user . staff ;") < at("if __ratelimit_exempt"));
        assert!(
            at("if __ratelimit_exempt") < at("IntoQuota :: into_quota (tier (& user))"),
            "an exempt call computes no quota: {out}"
        );
        assert!(at("into_quota") < at("body (user)"), "{out}");
    }

    #[test]
    fn a_named_rule_of_another_algorithm_knows_its_own() {
        let out = expand(
            r#"key = "k", rule = "r", algorithm = gcra, capacity = 1, rate = 1"#,
            "async fn f() -> Result<(), E> { Ok(()) }",
        );
        assert!(
            out.contains(
                ". named (\"r\") . algorithm (:: ratelimit :: __private :: Algorithm :: Gcra)"
            ),
            "{out}"
        );
    }
}
