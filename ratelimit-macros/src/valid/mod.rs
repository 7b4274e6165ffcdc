//! Checks the function and each attribute's options, and turns them into the
//! facts `expand` writes out: a quota in exact integers, key parts bound to
//! parameters, a cost.
//!
//! Every check that can be made at compile time is made here, so the generated
//! `Rule::new` never fails and a mistake is reported at its token.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt as _;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Pat};

use ratelimit_core::Rate;

use crate::attr::{closest, Args, KeyArg};
use crate::key::{Placeholder, Segment, Template, TemplateError};

mod literals;
mod quota;
mod signature;

use literals::{failure_policy, positive_integer, refund_on, rule_name, shadow_mode, wait_limit};
use quota::{fixed_quota, per_call_quota};
use signature::{binding_path, member};

pub(crate) use quota::{period_us, Algorithm};
pub(crate) use signature::function;

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
    /// `self`, `&self`, `&mut self`, `self: Arc<Self>`...: the span of its
    /// `self`.
    Receiver(Span),
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
    /// `refund_on = err | ok`: the `RefundOn` variant, and the option's
    /// value for errors.
    pub refund_on: Option<(&'static str, proc_macro2::Span)>,
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
            KeyArg::Expr(expr) => {
                not_bytes(expr)?;
                no_placeholder_in_macro(expr)?;
                Key::Expr(expr.clone())
            }
        };
        let cost = match &args.cost {
            None => Cost::Fixed(1),
            Some(Expr::Lit(ExprLit {
                lit: Lit::Int(lit), ..
            })) => {
                let cost = lit.base10_parse::<u64>()?;
                if cost == 0 {
                    return Err(syn::Error::new(
                        lit.span(),
                        "`cost = 0` takes nothing, so every call would be admitted and the \
                         limit would never apply; remove `cost` (one token a call) or give \
                         the tokens a call takes",
                    ));
                }
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
        let lease =
            match &args.lease {
                None => None,
                Some(expr) => {
                    let tokens = positive_integer(expr, "lease")?;
                    if let QuotaArg::Fixed(fixed) = &quota {
                        match fixed.algorithm.name() {
                            "leaky_bucket" => return Err(syn::Error::new_spanned(
                                expr,
                                "`leaky_bucket` cannot lease tokens: each admission carries its \
                                 own delay; remove `lease` or choose another algorithm",
                            )),
                            "sliding_log" => {
                                return Err(syn::Error::new_spanned(
                                    expr,
                                    "`sliding_log` cannot lease tokens: it logs each admission's \
                                 instant, which a token served later would not be; remove \
                                 `lease` or choose another algorithm",
                                ))
                            }
                            _ => {}
                        }
                    }
                    // A lease is taken only when it is above the call's cost.
                    if let Cost::Fixed(cost) = cost {
                        if tokens <= cost {
                            return Err(syn::Error::new_spanned(
                                expr,
                                format!(
                                "`lease = {tokens}` leases nothing for a call of cost {cost}: a \
                                 lease takes more tokens than one call needs; raise it above \
                                 {cost} or remove it"
                            ),
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
            refund_on: match &args.refund_on {
                None => None,
                Some(ident) => Some((refund_on(ident)?, ident.span())),
            },
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
            if let Some(receiver) = self.params.iter().find_map(|p| match p {
                Param::Receiver(span) => Some(*span),
                _ => None,
            }) {
                // At the literal; resolved as the receiver is.
                return Ok(quote_spanned!(lit.span().resolved_at(receiver)=> self));
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
                    // At the literal; resolved as the parameter is (a
                    // template a `macro_rules!` passed in resolves
                    // elsewhere).
                    let mut ident = (*ident).clone();
                    ident.set_span(lit.span().resolved_at(ident.span()));
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
                Param::Receiver(_) => Some("self".to_owned()),
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

/// Rejects `key = b"..."` (or `c"..."`): neither a template, which is a
/// string literal, nor a `Display` value a whole key is made of.
fn not_bytes(expr: &Expr) -> syn::Result<()> {
    let kind = match expr {
        Expr::Lit(ExprLit {
            lit: Lit::ByteStr(_),
            ..
        }) => "a byte string",
        Expr::Lit(ExprLit {
            lit: Lit::CStr(_), ..
        }) => "a C string",
        Expr::Lit(ExprLit {
            lit: Lit::Byte(_), ..
        }) => "a byte",
        _ => return Ok(()),
    };
    Err(syn::Error::new_spanned(
        expr,
        format!(
            "`key` must be a string literal (a template such as `key = \"order:<user_id>\"`) or \
             an expression giving a `Display` value; {kind} is neither: write it as a string \
             literal, without its prefix"
        ),
    ))
}

/// Macros whose text becomes the string they build: a placeholder in it
/// looks like a template, but is copied as text.
const STRING_MACROS: [&str; 6] = [
    "concat",
    "stringify",
    "format",
    "format_args",
    "concatcp",
    "formatcp",
];

/// Rejects a `key = concat!("c:", "<user>")`, `format!("c:<user>")` or
/// `stringify!(c:<user>)`: only a string literal is a template, so the
/// `<user>` would be text, the same for every call, and every caller would
/// share one bucket. (A `const` holding such text cannot be seen into.)
fn no_placeholder_in_macro(expr: &Expr) -> syn::Result<()> {
    let mac = match expr {
        Expr::Macro(mac) => &mac.mac,
        Expr::Reference(reference) => return no_placeholder_in_macro(&reference.expr),
        Expr::Paren(paren) => return no_placeholder_in_macro(&paren.expr),
        Expr::Group(group) => return no_placeholder_in_macro(&group.expr),
        _ => return Ok(()),
    };
    let Some(name) = mac
        .path
        .segments
        .last()
        .map(|segment| segment.ident.to_string())
    else {
        return Ok(());
    };
    if !STRING_MACROS.contains(&name.as_str()) {
        return Ok(());
    }
    // A format that takes arguments, or names some in its text, varies
    // with them: `format!("api<v2>:{}", user)` is a key per user.
    let formats = name.starts_with("format");
    let takes_arguments = mac.tokens.clone().into_iter().any(|token| match token {
        proc_macro2::TokenTree::Punct(punct) => punct.as_char() == ',',
        proc_macro2::TokenTree::Literal(literal) => literal.to_string().contains('{'),
        _ => false,
    });
    if formats && takes_arguments {
        return Ok(());
    }
    let found = if name == "stringify" {
        let text: String = mac
            .tokens
            .to_string()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        crate::key::first_placeholder(&text).map(str::to_owned)
    } else {
        placeholder_in_literals(mac.tokens.clone())
    };
    match found {
        None => Ok(()),
        Some(placeholder) => Err(syn::Error::new_spanned(
            expr,
            format!(
                "`{placeholder}` in `{name}!` is not filled in: placeholders are filled only in \
                 a string literal template, and here it would be the same text for every call, \
                 so every caller would share one bucket; write the template as a literal, \
                 `key = \"...:{placeholder}\"`"
            ),
        )),
    }
}

/// The first placeholder in a string literal among `tokens`, at any depth.
fn placeholder_in_literals(tokens: TokenStream) -> Option<String> {
    tokens.into_iter().find_map(|token| match token {
        proc_macro2::TokenTree::Group(group) => placeholder_in_literals(group.stream()),
        proc_macro2::TokenTree::Literal(literal) => {
            let text = syn::parse2::<LitStr>(literal.into_token_stream())
                .ok()?
                .value();
            crate::key::first_placeholder(&text).map(str::to_owned)
        }
        _ => None,
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
        Ok(FoundCrate::Name(name)) if name != FACADE_PACKAGE.replace('-', "_") => name,
        // Named after the package: renamed only if its entry says so
        // (`distributed_ratelimit = { package = "distributed-ratelimit" }`,
        // the rename of a crate that also depends on crates.io's
        // `ratelimit`), else known by its library's name.
        Ok(FoundCrate::Name(name)) if renamed_to(&name) => name,
        _ => FACADE_LIBRARY.to_owned(),
    };
    let name = proc_macro2::Ident::new(&name, proc_macro2::Span::call_site());
    quote!(::#name)
}

/// Whether the crate being compiled renames the facade `name` with a
/// `package` key, in its own `Cargo.toml` or, for `{ workspace = true }`,
/// in its workspace's.
fn renamed_to(name: &str) -> bool {
    use std::sync::{Mutex, OnceLock};
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from) else {
        return false;
    };
    // Read once per crate compiled, not at each attribute (`name` is
    // always the package's own, so the crate's directory says it all).
    static READ: OnceLock<Mutex<Vec<(std::path::PathBuf, bool)>>> = OnceLock::new();
    let read = READ.get_or_init(Mutex::default);
    let mut read = read
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, renamed)) = read.iter().find(|(d, _)| *d == dir) {
        return *renamed;
    }
    let renamed = read_renamed_to(&dir, name);
    read.push((dir, renamed));
    renamed
}

/// [`renamed_to`], read from the manifests.
fn read_renamed_to(dir: &std::path::Path, name: &str) -> bool {
    let read = |dir: &std::path::Path| std::fs::read_to_string(dir.join("Cargo.toml")).ok();
    match read(dir).and_then(|manifest| entry_of(&manifest, name, false)) {
        Some(Entry::Renamed) => true,
        Some(Entry::FromWorkspace) => {
            dir.ancestors()
                .filter_map(read)
                .find(|manifest| manifest_has_workspace(manifest))
                .and_then(|manifest| entry_of(&manifest, name, true))
                == Some(Entry::Renamed)
        }
        _ => false,
    }
}

/// What a manifest's dependency entry `name` says of the facade.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// `package = "distributed-ratelimit"`: renamed to `name`.
    Renamed,
    /// `workspace = true`: as the workspace's entry says.
    FromWorkspace,
    /// Named without a `package` key.
    Plain,
}

/// The entry `name` of `manifest`'s dependencies (of any kind, any target),
/// or of its `[workspace.dependencies]` when `workspace`.
fn entry_of(manifest: &str, name: &str, workspace: bool) -> Option<Entry> {
    let document = manifest.parse::<toml_edit::DocumentMut>().ok()?;
    let root = document.as_table();
    let tables: Vec<&dyn toml_edit::TableLike> = if workspace {
        root.get("workspace")
            .and_then(|w| w.as_table_like())
            .and_then(|w| w.get("dependencies"))
            .and_then(|d| d.as_table_like())
            .into_iter()
            .collect()
    } else {
        let targets = root
            .get("target")
            .and_then(|t| t.as_table_like())
            .into_iter()
            .flat_map(|t| t.iter().filter_map(|(_, target)| target.as_table_like()));
        std::iter::once(root as &dyn toml_edit::TableLike)
            .chain(targets)
            .flat_map(|table| {
                ["dependencies", "dev-dependencies", "build-dependencies"]
                    .into_iter()
                    .filter_map(|kind| table.get(kind).and_then(|d| d.as_table_like()))
            })
            .collect()
    };
    tables.into_iter().find_map(|table| {
        let entry = table.get(name)?;
        let field = |key: &str| entry.as_table_like().and_then(|e| e.get(key));
        Some(
            if field("package").and_then(|p| p.as_str()) == Some(FACADE_PACKAGE) {
                Entry::Renamed
            } else if field("workspace").and_then(|w| w.as_bool()) == Some(true) {
                Entry::FromWorkspace
            } else {
                Entry::Plain
            },
        )
    })
}

/// Whether `manifest` is a workspace's root.
fn manifest_has_workspace(manifest: &str) -> bool {
    manifest
        .parse::<toml_edit::DocumentMut>()
        .is_ok_and(|document| document.as_table().contains_key("workspace"))
}

#[cfg(test)]
mod tests {
    use super::literals::TOO_LARGE;
    use super::quota::{parse_rate, RateError};
    use super::*;
    use crate::body::Body;

    fn fraction(rate: Result<Rate, RateError>) -> Result<(u64, u64), RateError> {
        rate.map(|rate| (rate.tokens(), period_us(&rate)))
    }

    /// A dependency renamed to the package's own name (with `_`) is told
    /// from one not renamed, in every table a dependency may be in.
    #[test]
    fn a_rename_to_the_packages_own_name_is_told_from_none() {
        let name = "distributed_ratelimit";
        for (manifest, expected) in [
            (
                "[dependencies]\ndistributed_ratelimit = { package = \"distributed-ratelimit\", version = \"0.1\" }",
                Some(Entry::Renamed),
            ),
            (
                "[target.'cfg(unix)'.dev-dependencies.distributed_ratelimit]\npackage = \"distributed-ratelimit\"",
                Some(Entry::Renamed),
            ),
            (
                "[dependencies]\ndistributed_ratelimit = { workspace = true }",
                Some(Entry::FromWorkspace),
            ),
            ("[dependencies]\ndistributed_ratelimit = \"0.1\"", Some(Entry::Plain)),
            ("[dependencies]\ndistributed-ratelimit = \"0.1\"", None),
            ("not toml [", None),
        ] {
            assert_eq!(entry_of(manifest, name, false), expected, "{manifest}");
        }
        let workspace = "[workspace]\n[workspace.dependencies]\n\
                         distributed_ratelimit = { package = \"distributed-ratelimit\", path = \"x\" }";
        assert_eq!(entry_of(workspace, name, true), Some(Entry::Renamed));
        assert!(manifest_has_workspace(workspace));
        assert!(!manifest_has_workspace("[package]\nname = \"a\""));
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
        let log = |limit: u64| {
            format!("key = \"k\", algorithm = sliding_log, limit = {limit}, window = \"1m\"")
        };
        assert!(check(&log(10_000), SUBMIT).is_ok());
        assert_eq!(
            error(&log(10_001), SUBMIT),
            "a sliding log's limit is at most 10000 (it keeps one entry per admitted unit), not \
             10001; `sliding_window` limits any number with two counts"
        );
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

    /// A tuple index too large for a `u32`, on which `Ident::new_raw` would
    /// panic, is reported at the key.
    #[test]
    fn a_tuple_index_rust_would_not_accept_is_an_error_not_a_panic() {
        let item = "async fn f(x: (u32,)) -> Result<(), E> { Ok(()) }";
        for index in ["99999999999", "00"] {
            let attr = format!("key = \"a:<x.{index}>\", capacity = 1, rate = 1");
            let message = std::panic::catch_unwind(|| error(&attr, item))
                .unwrap_or_else(|_| panic!("the attribute panicked on `{attr}`"));
            assert!(
                message.starts_with(&format!("invalid tuple index `.{index}`")),
                "{message}"
            );
        }
    }

    /// A byte string is no template, nor `Display`: the compiler said a
    /// placeholder's value must implement `Display`.
    #[test]
    fn a_byte_string_key_says_what_a_key_must_be() {
        for key in ["b\"order:<user_id>\"", "c\"order\"", "b'k'"] {
            let message = error(&format!("key = {key}, capacity = 1, rate = 1"), SUBMIT);
            assert!(
                message.starts_with(
                    "`key` must be a string literal (a template such as \
                     `key = \"order:<user_id>\"`) or an expression giving a `Display` value;"
                ),
                "{key}: {message}"
            );
        }
    }

    /// Only a string literal is a template: `<user>` in the text of a
    /// string macro was copied as is, so every caller shared one bucket.
    #[test]
    fn a_placeholder_in_a_string_macro_is_an_error() {
        for (key, placeholder, name) in [
            ("concat!(\"c:\", \"<user_id>\")", "<user_id>", "concat"),
            ("std::concat!(\"c:<user_id>\")", "<user_id>", "concat"),
            ("&format!(\"c:<user_id.x>\")", "<user_id.x>", "format"),
            ("stringify!(c:<user_id>)", "<user_id>", "stringify"),
        ] {
            let message = error(&format!("key = {key}, capacity = 1, rate = 1"), SUBMIT);
            assert!(
                message.starts_with(&format!(
                    "`{placeholder}` in `{name}!` is not filled in: placeholders are filled \
                     only in a string literal template"
                )),
                "{key}: {message}"
            );
        }
        for key in [
            "format!(\"c:{user_id}\")",
            "format!(\"c:<{user_id}>\")",
            // A format with arguments varies with them.
            "format!(\"api<v2>:{}\", user_id)",
            "concat!(\"a<b\", \">\")",
            "stringify!(a < b)",
            "my_key!(\"c:<user_id>\")",
        ] {
            assert!(
                check(&format!("key = {key}, capacity = 1, rate = 1"), SUBMIT).is_ok(),
                "{key}"
            );
        }
    }

    /// A lease too large for a u64 names the lease, not the quota (whose
    /// error says to lower the capacity).
    #[test]
    fn a_lease_too_large_names_the_lease() {
        assert_eq!(
            error(
                "key = \"k\", capacity = 10, rate = 1, lease = 99999999999999999999999",
                SUBMIT
            ),
            "`lease = 99999999999999999999999` is too large: `lease` must fit in a u64, at most \
             18446744073709551615"
        );
        assert_eq!(
            error(
                "key = \"k\", capacity = 99999999999999999999999, rate = 1",
                SUBMIT
            ),
            TOO_LARGE
        );
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
