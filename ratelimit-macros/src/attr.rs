//! The attribute's options as written: `key = ..., capacity = ..., rate = ...`.
//!
//! Parsing only checks the syntax (which options, each once); values are kept
//! as the user's tokens so that `valid` can point an error at exactly the
//! offending literal.

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Expr, ExprLit, Ident, Lit, LitStr, Meta, Path, Token};

/// Every option, in the order the documentation lists them, with how its
/// value is read into [`Args`]: a new option is a field of `Args` and an
/// entry here.
type ReadOption = fn(&mut Args, ParseStream, Span) -> syn::Result<()>;
const OPTIONS: [(&str, ReadOption); 17] = [
    ("key", |args, input, at| {
        set_once(&mut args.key, key_value(input)?, at, "key")
    }),
    ("rule", |args, input, at| {
        set_once(&mut args.rule, parse_value(input)?, at, "rule")
    }),
    ("capacity", |args, input, at| {
        set_once(&mut args.capacity, parse_value(input)?, at, "capacity")
    }),
    ("rate", |args, input, at| {
        set_once(&mut args.rate, parse_value(input)?, at, "rate")
    }),
    ("algorithm", |args, input, at| {
        set_once(&mut args.algorithm, ident_value(input)?, at, "algorithm")
    }),
    ("limit", |args, input, at| {
        set_once(&mut args.limit, parse_value(input)?, at, "limit")
    }),
    ("window", |args, input, at| {
        set_once(&mut args.window, parse_value(input)?, at, "window")
    }),
    ("quota", |args, input, at| {
        set_once(&mut args.quota, parse_value(input)?, at, "quota")
    }),
    ("cost", |args, input, at| {
        set_once(&mut args.cost, parse_value(input)?, at, "cost")
    }),
    ("exempt", |args, input, at| {
        set_once(&mut args.exempt, parse_value(input)?, at, "exempt")
    }),
    ("on_error", |args, input, at| {
        set_once(&mut args.on_error, ident_value(input)?, at, "on_error")
    }),
    ("on_limit", |args, input, at| {
        set_once(&mut args.on_limit, on_limit_value(input)?, at, "on_limit")
    }),
    ("refund_on", |args, input, at| {
        set_once(&mut args.refund_on, ident_value(input)?, at, "refund_on")
    }),
    ("mode", |args, input, at| {
        set_once(&mut args.mode, ident_value(input)?, at, "mode")
    }),
    ("lease", |args, input, at| {
        set_once(&mut args.lease, parse_value(input)?, at, "lease")
    }),
    ("limiter", |args, input, at| {
        set_once(&mut args.limiter, parse_value(input)?, at, "limiter")
    }),
    ("crate", |args, input, at| {
        input.parse::<Token![=]>()?;
        let path = input.call(Path::parse_mod_style)?;
        set_once(&mut args.krate, path, at, "crate")
    }),
];

/// One `#[rate_limit(...)]`.
#[derive(Default)]
pub(crate) struct Args {
    /// The attribute itself, for errors about a missing option: `None` for
    /// the attribute being expanded (the call site), `Some` for a stacked one.
    pub attr: Option<Attribute>,
    pub key: Option<KeyArg>,
    /// `rule = "name"`, checked to be a literal by `valid`.
    pub rule: Option<Expr>,
    pub capacity: Option<Expr>,
    pub rate: Option<Expr>,
    pub algorithm: Option<Ident>,
    pub limit: Option<Expr>,
    pub window: Option<Expr>,
    /// `quota = <expression>`, evaluated at each call.
    pub quota: Option<Expr>,
    pub cost: Option<Expr>,
    /// `exempt = <expression>`, a `bool` evaluated at each call.
    pub exempt: Option<Expr>,
    pub on_error: Option<Ident>,
    pub on_limit: Option<OnLimitArg>,
    /// `refund_on = err | ok`.
    pub refund_on: Option<Ident>,
    pub mode: Option<Ident>,
    pub lease: Option<Expr>,
    pub limiter: Option<Expr>,
    pub krate: Option<Path>,
}

/// `on_limit = deny` or `on_limit = wait(max = "2s")`.
pub(crate) struct OnLimitArg {
    pub behaviour: Ident,
    /// The `max = "..."` literal of `wait(...)`, and the parentheses' span
    /// when they are there without it.
    pub max: Option<LitStr>,
    pub parens: Option<Span>,
}

pub(crate) enum KeyArg {
    /// `key = "order:<user_id>"`
    Template(LitStr),
    /// `key = <expression>`
    Expr(Expr),
}

impl Args {
    /// The options of a stacked `#[rate_limit(...)]` found on the item.
    pub(crate) fn from_attribute(attr: &Attribute) -> syn::Result<Self> {
        let mut args = match &attr.meta {
            Meta::Path(_) => Args::default(),
            Meta::List(_) => attr.parse_args::<Args>()?,
            Meta::NameValue(meta) => {
                return Err(syn::Error::new_spanned(
                    meta.eq_token,
                    "expected options in parentheses; write \
                     `#[rate_limit(key = \"...\", capacity = N, rate = ...)]`",
                ))
            }
        };
        args.attr = Some(attr.clone());
        Ok(args)
    }

    /// An error underlining the whole attribute.
    pub(crate) fn error_at_attribute(&self, message: &str) -> syn::Error {
        match &self.attr {
            Some(attr) => syn::Error::new_spanned(attr, message),
            None => syn::Error::new(Span::call_site(), message),
        }
    }
}

impl Parse for Args {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            if !input.peek(Ident::peek_any) {
                return Err(input.error("expected an option, such as `key = \"name:<param>\"`"));
            }
            let name = input.call(Ident::parse_any)?;
            let written = name.unraw().to_string();
            let Some((_, read)) = OPTIONS.iter().find(|(option, _)| *option == written) else {
                return Err(unknown_option(&name));
            };
            read(&mut args, input, name.span())?;
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
}

/// `= "template"` or `= <expression>`.
fn key_value(input: ParseStream) -> syn::Result<KeyArg> {
    Ok(match parse_value(input)? {
        Expr::Lit(ExprLit {
            lit: Lit::Str(template),
            ..
        }) => KeyArg::Template(template),
        expr => KeyArg::Expr(expr),
    })
}

/// `= name`: one identifier, checked by `valid`.
fn ident_value(input: ParseStream) -> syn::Result<Ident> {
    input.parse::<Token![=]>()?;
    input.call(Ident::parse_any)
}

/// `= deny` or `= wait(max = "2s")`.
fn on_limit_value(input: ParseStream) -> syn::Result<OnLimitArg> {
    input.parse::<Token![=]>()?;
    let behaviour = input.call(Ident::parse_any)?;
    let (mut max, mut parens) = (None, None);
    if input.peek(syn::token::Paren) {
        let content;
        let group = syn::parenthesized!(content in input);
        parens = Some(group.span.join());
        if !content.is_empty() {
            let name = content.call(Ident::parse_any)?;
            if name != "max" {
                return Err(syn::Error::new(
                    name.span(),
                    "expected `max`, as in `on_limit = wait(max = \"2s\")`",
                ));
            }
            content.parse::<Token![=]>()?;
            max = Some(content.parse::<LitStr>()?);
        }
    }
    Ok(OnLimitArg {
        behaviour,
        max,
        parens,
    })
}

/// `= <expression>`. A literal passed through `macro_rules!` (`rate = $rate`)
/// arrives wrapped in an invisible group, which is removed so it is still
/// checked as a literal.
fn parse_value(input: ParseStream) -> syn::Result<Expr> {
    input.parse::<Token![=]>()?;
    let mut expr = input.parse()?;
    while let Expr::Group(group) = expr {
        expr = *group.expr;
    }
    Ok(expr)
}

fn set_once<T>(slot: &mut Option<T>, value: T, name: Span, option: &str) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            name,
            format!("duplicate option `{option}`; give each option once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn unknown_option(name: &Ident) -> syn::Error {
    let written = name.unraw().to_string();
    let expected = OPTIONS
        .iter()
        .map(|(option, _)| format!("`{option}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut message = format!("unknown option `{written}`; expected one of {expected}");
    if let Some(closest) = closest(&written, OPTIONS.iter().map(|(option, _)| *option)) {
        message.push_str(&format!("; did you mean `{closest}`?"));
    }
    syn::Error::new(name.span(), message)
}

/// The candidate most like `written`, if one is alike enough to suggest.
pub(crate) fn closest<'a>(
    written: &str,
    candidates: impl Iterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .map(|candidate| (strsim::jaro_winkler(written, candidate), candidate))
        .filter(|(similarity, _)| *similarity >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(tokens: &str) -> syn::Result<Args> {
        syn::parse_str::<Args>(tokens)
    }

    #[test]
    fn every_option_parses() {
        let args = parse(
            r#"key = "a:<b>", capacity = 10, rate = "1/s", cost = n.len(), limiter = &L, crate = rl,"#,
        )
        .unwrap();
        assert!(matches!(args.key, Some(KeyArg::Template(ref lit)) if lit.value() == "a:<b>"));
        assert!(args.capacity.is_some() && args.rate.is_some() && args.cost.is_some());
        assert!(args.limiter.is_some() && args.krate.is_some());
        let args = parse(r#"key = "k", rule = "r", quota = tier(&u), exempt = u.admin"#).unwrap();
        assert!(args.rule.is_some() && args.quota.is_some() && args.exempt.is_some());
    }

    #[test]
    fn every_documented_option_is_read_into_its_field() {
        // Each option of the table, given a value of its kind, lands in Args.
        let all = r#"key = "k", rule = "r", capacity = 1, rate = 1, algorithm = gcra, limit = 1,
            window = "1s", quota = q, cost = 1, exempt = e, on_error = open,
            on_limit = wait(max = "1s"), refund_on = err, mode = shadow, lease = 2, limiter = &L,
            crate = rl"#;
        let args = parse(all).unwrap();
        assert_eq!(OPTIONS.len(), 17);
        assert!(args.key.is_some() && args.rule.is_some() && args.capacity.is_some());
        assert!(args.rate.is_some() && args.algorithm.is_some() && args.limit.is_some());
        assert!(args.window.is_some() && args.quota.is_some() && args.cost.is_some());
        assert!(args.exempt.is_some() && args.on_error.is_some() && args.on_limit.is_some());
        assert!(args.refund_on.is_some());
        assert!(args.mode.is_some() && args.lease.is_some() && args.limiter.is_some());
        assert!(args.krate.is_some());
    }

    #[test]
    fn a_non_literal_key_is_an_expression() {
        let args = parse("key = format!(\"{}\", a)").unwrap();
        assert!(matches!(args.key, Some(KeyArg::Expr(_))));
    }

    #[test]
    fn option_errors_say_what_is_wrong() {
        let message = |tokens| parse(tokens).err().expect(tokens).to_string();
        assert_eq!(
            message("= 1"),
            "expected an option, such as `key = \"name:<param>\"`"
        );
        assert_eq!(
            message(r#"on_limit = wait(mux = "1s")"#),
            "expected `max`, as in `on_limit = wait(max = \"2s\")`"
        );
        assert_eq!(
            message("capacity = 1, capacity = 2"),
            "duplicate option `capacity`; give each option once"
        );
        assert_eq!(
            message("capacty = 1"),
            "unknown option `capacty`; expected one of `key`, `rule`, `capacity`, `rate`, \
             `algorithm`, `limit`, `window`, `quota`, `cost`, `exempt`, `on_error`, `on_limit`, \
             `refund_on`, `mode`, `lease`, `limiter`, `crate`; did you mean `capacity`?"
        );
        assert_eq!(
            message("burst = 1"),
            "unknown option `burst`; expected one of `key`, `rule`, `capacity`, `rate`, \
             `algorithm`, `limit`, `window`, `quota`, `cost`, `exempt`, `on_error`, `on_limit`, \
             `refund_on`, `mode`, `lease`, `limiter`, `crate`"
        );
    }
}
