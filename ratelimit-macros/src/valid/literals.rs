//! The values of single options: rule names, positive integers, choices,
//! waits, windows and rates, each with an error pointing at its token.

use quote::ToTokens;
use syn::ext::IdentExt as _;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitInt, LitStr, UnOp};

use ratelimit_core::{Quota, QuotaError, Rate};

use crate::attr::closest;

use super::quota::{parse_rate, RateError};

pub(super) const TOO_LARGE: &str =
    "quota too large to compute exactly: capacity times the rate's period \
                         must stay under 2^52 microseconds; lower the capacity or state the rate \
                         over a shorter period";

/// `rule = "order_submit"`: a string literal, a name the runtime accepts
/// (mirrors `ratelimit_core`'s rule names, so any rule can be published).
pub(super) fn rule_name(expr: &Expr) -> syn::Result<LitStr> {
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
pub(super) fn positive_integer(expr: &Expr, option: &str) -> syn::Result<u64> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => {
            // A capacity or limit too large is a quota too large; other
            // options are counts of their own.
            let value = match option {
                "capacity" | "limit" => parse_u64(lit)?,
                _ => lit.base10_parse::<u64>().map_err(|_| {
                    syn::Error::new(
                        lit.span(),
                        format!(
                            "`{option} = {}` is too large: `{option}` must fit in a u64, at most \
                             {}",
                            lit.base10_digits(),
                            u64::MAX
                        ),
                    )
                })?,
            };
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
pub(super) fn one_of(
    ident: &Ident,
    option: &str,
    choices: &[&'static str],
) -> syn::Result<&'static str> {
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
pub(super) fn failure_policy(ident: &Ident) -> syn::Result<&'static str> {
    Ok(
        match one_of(ident, "on_error", &["open", "closed", "local"])? {
            "open" => "Open",
            "closed" => "Closed",
            _ => "Local",
        },
    )
}

/// `refund_on = err | ok`: the `RefundOn` variant.
pub(super) fn refund_on(ident: &Ident) -> syn::Result<&'static str> {
    Ok(match one_of(ident, "refund_on", &["err", "ok"])? {
        "err" => "Err",
        _ => "Ok",
    })
}

/// `mode = enforce | shadow`: whether in shadow mode.
pub(super) fn shadow_mode(ident: &Ident) -> syn::Result<bool> {
    Ok(one_of(ident, "mode", &["enforce", "shadow"])? == "shadow")
}

/// `on_limit = deny | wait(max = "2s")`: the longest wait, in microseconds.
pub(super) fn wait_limit(arg: &crate::attr::OnLimitArg) -> syn::Result<Option<u64>> {
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
            let micros = ratelimit_core::__span_micros(&value).filter(|_| counted);
            if micros == Some(0) {
                return Err(syn::Error::new(
                    max.span(),
                    format!(
                        "`max = {value:?}` would never wait; give the longest wait, above zero, \
                         such as \"2s\", or drop `on_limit` to deny at once"
                    ),
                ));
            }
            micros
                .filter(|&us| us > 0 && us <= u128::from(u64::MAX))
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
pub(super) fn window_value(expr: &Expr) -> syn::Result<u64> {
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

pub(super) fn parse_u64(lit: &LitInt) -> syn::Result<u64> {
    lit.base10_parse::<u64>()
        .map_err(|_| syn::Error::new(lit.span(), TOO_LARGE))
}

/// `rate = 2`, `rate = 2.5` (tokens per second) or `rate = "100/min"`.
pub(super) fn rate_value(expr: &Expr) -> syn::Result<Rate> {
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
