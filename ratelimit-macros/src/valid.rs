//! Checks the function and each attribute's options, and turns them into the
//! facts `expand` writes out: a quota in exact integers, key parts bound to
//! parameters, a cost.
//!
//! Every check that can be made at compile time is made here, so the generated
//! `Rule::new` never fails and a mistake is reported at its token.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt as _;
use syn::{
    Expr, ExprLit, ExprUnary, FnArg, GenericArgument, Ident, Lit, LitInt, LitStr, Member, Pat,
    PathArguments, ReturnType, Type, UnOp,
};

use ratelimit_core::{Quota, QuotaError, Rate};

use crate::attr::{closest, Args, KeyArg};
use crate::body::Body;
use crate::key::{Placeholder, Segment, Template, TemplateError};

const TOO_LARGE: &str = "quota too large to compute exactly: capacity times the rate's period \
                         must stay under 2^52 microseconds; lower the capacity or state the rate \
                         over a shorter period";

/// What the attribute needs to know about the function it is on.
pub(crate) struct Function<'a> {
    pub name: &'a Ident,
    params: Vec<Param<'a>>,
    /// Where a return type that cannot carry a denial is reported: the first
    /// and last tokens of the error type of a visible `Result<T, E>`, else of
    /// the whole type.
    pub return_span: (Span, Span),
}

enum Param<'a> {
    /// `self`, `&self`, `&mut self`, `self: Arc<Self>`...
    Receiver,
    /// `user_id: u64`, `mut user_id: u64`
    Named(&'a Ident),
    /// `(a, b): (u64, u64)`: its bindings cannot be named by a key.
    Pattern(&'a Pat),
}

/// One attribute, checked.
pub(crate) struct Check {
    pub krate: TokenStream,
    pub quota: QuotaArg,
    /// `rule = "..."`: the name looked up in the limiter's rules.
    pub rule: Option<LitStr>,
    pub key: Key,
    pub cost: Cost,
    /// `exempt = <expression>`: when true, the call skips the limit.
    pub exempt: Option<Expr>,
    pub limiter: Option<Expr>,
    /// `on_error = ...`: the `FailurePolicy` variant.
    pub on_error: Option<&'static str>,
    /// `mode = shadow`.
    pub shadow: bool,
    /// `lease = N`: tokens taken per backend call and served in process.
    pub lease: Option<u64>,
    /// `on_limit = wait(max = ...)`, in microseconds.
    pub wait_us: Option<u64>,
}

/// Where a call's quota comes from.
pub(crate) enum QuotaArg {
    /// The attribute's numbers, checked at compile time (the defaults of a
    /// named rule).
    Fixed(Fixed),
    /// `quota = <expression>`, evaluated at each call.
    PerCall(Expr),
}

/// A quota stated in the attribute.
pub(crate) struct Fixed {
    pub algorithm: Algorithm,
    /// The bucket size, or the window's limit.
    pub capacity: u64,
    /// The refill rate, or the limit per window.
    pub rate: Rate,
    /// Zero for bucket algorithms.
    pub window_us: u64,
}

pub(crate) enum Key {
    /// `key = "..."`: parts in order; `span` is the literal's.
    Template { parts: Vec<KeyPart>, span: Span },
    /// `key = <expression>`
    Expr(Expr),
}

pub(crate) enum KeyPart {
    Literal(String),
    /// The expression a placeholder stands for, such as `self.tenant.id`.
    Value(TokenStream),
}

pub(crate) enum Cost {
    Fixed(u64),
    Expr(Expr),
}

/// `algorithm = ...`: the runtime's algorithm, which the generated code
/// names by its variant (`Algorithm::TokenBucket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Algorithm(ratelimit_core::Algorithm);

fn algorithms() -> impl Iterator<Item = &'static str> {
    ratelimit_core::Algorithm::ALL.into_iter().map(|a| a.name())
}

impl Algorithm {
    fn runtime(self) -> ratelimit_core::Algorithm {
        self.0
    }

    /// The default, `token_bucket`.
    pub(crate) fn is_default(self) -> bool {
        self.0 == ratelimit_core::Algorithm::TokenBucket
    }

    /// The runtime's variant: `token_bucket` is `TokenBucket`. Named by the
    /// generated code, so an attribute and a runtime that disagree on
    /// algorithms fail to build.
    pub(crate) fn variant(self) -> proc_macro2::Ident {
        let camel: String = self
            .name()
            .split('_')
            .map(|word| {
                let mut chars = word.chars();
                chars
                    .next()
                    .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                    .unwrap_or_default()
            })
            .collect();
        proc_macro2::Ident::new(&camel, proc_macro2::Span::call_site())
    }

    pub(crate) fn name(self) -> &'static str {
        self.runtime().name()
    }

    /// Window algorithms take `limit` and `window`; the others `capacity` and `rate`.
    pub(crate) fn is_windowed(self) -> bool {
        self.runtime().is_windowed()
    }

    fn expected(self) -> &'static str {
        if self.is_windowed() {
            "`limit` and `window`"
        } else {
            "`capacity` and `rate`"
        }
    }

    fn parse(ident: &Ident) -> syn::Result<Self> {
        let written = ident.unraw().to_string();
        if let Some(algorithm) = ratelimit_core::Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == written)
        {
            return Ok(Algorithm(algorithm));
        }
        let expected = algorithms()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut message = format!("unknown algorithm `{written}`; expected one of {expected}");
        if let Some(closest) = closest(&written, algorithms()) {
            message.push_str(&format!("; did you mean `{closest}`?"));
        }
        Err(syn::Error::new(ident.span(), message))
    }
}

/// Why a `rate` was refused, for the message at its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateError {
    Invalid,
    Zero,
    TooLarge,
}

impl From<QuotaError> for RateError {
    fn from(error: QuotaError) -> Self {
        match error {
            QuotaError::ZeroRate => RateError::Zero,
            QuotaError::TooLarge => RateError::TooLarge,
            _ => RateError::Invalid,
        }
    }
}

/// Parses `rate = "100/min"`, `rate = 2.5` and the other forms with the
/// runtime's own parser (a bare number is tokens per second).
fn parse_rate(text: &str) -> Result<Rate, RateError> {
    text.parse::<Rate>().map_err(RateError::from)
}

/// The rate's period in microseconds (at most 2^52, so the cast is exact).
pub(crate) fn period_us(rate: &Rate) -> u64 {
    rate.period().as_micros() as u64
}

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
            FnArg::Receiver(_) => Param::Receiver,
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
fn return_span(ty: &Type) -> (Span, Span) {
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
fn token_spans(tokens: TokenStream) -> (Span, Span) {
    let mut tokens = tokens.into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| match t {
        proc_macro2::TokenTree::Group(group) => group.span_close(),
        t => t.span(),
    });
    (first, last)
}

impl Function<'_> {
    /// Checks one attribute's options against this function.
    pub(crate) fn check(&self, args: Args) -> syn::Result<Check> {
        let key = match &args.key {
            Some(key) => key,
            None => {
                return Err(args.error_at_attribute(
                    "`#[rate_limit]` needs a `key`; add `key = \"name:<param>\"`, which says \
                     whose bucket a call takes from",
                ))
            }
        };
        let rule = args.rule.as_ref().map(rule_name).transpose()?;
        let quota = match &args.quota {
            Some(expr) => per_call_quota(&args, expr)?,
            None => QuotaArg::Fixed(fixed_quota(&args)?),
        };
        let key = match key {
            KeyArg::Template(lit) => self.key_template(lit)?,
            KeyArg::Expr(expr) => Key::Expr(expr.clone()),
        };
        let cost = match &args.cost {
            None => Cost::Fixed(1),
            Some(Expr::Lit(ExprLit {
                lit: Lit::Int(lit), ..
            })) => {
                let cost = lit.base10_parse::<u64>()?;
                if let QuotaArg::Fixed(fixed) = &quota {
                    let capacity_name = if fixed.algorithm.is_windowed() {
                        "limit"
                    } else {
                        "capacity"
                    };
                    let capacity = fixed.capacity;
                    if cost > capacity {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "`cost = {cost}` is greater than `{capacity_name} = {capacity}`, \
                                 so no call could ever be admitted; lower the cost or raise the \
                                 {capacity_name}"
                            ),
                        ));
                    }
                }
                Cost::Fixed(cost)
            }
            Some(expr) => Cost::Expr(expr.clone()),
        };
        let lease = match &args.lease {
            None => None,
            Some(expr) => {
                let tokens = positive_integer(expr, "lease")?;
                if let QuotaArg::Fixed(fixed) = &quota {
                    if fixed.algorithm.name() == "leaky_bucket" {
                        return Err(syn::Error::new_spanned(
                            expr,
                            "`leaky_bucket` cannot lease tokens: each admission carries its own \
                             delay; remove `lease` or choose another algorithm",
                        ));
                    }
                }
                Some(tokens)
            }
        };
        Ok(Check {
            lease,
            krate: match &args.krate {
                Some(path) => path.to_token_stream(),
                None => facade_path(),
            },
            quota,
            rule,
            key,
            cost,
            exempt: args.exempt.clone(),
            limiter: args.limiter.clone(),
            on_error: args.on_error.as_ref().map(failure_policy).transpose()?,
            shadow: args
                .mode
                .as_ref()
                .map(shadow_mode)
                .transpose()?
                .unwrap_or(false),
            wait_us: args
                .on_limit
                .as_ref()
                .map(wait_limit)
                .transpose()?
                .flatten(),
        })
    }

    fn key_template(&self, lit: &LitStr) -> syn::Result<Key> {
        let template = Template::parse(&lit.value())
            .map_err(|err: TemplateError| syn::Error::new(lit.span(), err))?;
        let mut parts = Vec::with_capacity(template.segments.len());
        for segment in template.segments {
            match segment {
                Segment::Literal(text) => parts.push(KeyPart::Literal(text)),
                Segment::Placeholder(placeholder) => {
                    // Tokens take the literal's span, so the compiler's errors
                    // about a placeholder (no such field, not `Display`)
                    // point at the template.
                    let root = self.placeholder_root(&placeholder, lit)?;
                    let fields = placeholder
                        .fields
                        .iter()
                        .map(|field| member(field, lit.span()));
                    parts.push(KeyPart::Value(quote!(#root #(. #fields)*)));
                }
            }
        }
        Ok(Key::Template {
            parts,
            span: lit.span(),
        })
    }

    /// The parameter a placeholder names, with the literal's span.
    fn placeholder_root(
        &self,
        placeholder: &Placeholder,
        lit: &LitStr,
    ) -> syn::Result<TokenStream> {
        let root = placeholder.root.as_str();
        let function = self.name.unraw();
        let fail = |message: String| Err(syn::Error::new(lit.span(), message));
        if root == "self" {
            if self.params.iter().any(|p| matches!(p, Param::Receiver)) {
                return Ok(quote_spanned!(lit.span()=> self));
            }
            let mut message =
                format!("`{placeholder}` needs a `self` parameter, and `{function}` has none");
            if let Some(expected) = self.expected() {
                message.push_str(&format!("; expected one of {expected}"));
            }
            return fail(message);
        }
        for param in &self.params {
            match param {
                Param::Named(ident) if ident.unraw() == root => {
                    let mut ident = (*ident).clone();
                    ident.set_span(lit.span());
                    return Ok(ident.into_token_stream());
                }
                Param::Pattern(pat) => {
                    if let Some(path) = binding_path(pat, root) {
                        let example = match path {
                            Some(path) => {
                                let rest: String =
                                    placeholder.fields.iter().map(|f| format!(".{f}")).collect();
                                format!(", such as `<arg{path}{rest}>`")
                            }
                            None => String::new(),
                        };
                        return fail(format!(
                            "`{placeholder}` is bound inside a pattern, which a key cannot refer \
                             to; bind the parameter to a name and use a field of it{example}"
                        ));
                    }
                }
                _ => {}
            }
        }
        let mut message = format!("`{placeholder}` is not a parameter of `{function}`");
        match self.expected() {
            Some(expected) => message.push_str(&format!("; expected one of {expected}")),
            None => message.push_str("; it takes no parameters, so use a literal key"),
        }
        let names = self.names();
        if let Some(closest) = closest(root, names.iter().map(String::as_str)) {
            message.push_str(&format!("; did you mean `{closest}`?"));
        }
        fail(message)
    }

    /// The names a placeholder can start with, in declaration order.
    fn names(&self) -> Vec<String> {
        self.params
            .iter()
            .filter_map(|param| match param {
                Param::Receiver => Some("self".to_owned()),
                Param::Named(ident) => Some(ident.unraw().to_string()),
                Param::Pattern(_) => None,
            })
            .collect()
    }

    fn expected(&self) -> Option<String> {
        let names = self.names();
        let listed = names.iter().map(|name| format!("`{name}`"));
        (!names.is_empty()).then(|| listed.collect::<Vec<_>>().join(", "))
    }
}

/// `.field` or `.0` of a placeholder, as a member expression.
fn member(field: &str, span: Span) -> Member {
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
fn binding_path(pat: &Pat, name: &str) -> Option<Option<String>> {
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

fn elements_path<'a>(
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

/// The attribute's own quota: `capacity` and `rate`, or `limit` and
/// `window`, for its algorithm.
fn fixed_quota(args: &Args) -> syn::Result<Fixed> {
    let missing = |option: &str, fix: &str| {
        args.error_at_attribute(&format!("`#[rate_limit]` needs a `{option}`; add {fix}"))
    };
    let algorithm = match &args.algorithm {
        Some(ident) => Algorithm::parse(ident)?,
        None => Algorithm(ratelimit_core::Algorithm::TokenBucket),
    };
    // An option the algorithm does not take is an error at its value.
    let (unwanted, wanted) = if algorithm.is_windowed() {
        (
            [("capacity", &args.capacity), ("rate", &args.rate)],
            ["limit", "window"],
        )
    } else {
        (
            [("limit", &args.limit), ("window", &args.window)],
            ["capacity", "rate"],
        )
    };
    for (option, value) in unwanted {
        if let Some(value) = value {
            return Err(syn::Error::new_spanned(
                value,
                format!(
                    "`{}` takes {}, not `{option}`; write `{} = ...` and `{} = ...`",
                    algorithm.name(),
                    algorithm.expected(),
                    wanted[0],
                    wanted[1]
                ),
            ));
        }
    }
    if algorithm.is_windowed() {
        let needs = |option: &str, fix: &str| {
            args.error_at_attribute(&format!(
                "`algorithm = {}` needs a `{option}`; add {fix}",
                algorithm.name()
            ))
        };
        let limit = args
            .limit
            .as_ref()
            .ok_or_else(|| needs("limit", "`limit = N`, the most calls admitted per window"))?;
        let window = args.window.as_ref().ok_or_else(|| {
            needs(
                "window",
                "`window = \"1m\"` (or \"1s\", \"1h\", \"1d\", \"10s\"...)",
            )
        })?;
        let limit_value = positive_integer(limit, "limit")?;
        let window_us = window_value(window)?;
        // The runtime's own checks: the window is valid by now, so only the
        // size can be refused.
        let quota = Quota::builder(algorithm.runtime())
            .limit(limit_value)
            .window(std::time::Duration::from_micros(window_us))
            .build()
            .map_err(|_| syn::Error::new_spanned(limit, TOO_LARGE))?;
        Ok(Fixed {
            algorithm,
            capacity: limit_value,
            rate: quota.rate(),
            window_us,
        })
    } else {
        let capacity = match &args.capacity {
            Some(capacity) => capacity,
            None => {
                return Err(missing(
                    "capacity",
                    "`capacity = N`, the largest burst of calls admitted",
                ))
            }
        };
        let rate = match &args.rate {
            Some(rate) => rate,
            None => {
                return Err(missing(
                    "rate",
                    "`rate = \"N/s\"` (or `\"N/min\"`, `\"N/h\"`...), how fast spent tokens \
                     come back",
                ))
            }
        };
        let capacity_value = positive_integer(capacity, "capacity")?;
        let rate = rate_value(rate)?;
        // The runtime's own check; the capacity is positive by now, so only
        // the size can be refused.
        Quota::builder(algorithm.runtime())
            .capacity(capacity_value)
            .rate(rate)
            .build()
            .map_err(|_| syn::Error::new_spanned(capacity, TOO_LARGE))?;
        Ok(Fixed {
            algorithm,
            capacity: capacity_value,
            rate,
            window_us: 0,
        })
    }
}

/// `quota = <expression>`: it chooses the whole quota, so no option that
/// states one may be given too.
fn per_call_quota(args: &Args, expr: &Expr) -> syn::Result<QuotaArg> {
    if let Some(rule) = &args.rule {
        return Err(syn::Error::new_spanned(
            rule,
            "`quota = ...` chooses each call's quota, so `rule` cannot name one too; remove \
             `rule`, or look the rule up in the expression, such as \
             `quota = limiter.rules().get(\"vip\").unwrap_or(DEFAULT)`",
        ));
    }
    let stated: [(&str, Option<&dyn ToTokens>); 5] = [
        (
            "algorithm",
            args.algorithm.as_ref().map(|a| a as &dyn ToTokens),
        ),
        (
            "capacity",
            args.capacity.as_ref().map(|e| e as &dyn ToTokens),
        ),
        ("rate", args.rate.as_ref().map(|e| e as &dyn ToTokens)),
        ("limit", args.limit.as_ref().map(|e| e as &dyn ToTokens)),
        ("window", args.window.as_ref().map(|e| e as &dyn ToTokens)),
    ];
    for (option, value) in stated {
        if let Some(value) = value {
            return Err(syn::Error::new_spanned(
                value,
                format!(
                    "`quota = ...` chooses each call's quota, so `{option}` cannot be given too; \
                     remove `{option}`, or remove `quota` for a fixed quota"
                ),
            ));
        }
    }
    if let Expr::Lit(lit) = expr {
        return Err(syn::Error::new_spanned(
            lit,
            "`quota` must be an expression giving a `Quota` at each call, such as \
             `quota = tier_quota(&user)`; for a fixed quota write `capacity = ...` and \
             `rate = ...` instead",
        ));
    }
    Ok(QuotaArg::PerCall(expr.clone()))
}

/// `rule = "order_submit"`: a string literal, a name the runtime accepts
/// (mirrors `ratelimit_core`'s rule names, so any rule can be published).
fn rule_name(expr: &Expr) -> syn::Result<LitStr> {
    let Expr::Lit(ExprLit {
        lit: Lit::Str(name),
        ..
    }) = expr
    else {
        return Err(syn::Error::new_spanned(
            expr,
            "`rule` must be a string literal naming the rule, such as `rule = \"order_submit\"`",
        ));
    };
    let value = name.value();
    if value.is_empty() {
        return Err(syn::Error::new(
            name.span(),
            "`rule` cannot be empty; name the rule, such as `rule = \"order_submit\"`",
        ));
    }
    let valid = value.len() <= 128
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'/'));
    if !valid {
        return Err(syn::Error::new(
            name.span(),
            format!(
                "invalid rule name `{value}`; use 1 to 128 letters, digits and `_`, `-`, `.`, \
                 `:`, `/`, such as `rule = \"order_submit\"`"
            ),
        ));
    }
    Ok(name.clone())
}

/// `capacity = 10`: an integer literal greater than 0.
fn positive_integer(expr: &Expr, option: &str) -> syn::Result<u64> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => {
            let value = parse_u64(lit)?;
            if value == 0 {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("`{option}` must be greater than 0"),
                ));
            }
            Ok(value)
        }
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => Err(syn::Error::new_spanned(
            expr,
            format!("`{option}` must be greater than 0"),
        )),
        _ => Err(syn::Error::new_spanned(
            expr,
            format!(
                "`{option}` must be an integer literal, such as `{option} = 10`, so that the \
                 quota is checked at compile time"
            ),
        )),
    }
}

/// One of `choices` (by name), or an error listing them.
fn one_of(ident: &Ident, option: &str, choices: &[&'static str]) -> syn::Result<&'static str> {
    let written = ident.unraw().to_string();
    if let Some(choice) = choices.iter().find(|c| **c == written) {
        return Ok(choice);
    }
    let expected = choices
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut message = format!("unknown `{option}` value `{written}`; expected one of {expected}");
    if let Some(closest) = closest(&written, choices.iter().copied()) {
        message.push_str(&format!("; did you mean `{closest}`?"));
    }
    Err(syn::Error::new(ident.span(), message))
}

/// `on_error = open | closed | local`: the `FailurePolicy` variant's name.
fn failure_policy(ident: &Ident) -> syn::Result<&'static str> {
    Ok(
        match one_of(ident, "on_error", &["open", "closed", "local"])? {
            "open" => "Open",
            "closed" => "Closed",
            _ => "Local",
        },
    )
}

/// `mode = enforce | shadow`: whether in shadow mode.
fn shadow_mode(ident: &Ident) -> syn::Result<bool> {
    Ok(one_of(ident, "mode", &["enforce", "shadow"])? == "shadow")
}

/// `on_limit = deny | wait(max = "2s")`: the longest wait, in microseconds.
fn wait_limit(arg: &crate::attr::OnLimitArg) -> syn::Result<Option<u64>> {
    match one_of(&arg.behaviour, "on_limit", &["deny", "wait"])? {
        "deny" => match arg.parens {
            Some(span) => Err(syn::Error::new(
                span,
                "`on_limit = deny` takes no arguments",
            )),
            None => Ok(None),
        },
        _ => {
            let Some(max) = &arg.max else {
                return Err(syn::Error::new(
                    arg.parens.unwrap_or_else(|| arg.behaviour.span()),
                    "`on_limit = wait` needs the longest wait; write `on_limit = wait(max = \"2s\")`",
                ));
            };
            let value = max.value();
            // The runtime's own spans; a unit alone is not a wait.
            let counted = value.trim().starts_with(|c: char| c.is_ascii_digit());
            ratelimit_core::__span_micros(&value)
                .filter(|&us| counted && us > 0 && us <= u128::from(u64::MAX))
                .map(|us| Some(us as u64))
                .ok_or_else(|| {
                    syn::Error::new(
                        max.span(),
                        format!(
                            "invalid wait `{value:?}`; expected a duration such as \"500ms\", \"2s\" or \"1m\""
                        ),
                    )
                })
        }
    }
}

/// `window = "1m"`: a whole, non-zero number of milliseconds.
fn window_value(expr: &Expr) -> syn::Result<u64> {
    let invalid = |shown: &str| {
        syn::Error::new_spanned(
            expr,
            format!(
                "invalid window {shown}; expected a whole number of milliseconds such as \"1s\", \
                 \"1m\", \"1h\", \"1d\" or \"500ms\""
            ),
        )
    };
    let Expr::Lit(ExprLit {
        lit: Lit::Str(text),
        ..
    }) = expr
    else {
        return Err(invalid(&format!("`{}`", expr.to_token_stream())));
    };
    let value = text.value();
    let too_large = || syn::Error::new_spanned(expr, TOO_LARGE);
    let window = match Quota::parse_window(&value) {
        Ok(window) => window,
        Err(QuotaError::TooLarge) => return Err(too_large()),
        Err(_) => return Err(invalid(&format!("`{value:?}`"))),
    };
    // The runtime's own bound on a window, checked with the smallest limit.
    Quota::builder(ratelimit_core::Algorithm::FixedWindow)
        .limit(1)
        .window(window)
        .build()
        .map_err(|_| too_large())?;
    Ok(window.as_micros() as u64)
}

fn parse_u64(lit: &LitInt) -> syn::Result<u64> {
    lit.base10_parse::<u64>()
        .map_err(|_| syn::Error::new(lit.span(), TOO_LARGE))
}

/// `rate = 2`, `rate = 2.5` (tokens per second) or `rate = "100/min"`.
fn rate_value(expr: &Expr) -> syn::Result<Rate> {
    let expected = "`rate` must be tokens per second, such as `rate = 2` or `rate = 2.5`, or a \
                    string such as `rate = \"100/min\"`";
    let (lit, rate) = match expr {
        Expr::Lit(ExprLit { lit, .. }) => {
            let rate = match lit {
                Lit::Int(int) => match int.base10_digits().parse::<u128>() {
                    Ok(_) => parse_rate(int.base10_digits()),
                    Err(_) => Err(RateError::TooLarge),
                },
                Lit::Float(float) => parse_rate(float.base10_digits()),
                Lit::Str(text) => parse_rate(&text.value()),
                _ => return Err(syn::Error::new_spanned(expr, expected)),
            };
            (lit, rate)
        }
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_), ..
        }) => {
            return Err(syn::Error::new_spanned(
                expr,
                "`rate` must be greater than 0",
            ))
        }
        _ => return Err(syn::Error::new_spanned(expr, expected)),
    };
    rate.map_err(|err| {
        let message = match err {
            RateError::Zero => "`rate` must be greater than 0".to_owned(),
            RateError::TooLarge => TOO_LARGE.to_owned(),
            RateError::Invalid if matches!(lit, Lit::Str(_)) => format!(
                "invalid rate `{}`; expected a form such as \"5/s\", \"100/min\", \"3600/h\", \
                 \"1000/d\", \"10/30s\" or \"2.5/s\"",
                lit.to_token_stream()
            ),
            RateError::Invalid => format!(
                "invalid rate `{}`; write tokens per second as a decimal number, such as `2.5`, \
                 or a string such as \"100/min\"",
                lit.to_token_stream()
            ),
        };
        syn::Error::new(lit.span(), message)
    })
}

/// The facade's package, and the name of its library.
const FACADE_PACKAGE: &str = "distributed-ratelimit";
const FACADE_LIBRARY: &str = "ratelimit";

/// The path of the facade in the crate being compiled: under the name its
/// `Cargo.toml` gives it (`rl = { package = "distributed-ratelimit", .. }`
/// makes it `::rl`), else `::ratelimit`, the library's own name (a dependency
/// not renamed, the facade's own tests and examples, and a crate whose
/// manifest cannot be read).
fn facade_path() -> TokenStream {
    use proc_macro_crate::{crate_name, FoundCrate};
    let name = match crate_name(FACADE_PACKAGE) {
        // Named after the package, not renamed: known by its library's name.
        Ok(FoundCrate::Name(name)) if name != FACADE_PACKAGE.replace('-', "_") => name,
        _ => FACADE_LIBRARY.to_owned(),
    };
    let name = proc_macro2::Ident::new(&name, proc_macro2::Span::call_site());
    quote!(::#name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fraction(rate: Result<Rate, RateError>) -> Result<(u64, u64), RateError> {
        rate.map(|rate| (rate.tokens(), period_us(&rate)))
    }

    #[test]
    fn rate_strings_reduce_to_exact_fractions() {
        let cases = [
            ("5/s", (1, 200_000)),
            ("100/min", (1, 600_000)),
            ("3600/h", (1, 1_000_000)),
            ("1000/d", (1, 86_400_000)),
            ("1000000/day", (1, 86_400)),
            ("7/m", (7, 60_000_000)),
            ("2.5/s", (1, 400_000)),
            ("10/30s", (1, 3_000_000)),
            ("1/500ms", (1, 500_000)),
            (" 1 / 500ms ", (1, 500_000)),
            ("3/2 hours", (1, 2_400_000_000)),
            ("4/µs", (4, 1)),
            (".5/sec", (1, 2_000_000)),
            ("5./minute", (1, 12_000_000)),
        ];
        for (text, expected) in cases {
            assert_eq!(fraction(parse_rate(text)), Ok(expected), "rate {text:?}");
        }
    }

    #[test]
    fn malformed_rate_strings_are_rejected_like_the_runtime_does() {
        for text in [
            "",
            "5/",
            "/s",
            "5/fortnight",
            "-5/s",
            "a/s",
            "1.2.3/s",
            "./s",
            "5/ s2",
            "1e3/s",
            "5/-1s",
        ] {
            assert_eq!(parse_rate(text), Err(RateError::Invalid), "rate {text:?}");
        }
        for text in ["0/s", "0.0/min", "5/0s"] {
            assert_eq!(parse_rate(text), Err(RateError::Zero), "rate {text:?}");
        }
        for text in ["1/100000000000d", "9007199254740993/s"] {
            assert_eq!(parse_rate(text), Err(RateError::TooLarge), "rate {text:?}");
        }
    }

    #[test]
    fn numeric_rates_are_tokens_per_second() {
        assert_eq!(fraction(parse_rate("2")), Ok((1, 500_000)), "rate = 2");
        assert_eq!(
            fraction(parse_rate("0.5")),
            Ok((1, 2_000_000)),
            "rate = 0.5"
        );
        assert_eq!(fraction(parse_rate("2.5")), Ok((1, 400_000)), "rate = 2.5");
        assert_eq!(fraction(parse_rate("3")), Ok((3, 1_000_000)), "rate = 3");
        assert_eq!(parse_rate("0"), Err(RateError::Zero), "rate = 0");
    }

    fn check(attr: &str, item: &str) -> syn::Result<Check> {
        let item: syn::ItemFn = syn::parse_str(item).unwrap();
        let args: Args = syn::parse_str(attr).unwrap();
        function(&item.sig, &Body::of(&item))?.check(args)
    }

    fn error(attr: &str, item: &str) -> String {
        match check(attr, item) {
            Ok(_) => panic!("`{attr}` on `{item}` was accepted"),
            Err(err) => err.to_string(),
        }
    }

    const SUBMIT: &str =
        "async fn submit_order(user_id: u64, item: Item) -> Result<(), AppError> { Ok(()) }";

    #[test]
    fn numeric_rate_literals_are_checked() {
        let rate = |attr| match check(attr, SUBMIT).ok()?.quota {
            QuotaArg::Fixed(fixed) => Some((fixed.rate.tokens(), period_us(&fixed.rate))),
            QuotaArg::PerCall(_) => None,
        };
        assert_eq!(
            rate("key = \"k\", capacity = 1, rate = 2"),
            Some((1, 500_000))
        );
        assert_eq!(
            rate("key = \"k\", capacity = 1, rate = 0.5"),
            Some((1, 2_000_000))
        );
        assert_eq!(
            rate("key = \"k\", capacity = 1, rate = 2.5"),
            Some((1, 400_000))
        );
        assert_eq!(
            error("key = \"k\", capacity = 1, rate = 1e3", SUBMIT),
            "invalid rate `1e3`; write tokens per second as a decimal number, such as `2.5`, \
             or a string such as \"100/min\""
        );
    }

    #[test]
    fn quotas_that_cannot_be_exact_are_rejected() {
        assert_eq!(
            error("key = \"k\", capacity = 1000000000, rate = \"1/h\"", SUBMIT),
            TOO_LARGE
        );
        assert!(check(
            "key = \"k\", capacity = 1000000, rate = \"1000000/d\"",
            SUBMIT
        )
        .is_ok());
        let windowed = |window: &str| {
            format!("key = \"k\", algorithm = fixed_window, limit = 1, window = \"{window}\"")
        };
        assert_eq!(error(&windowed("100000d"), SUBMIT), TOO_LARGE);
        assert!(check(&windowed("50000d"), SUBMIT).is_ok());
    }

    #[test]
    fn placeholders_must_name_a_parameter() {
        assert_eq!(
            error("key = \"o:<user>\", capacity = 1, rate = 1", SUBMIT),
            "`<user>` is not a parameter of `submit_order`; expected one of `user_id`, `item`; \
             did you mean `user_id`?"
        );
        assert_eq!(
            error("key = \"o:<zzz.id>\", capacity = 1, rate = 1", SUBMIT),
            "`<zzz.id>` is not a parameter of `submit_order`; expected one of `user_id`, `item`"
        );
        assert_eq!(
            error(
                "key = \"o:<a>\", capacity = 1, rate = 1",
                "async fn f() -> Result<(), E> { Ok(()) }"
            ),
            "`<a>` is not a parameter of `f`; it takes no parameters, so use a literal key"
        );
        assert_eq!(
            error("key = \"o:<self.tenant>\", capacity = 1, rate = 1", SUBMIT),
            "`<self.tenant>` needs a `self` parameter, and `submit_order` has none; expected one \
             of `user_id`, `item`"
        );
    }

    #[test]
    fn placeholders_bound_by_a_pattern_suggest_a_field_path() {
        let item = "async fn f(x: u8, (a, Point { y, .. }): (u64, Point), [s, ..]: [u8; 2], \
                    (.., z): (u8, u8)) -> Result<(), E> { Ok(()) }";
        let cases = [
            (
                "a",
                "`<a>` is bound inside a pattern, which a key cannot refer to; bind the \
                   parameter to a name and use a field of it, such as `<arg.0>`",
            ),
            (
                "a.id",
                "`<a.id>` is bound inside a pattern, which a key cannot refer to; bind \
                      the parameter to a name and use a field of it, such as `<arg.0.id>`",
            ),
            (
                "y",
                "`<y>` is bound inside a pattern, which a key cannot refer to; bind the \
                   parameter to a name and use a field of it, such as `<arg.1.y>`",
            ),
            // Elements of a slice, or after `..`, have no field path to suggest.
            (
                "s",
                "`<s>` is bound inside a pattern, which a key cannot refer to; bind the \
                   parameter to a name and use a field of it",
            ),
            (
                "z",
                "`<z>` is bound inside a pattern, which a key cannot refer to; bind the \
                   parameter to a name and use a field of it",
            ),
        ];
        for (placeholder, expected) in cases {
            let attr = format!("key = \"<{placeholder}>\", capacity = 1, rate = 1");
            assert_eq!(error(&attr, item), expected, "placeholder <{placeholder}>");
        }
    }

    #[test]
    fn placeholders_become_field_accesses_on_the_parameter() {
        let check = check(
            "key = \"<self.a.0>:<type>:<mut_id>\", capacity = 1, rate = 1",
            "async fn f(&self, r#type: u8, mut mut_id: u8) -> Result<(), E> { Ok(()) }",
        )
        .unwrap();
        let Key::Template { parts, .. } = check.key else {
            panic!("a template")
        };
        let values: Vec<String> = parts
            .iter()
            .filter_map(|part| match part {
                KeyPart::Value(tokens) => Some(tokens.to_string()),
                KeyPart::Literal(_) => None,
            })
            .collect();
        assert_eq!(values, ["self . a . 0", "r#type", "mut_id"]);
    }

    #[test]
    fn a_fixed_cost_cannot_exceed_the_capacity() {
        assert!(check("key = \"k\", capacity = 5, rate = 1, cost = 5", SUBMIT).is_ok());
        assert_eq!(
            error("key = \"k\", capacity = 5, rate = 1, cost = 6", SUBMIT),
            "`cost = 6` is greater than `capacity = 5`, so no call could ever be admitted; \
             lower the cost or raise the capacity"
        );
    }

    #[test]
    fn a_named_rule_keeps_the_attribute_numbers_as_its_defaults() {
        let check = check(
            "key = \"k\", rule = \"api/v1:search\", capacity = 3, rate = 1",
            SUBMIT,
        )
        .unwrap();
        assert_eq!(check.rule.unwrap().value(), "api/v1:search");
        assert!(matches!(
            check.quota,
            QuotaArg::Fixed(Fixed { capacity: 3, .. })
        ));
        assert_eq!(
            error("key = \"k\", rule = \"\", capacity = 3, rate = 1", SUBMIT),
            "`rule` cannot be empty; name the rule, such as `rule = \"order_submit\"`"
        );
        assert!(error(
            "key = \"k\", rule = \"a b\", capacity = 3, rate = 1",
            SUBMIT
        )
        .starts_with("invalid rule name `a b`"));
        assert!(
            error("key = \"k\", rule = NAME, capacity = 3, rate = 1", SUBMIT)
                .starts_with("`rule` must be a string literal")
        );
        assert!(
            error("key = \"k\", rule = \"r\", rate = 1", SUBMIT).contains("needs a `capacity`"),
            "a named rule needs its defaults"
        );
    }

    #[test]
    fn a_per_call_quota_replaces_every_option_that_states_one() {
        let check = check(
            "key = \"k\", quota = tier(&user_id), cost = 500, exempt = user_id == 0",
            SUBMIT,
        )
        .unwrap();
        assert!(matches!(check.quota, QuotaArg::PerCall(_)));
        assert!(check.exempt.is_some());
        for option in [
            "capacity = 1",
            "rate = 1",
            "limit = 1",
            "window = \"1s\"",
            "algorithm = gcra",
        ] {
            let name = option.split(' ').next().unwrap();
            assert_eq!(
                error(&format!("key = \"k\", quota = q, {option}"), SUBMIT),
                format!(
                    "`quota = ...` chooses each call's quota, so `{name}` cannot be given too; \
                     remove `{name}`, or remove `quota` for a fixed quota"
                )
            );
        }
        assert!(error("key = \"k\", quota = q, rule = \"r\"", SUBMIT)
            .starts_with("`quota = ...` chooses each call's quota, so `rule` cannot name one too"));
        assert!(error("key = \"k\", quota = 10", SUBMIT)
            .starts_with("`quota` must be an expression giving a `Quota`"));
    }

    #[test]
    fn the_function_must_be_async_and_return_a_type() {
        let attr = "key = \"k\", capacity = 1, rate = 1";
        assert!(
            error(attr, "fn f() -> Result<(), E> { Ok(()) }").contains("requires an `async fn`")
        );
        assert!(error(attr, "async fn f() {}").contains("add a return type"));
        // Whether the type carries a denial is checked by the compiler.
        for ty in ["io::Result<()>", "ApiResult<u8>", "Option<()>"] {
            let item = format!("async fn f() -> {ty} {{ todo!() }}");
            assert!(check(attr, &item).is_ok(), "{item}");
        }
    }
}
