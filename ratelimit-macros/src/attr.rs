//! The attribute's options as written: `key = ..., capacity = ..., rate = ...`.
//!
//! Parsing only checks the syntax (which options, each once); values are kept
//! as the user's tokens so that `valid` can point an error at exactly the
//! offending literal.

use proc_macro2::Span;
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Expr, ExprLit, Ident, Lit, LitStr, Meta, Path, Token};

mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(capacity);
    syn::custom_keyword!(rate);
    syn::custom_keyword!(cost);
    syn::custom_keyword!(limiter);
    syn::custom_keyword!(algorithm);
    syn::custom_keyword!(limit);
    syn::custom_keyword!(window);
    syn::custom_keyword!(on_error);
    syn::custom_keyword!(on_limit);
    syn::custom_keyword!(mode);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(max);
    syn::custom_keyword!(rule);
    syn::custom_keyword!(quota);
    syn::custom_keyword!(exempt);
}

/// Every option, in the order the documentation lists them.
pub(crate) const OPTIONS: [&str; 16] = [
    "key",
    "rule",
    "capacity",
    "rate",
    "algorithm",
    "limit",
    "window",
    "quota",
    "cost",
    "exempt",
    "on_error",
    "on_limit",
    "mode",
    "lease",
    "limiter",
    "crate",
];

/// One `#[rate_limit(...)]`.
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
            Meta::Path(_) => Args::empty(),
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

    fn empty() -> Self {
        Args {
            attr: None,
            key: None,
            rule: None,
            capacity: None,
            rate: None,
            algorithm: None,
            limit: None,
            window: None,
            quota: None,
            cost: None,
            exempt: None,
            on_error: None,
            on_limit: None,
            mode: None,
            lease: None,
            limiter: None,
            krate: None,
        }
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
        let mut args = Args::empty();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::key) {
                let name = input.parse::<kw::key>()?;
                let value = match parse_value(input)? {
                    Expr::Lit(ExprLit {
                        lit: Lit::Str(template),
                        ..
                    }) => KeyArg::Template(template),
                    expr => KeyArg::Expr(expr),
                };
                set_once(&mut args.key, value, name.span, "key")?;
            } else if lookahead.peek(kw::rule) {
                let name = input.parse::<kw::rule>()?;
                set_once(&mut args.rule, parse_value(input)?, name.span, "rule")?;
            } else if lookahead.peek(kw::quota) {
                let name = input.parse::<kw::quota>()?;
                set_once(&mut args.quota, parse_value(input)?, name.span, "quota")?;
            } else if lookahead.peek(kw::exempt) {
                let name = input.parse::<kw::exempt>()?;
                set_once(&mut args.exempt, parse_value(input)?, name.span, "exempt")?;
            } else if lookahead.peek(kw::capacity) {
                let name = input.parse::<kw::capacity>()?;
                set_once(
                    &mut args.capacity,
                    parse_value(input)?,
                    name.span,
                    "capacity",
                )?;
            } else if lookahead.peek(kw::rate) {
                let name = input.parse::<kw::rate>()?;
                set_once(&mut args.rate, parse_value(input)?, name.span, "rate")?;
            } else if lookahead.peek(kw::algorithm) {
                let name = input.parse::<kw::algorithm>()?;
                input.parse::<Token![=]>()?;
                let value = input.call(Ident::parse_any)?;
                set_once(&mut args.algorithm, value, name.span, "algorithm")?;
            } else if lookahead.peek(kw::limit) {
                let name = input.parse::<kw::limit>()?;
                set_once(&mut args.limit, parse_value(input)?, name.span, "limit")?;
            } else if lookahead.peek(kw::window) {
                let name = input.parse::<kw::window>()?;
                set_once(&mut args.window, parse_value(input)?, name.span, "window")?;
            } else if lookahead.peek(kw::on_error) {
                let name = input.parse::<kw::on_error>()?;
                input.parse::<Token![=]>()?;
                let value = input.call(Ident::parse_any)?;
                set_once(&mut args.on_error, value, name.span, "on_error")?;
            } else if lookahead.peek(kw::lease) {
                let name = input.parse::<kw::lease>()?;
                set_once(&mut args.lease, parse_value(input)?, name.span, "lease")?;
            } else if lookahead.peek(kw::mode) {
                let name = input.parse::<kw::mode>()?;
                input.parse::<Token![=]>()?;
                let value = input.call(Ident::parse_any)?;
                set_once(&mut args.mode, value, name.span, "mode")?;
            } else if lookahead.peek(kw::on_limit) {
                let name = input.parse::<kw::on_limit>()?;
                input.parse::<Token![=]>()?;
                let behaviour = input.call(Ident::parse_any)?;
                let (mut max, mut parens) = (None, None);
                if input.peek(syn::token::Paren) {
                    let content;
                    let group = syn::parenthesized!(content in input);
                    parens = Some(group.span.join());
                    if !content.is_empty() {
                        content.parse::<kw::max>()?;
                        content.parse::<Token![=]>()?;
                        max = Some(content.parse::<LitStr>()?);
                    }
                }
                let value = OnLimitArg {
                    behaviour,
                    max,
                    parens,
                };
                set_once(&mut args.on_limit, value, name.span, "on_limit")?;
            } else if lookahead.peek(kw::cost) {
                let name = input.parse::<kw::cost>()?;
                set_once(&mut args.cost, parse_value(input)?, name.span, "cost")?;
            } else if lookahead.peek(kw::limiter) {
                let name = input.parse::<kw::limiter>()?;
                set_once(&mut args.limiter, parse_value(input)?, name.span, "limiter")?;
            } else if lookahead.peek(Token![crate]) {
                let name = input.parse::<Token![crate]>()?;
                input.parse::<Token![=]>()?;
                let path = input.call(Path::parse_mod_style)?;
                set_once(&mut args.krate, path, name.span, "crate")?;
            } else if input.peek(Ident::peek_any) {
                return Err(unknown_option(&input.call(Ident::parse_any)?));
            } else {
                return Err(lookahead.error());
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(args)
    }
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
        .map(|option| format!("`{option}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut message = format!("unknown option `{written}`; expected one of {expected}");
    if let Some(closest) = closest(&written, OPTIONS.iter().copied()) {
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
    fn a_non_literal_key_is_an_expression() {
        let args = parse("key = format!(\"{}\", a)").unwrap();
        assert!(matches!(args.key, Some(KeyArg::Expr(_))));
    }

    #[test]
    fn option_errors_say_what_is_wrong() {
        let message = |tokens| parse(tokens).err().expect(tokens).to_string();
        assert_eq!(
            message("capacity = 1, capacity = 2"),
            "duplicate option `capacity`; give each option once"
        );
        assert_eq!(
            message("capacty = 1"),
            "unknown option `capacty`; expected one of `key`, `rule`, `capacity`, `rate`, \
             `algorithm`, `limit`, `window`, `quota`, `cost`, `exempt`, `on_error`, `on_limit`, \
             `mode`, `lease`, `limiter`, `crate`; did you mean `capacity`?"
        );
        assert_eq!(
            message("burst = 1"),
            "unknown option `burst`; expected one of `key`, `rule`, `capacity`, `rate`, \
             `algorithm`, `limit`, `window`, `quota`, `cost`, `exempt`, `on_error`, `on_limit`, \
             `mode`, `lease`, `limiter`, `crate`"
        );
    }
}
