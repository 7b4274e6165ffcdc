//! The attribute's quota options: the algorithm, `capacity` and `rate` or
//! `limit` and `window`, or `quota = <expression>`, checked as the runtime
//! checks them.

use quote::ToTokens;
use syn::ext::IdentExt as _;
use syn::{Expr, Ident};

use ratelimit_core::{Quota, QuotaError, Rate};

use crate::attr::{closest, Args};

use super::literals::{positive_integer, rate_value, window_value, TOO_LARGE};
use super::{Fixed, QuotaArg};

/// `algorithm = ...`: the runtime's algorithm, which the generated code
/// names by its variant (`Algorithm::TokenBucket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Algorithm(ratelimit_core::Algorithm);

pub(super) fn algorithms() -> impl Iterator<Item = &'static str> {
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
pub(super) fn parse_rate(text: &str) -> Result<Rate, RateError> {
    text.parse::<Rate>().map_err(RateError::from)
}

/// The rate's period in microseconds (at most 2^52, so the cast is exact).
pub(crate) fn period_us(rate: &Rate) -> u64 {
    rate.period().as_micros() as u64
}

/// The attribute's own quota: `capacity` and `rate`, or `limit` and
/// `window`, for its algorithm.
pub(super) fn fixed_quota(args: &Args) -> syn::Result<Fixed> {
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
        // size can be refused (a sliding log's limit, or the product).
        let quota = Quota::builder(algorithm.runtime())
            .limit(limit_value)
            .window(std::time::Duration::from_micros(window_us))
            .build()
            .map_err(|error| match error {
                QuotaError::LogTooLong { .. } => syn::Error::new_spanned(limit, error),
                _ => syn::Error::new_spanned(limit, TOO_LARGE),
            })?;
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
pub(super) fn per_call_quota(args: &Args, expr: &Expr) -> syn::Result<QuotaArg> {
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
