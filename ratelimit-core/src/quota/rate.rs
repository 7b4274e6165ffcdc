//! Rates as exact fractions, and the strings rates, windows and waits are
//! written in.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::QuotaError;

/// The largest bucket depth, in the algorithm's internal unit, for which every
/// computation stays exact in the double-precision numbers of Redis Lua
/// (integers are exact up to 2^53; one bit is kept as headroom for sums).
pub(crate) const MAX_EXACT: u64 = 1 << 52;

const MICROS_PER_SECOND: u64 = 1_000_000;

/// A refill rate: `tokens` every `period`, kept as an exact fraction.
///
/// Rates are stored reduced, in integer microseconds, so that "3/s" refills
/// exactly three tokens per second forever, with no floating-point drift.
///
/// ```
/// use ratelimit_core::Rate;
///
/// let rate: Rate = "100/min".parse()?;
/// assert_eq!(rate, Rate::per_minute(100)?);
/// assert_eq!(rate.interval(), std::time::Duration::from_millis(600));
/// assert_eq!("2.5/s".parse::<Rate>()?, Rate::new(5, std::time::Duration::from_secs(2))?);
/// # Ok::<(), ratelimit_core::QuotaError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub(super) tokens: u64,
    pub(super) period_us: u64,
}

impl Rate {
    /// `tokens` every `per`. Both must be non-zero, and `per` a whole number of
    /// microseconds' worth of precision is kept (sub-microsecond parts are dropped).
    pub fn new(tokens: u64, per: Duration) -> Result<Self, QuotaError> {
        let period_us = u64::try_from(per.as_micros()).map_err(|_| QuotaError::TooLarge)?;
        Self::from_parts(u128::from(tokens), u128::from(period_us))
    }

    /// `tokens` every second.
    pub fn per_second(tokens: u64) -> Result<Self, QuotaError> {
        Self::new(tokens, Duration::from_secs(1))
    }

    /// `tokens` every minute.
    pub fn per_minute(tokens: u64) -> Result<Self, QuotaError> {
        Self::new(tokens, Duration::from_secs(60))
    }

    /// `tokens` every hour.
    pub fn per_hour(tokens: u64) -> Result<Self, QuotaError> {
        Self::new(tokens, Duration::from_secs(3600))
    }

    /// `tokens` every day (86,400 seconds).
    pub fn per_day(tokens: u64) -> Result<Self, QuotaError> {
        Self::new(tokens, Duration::from_secs(86_400))
    }

    /// Builds the reduced fraction, rejecting zero and what does not fit.
    pub(super) fn from_parts(tokens: u128, period_us: u128) -> Result<Self, QuotaError> {
        if tokens == 0 || period_us == 0 {
            return Err(QuotaError::ZeroRate);
        }
        let g = gcd(tokens, period_us);
        let (tokens, period_us) = (tokens / g, period_us / g);
        match (u64::try_from(tokens), u64::try_from(period_us)) {
            (Ok(tokens), Ok(period_us)) if tokens <= MAX_EXACT && period_us <= MAX_EXACT => {
                Ok(Self { tokens, period_us })
            }
            _ => Err(QuotaError::TooLarge),
        }
    }

    /// The numerator of the reduced rate: tokens added every [`Rate::period`].
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The denominator of the reduced rate.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    pub(crate) fn period_us(&self) -> u64 {
        self.period_us
    }

    /// The average time between two tokens (rounded down to the microsecond).
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.period_us / self.tokens)
    }

    /// Tokens per second, for display and metrics (not used by decisions).
    pub fn per_second_f64(&self) -> f64 {
        self.tokens as f64 * MICROS_PER_SECOND as f64 / self.period_us as f64
    }

    /// The shortest whole number of seconds in which the rate adds a whole
    /// number of tokens: 1 for `5/s`, 6 for one token every 1.2 s, 60 for
    /// `7/min`. What a policy advertised per window of seconds (the HTTP
    /// `RateLimit-Policy` field) can say exactly.
    ///
    /// ```
    /// use ratelimit_core::Rate;
    ///
    /// assert_eq!("5/s".parse::<Rate>()?.whole_seconds(), 1);
    /// assert_eq!("1/1200ms".parse::<Rate>()?.whole_seconds(), 6);
    /// assert_eq!("7/min".parse::<Rate>()?.whole_seconds(), 60);
    /// # Ok::<(), ratelimit_core::QuotaError>(())
    /// ```
    pub fn whole_seconds(&self) -> u64 {
        let per_second = u128::from(self.tokens) * u128::from(MICROS_PER_SECOND);
        let period_us = u128::from(self.period_us);
        // `per_second * s / period_us` is whole when `s` is a multiple of this.
        let step = period_us / gcd(per_second, period_us);
        u64::try_from(step).unwrap_or(u64::MAX)
    }
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// In the form `"5/s"`, `"7/min"`, `"1000/d"`: a whole number per second,
/// minute, hour or day when there is one (the first of those), else tokens
/// per a whole number of units (`"3/7s"`), else per microseconds. What it
/// writes parses back to the same rate.
///
/// ```
/// use ratelimit_core::Rate;
///
/// for (written, shown) in [("5/s", "5/s"), ("300/min", "5/s"), ("7/min", "7/min"),
///                          ("2.5/s", "150/min"), ("1000/d", "1000/d"), ("3/7s", "3/7s")] {
///     let rate: Rate = written.parse()?;
///     assert_eq!(rate.to_string(), shown);
///     assert_eq!(shown.parse::<Rate>()?, rate);
/// }
/// # Ok::<(), ratelimit_core::QuotaError>(())
/// ```
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (unit, name) in [
            (MICROS_PER_SECOND, "s"),
            (60 * MICROS_PER_SECOND, "min"),
            (3_600 * MICROS_PER_SECOND, "h"),
            (86_400 * MICROS_PER_SECOND, "d"),
        ] {
            let per_unit = u128::from(self.tokens) * u128::from(unit);
            if per_unit % u128::from(self.period_us) == 0 {
                return write!(f, "{}/{name}", per_unit / u128::from(self.period_us));
            }
        }
        const UNITS: [(u64, &str); 4] = [
            (86_400 * MICROS_PER_SECOND, "d"),
            (3_600 * MICROS_PER_SECOND, "h"),
            (60 * MICROS_PER_SECOND, "min"),
            (MICROS_PER_SECOND, "s"),
        ];
        for (unit, name) in UNITS {
            if self.period_us == unit {
                return write!(f, "{}/{name}", self.tokens);
            }
            if self.period_us.is_multiple_of(unit) {
                return write!(f, "{}/{}{name}", self.tokens, self.period_us / unit);
            }
        }
        write!(f, "{}/{}us", self.tokens, self.period_us)
    }
}

/// Parses `"5/s"`, `"100/min"`, `"3600/h"`, `"1000/d"`, `"2.5/s"`, `"10/30s"` and
/// `"1/500ms"` (units `us`, `ms`, `s`, `m`, `h`, `d` and their longer names), and a bare number of tokens per
/// second (`"2"`, `"2.5"`), as the attribute's `rate = 2.5` and the rules'
/// `rate=2.5` write it.
///
/// ```
/// use ratelimit_core::Rate;
///
/// assert_eq!("2.5".parse::<Rate>()?, "5/2s".parse::<Rate>()?);
/// # Ok::<(), ratelimit_core::QuotaError>(())
/// ```
impl FromStr for Rate {
    type Err = QuotaError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || QuotaError::InvalidRate(text.to_owned());
        let (amount, per) = text.split_once('/').unwrap_or((text, "s"));
        let (mantissa, scale) = parse_decimal(amount.trim()).ok_or_else(invalid)?;
        let (multiple, unit_us) = parse_span(per).ok_or_else(invalid)?;
        let period = multiple
            .checked_mul(u128::from(unit_us))
            .and_then(|p| p.checked_mul(scale))
            .ok_or(QuotaError::TooLarge)?;
        if mantissa == 0 || multiple == 0 {
            return Err(QuotaError::ZeroRate);
        }
        Self::from_parts(mantissa, period)
    }
}

/// A span of time as rates, windows and waits write it: a whole count (1
/// when left out) of a unit, `"500ms"`, `"10s"`, `"m"`. Units: `us`, `ms`,
/// `s` (`sec`, `second`), `m` (`min`, `minute`), `h` (`hour`), `d` (`day`),
/// plurals accepted. Gives the count and the unit's microseconds; `None`
/// when the text is not of that form.
pub(crate) fn parse_span(text: &str) -> Option<(u128, u64)> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let count = match &text[..digits_end] {
        "" => 1,
        digits => digits.parse().ok()?,
    };
    Some((count, unit_micros(text[digits_end..].trim())?))
}

/// A span of time for the `#[rate_limit]` attribute's options (`"2s"`),
/// in microseconds: `Some` of a count and unit [`Rate`]'s strings accept,
/// `None` when the text is not one, or the span overflows.
#[doc(hidden)]
pub fn __span_micros(text: &str) -> Option<u128> {
    let (count, unit) = parse_span(text)?;
    count.checked_mul(u128::from(unit))
}

/// `"2.50"` -> (250, 100): the value is `mantissa / scale`.
fn parse_decimal(text: &str) -> Option<(u128, u128)> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || !all_digits(frac) || frac.len() > 18 {
        return None;
    }
    let digits = format!("{int}{frac}");
    let mantissa = digits.parse::<u128>().ok()?;
    Some((mantissa, 10u128.pow(frac.len() as u32)))
}

fn unit_micros(unit: &str) -> Option<u64> {
    Some(match unit {
        "us" | "µs" | "micro" | "micros" => 1,
        "ms" | "milli" | "millis" => 1_000,
        "s" | "sec" | "secs" | "second" | "seconds" => MICROS_PER_SECOND,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * MICROS_PER_SECOND,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * MICROS_PER_SECOND,
        "d" | "day" | "days" => 86_400 * MICROS_PER_SECOND,
        _ => return None,
    })
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
