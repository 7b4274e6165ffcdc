//! Quotas: how many tokens a bucket holds and how fast it refills.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

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
    tokens: u64,
    period_us: u64,
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
    fn from_parts(tokens: u128, period_us: u128) -> Result<Self, QuotaError> {
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
}

impl fmt::Debug for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
            if self.period_us % unit == 0 {
                return write!(f, "{}/{}{name}", self.tokens, self.period_us / unit);
            }
        }
        write!(f, "{}/{}us", self.tokens, self.period_us)
    }
}

/// Parses `"5/s"`, `"100/min"`, `"3600/h"`, `"1000/d"`, `"2.5/s"`, `"10/30s"` and
/// `"1/500ms"`. Units: `us`, `ms`, `s` (`sec`, `second`), `m` (`min`, `minute`),
/// `h` (`hour`), `d` (`day`), plurals accepted.
impl FromStr for Rate {
    type Err = QuotaError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || QuotaError::InvalidRate(text.to_owned());
        let (amount, per) = text.split_once('/').ok_or_else(invalid)?;
        let (mantissa, scale) = parse_decimal(amount.trim()).ok_or_else(invalid)?;
        let per = per.trim();
        let digits_end = per.find(|c: char| !c.is_ascii_digit()).unwrap_or(per.len());
        let multiple: u128 = if digits_end == 0 {
            1
        } else {
            per[..digits_end].parse().map_err(|_| invalid())?
        };
        let unit_us = unit_micros(per[digits_end..].trim()).ok_or_else(invalid)?;
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

/// A token-bucket quota: at most `capacity` tokens at once (the burst),
/// refilled at `rate`.
///
/// A `Quota` can only be built valid: the constructors reject a zero capacity,
/// a zero rate, and quotas too large to compute exactly.
///
/// ```
/// use ratelimit_core::{Quota, Rate};
///
/// let quota = Quota::new(10, Rate::per_second(2)?)?;
/// assert_eq!(quota.capacity(), 10);
/// // An empty bucket is full again after capacity / rate = 5 s.
/// assert_eq!(quota.replenish_all(), std::time::Duration::from_secs(5));
/// assert!(Quota::new(0, Rate::per_second(2)?).is_err());
/// # Ok::<(), ratelimit_core::QuotaError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    capacity: u64,
    rate: Rate,
}

impl Quota {
    /// A bucket of `capacity` tokens refilled at `rate`.
    pub fn new(capacity: u64, rate: Rate) -> Result<Self, QuotaError> {
        if capacity == 0 {
            return Err(QuotaError::ZeroCapacity);
        }
        match capacity.checked_mul(rate.period_us) {
            Some(depth) if depth <= MAX_EXACT => Ok(Self { capacity, rate }),
            _ => Err(QuotaError::TooLarge),
        }
    }

    /// `n` per second, with a burst of `n`.
    pub fn per_second(n: u64) -> Result<Self, QuotaError> {
        Self::new(n, Rate::per_second(n)?)
    }

    /// `n` per minute, with a burst of `n`.
    pub fn per_minute(n: u64) -> Result<Self, QuotaError> {
        Self::new(n, Rate::per_minute(n)?)
    }

    /// `n` per hour, with a burst of `n`.
    pub fn per_hour(n: u64) -> Result<Self, QuotaError> {
        Self::new(n, Rate::per_hour(n)?)
    }

    /// Builds a quota from parts that the `#[rate_limit]` attribute already
    /// checked at compile time.
    ///
    /// The attribute calls it in a `static`, so an invalid quota that slipped
    /// through would fail the build, never a request.
    #[doc(hidden)]
    pub const fn __checked(capacity: u64, tokens: u64, period_us: u64) -> Self {
        assert!(capacity > 0 && tokens > 0 && period_us > 0);
        assert!(tokens <= MAX_EXACT && period_us <= MAX_EXACT);
        assert!(capacity <= MAX_EXACT / period_us);
        Self {
            capacity,
            rate: Rate { tokens, period_us },
        }
    }

    /// The bucket size: the most tokens one key can spend at once.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// How long an empty bucket takes to be full again.
    pub fn replenish_all(&self) -> Duration {
        let depth = self.depth();
        Duration::from_micros(depth.div_ceil(self.rate.tokens))
    }

    /// The bucket depth in the algorithm's unit (1/tokens of a microsecond).
    pub(crate) fn depth(&self) -> u64 {
        self.capacity * self.rate.period_us
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Quota {{ capacity: {}, rate: {} }}",
            self.capacity, self.rate
        )
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {}", self.capacity, self.rate)
    }
}

/// Why a [`Quota`] or [`Rate`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The capacity was zero: no request could ever be admitted.
    #[error("capacity must be greater than 0")]
    ZeroCapacity,
    /// The rate was zero: the bucket would never refill.
    #[error("rate must be greater than 0")]
    ZeroRate,
    /// A rate string that does not parse.
    #[error("invalid rate `{0}`; expected a form such as \"5/s\", \"100/min\", \"3600/h\" or \"1000/d\"")]
    InvalidRate(String),
    /// The quota cannot be computed exactly in integer microseconds.
    #[error(
        "quota too large to compute exactly: capacity times the rate's period must stay under \
         2^52 microseconds; lower the capacity or state the rate over a shorter period"
    )]
    TooLarge,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_strings_reduce_to_exact_fractions() {
        let cases = [
            ("5/s", 1, 200_000),
            ("100/min", 1, 600_000),
            ("3600/h", 1, 1_000_000),
            ("1000000/day", 1, 86_400),
            ("7/m", 7, 60_000_000),
            ("2.5/s", 1, 400_000),
            ("10/30s", 1, 3_000_000),
            (" 1 / 500ms ", 1, 500_000),
        ];
        for (text, tokens, period_us) in cases {
            let rate: Rate = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((rate.tokens, rate.period_us), (tokens, period_us), "{text}");
        }
    }

    #[test]
    fn malformed_rate_strings_are_rejected_with_the_text() {
        for text in [
            "",
            "5",
            "5/",
            "/s",
            "5/fortnight",
            "-5/s",
            "5/0s",
            "a/s",
            "1.2.3/s",
        ] {
            let err = text.parse::<Rate>().expect_err(text);
            assert!(
                matches!(err, QuotaError::InvalidRate(_) | QuotaError::ZeroRate),
                "{text}: {err:?}"
            );
        }
        assert_eq!("0/s".parse::<Rate>(), Err(QuotaError::ZeroRate));
    }

    #[test]
    fn quotas_that_cannot_be_exact_are_rejected() {
        assert_eq!(
            Quota::new(0, Rate::per_second(1).unwrap()),
            Err(QuotaError::ZeroCapacity)
        );
        assert_eq!(
            Quota::new(1_000_000_000, Rate::per_hour(1).unwrap()),
            Err(QuotaError::TooLarge)
        );
        assert!(Quota::new(1_000_000, Rate::per_day(1_000_000).unwrap()).is_ok());
    }

    #[test]
    fn display_round_trips_through_from_str() {
        for text in ["5/s", "1/600ms", "7/min", "1/86400us", "3/2h"] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate.to_string().parse::<Rate>().unwrap(), rate, "{text}");
        }
    }
}
