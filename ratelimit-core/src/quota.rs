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
/// `"1/500ms"` (the units of [`parse_span`]), and a bare number of tokens per
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

/// The algorithm a [`Quota`] decides with. Each one is a Lua script for Redis
/// and a Rust twin for the memory backend, and the two decide alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Bursts up to `capacity`, refills at `rate`. State: one number, the
    /// instant the bucket is full again (GCRA's theoretical arrival time),
    /// which admits exactly what a level and a last-refill time would. The
    /// default.
    TokenBucket,
    /// The token bucket under the name some users know it by: the same
    /// admissions and the same one number of state.
    Gcra,
    /// At most `limit` per `window`, windows aligned to the epoch. Allows up to
    /// twice the limit across a window boundary, and nothing more.
    FixedWindow,
    /// Exactly `limit` in any window of length `window`. Keeps one sorted-set
    /// member per admitted request, so its memory grows with `limit`.
    SlidingLog,
    /// The previous window's count, weighted by how much of it still overlaps
    /// the sliding window, plus the current window's: constant memory, bounded
    /// error.
    SlidingWindow,
    /// A queue of `capacity` that drains at `rate`: a request is admitted with
    /// a delay (when its turn comes), and denied only when the queue is full.
    LeakyBucket,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::LeakyBucket,
    ];

    /// The name used in the attribute: `token_bucket`, `gcra`, ...
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::Gcra => "gcra",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }

    /// The algorithm's id in the Lua scripts' arguments (`scripts/prelude.lua`
    /// names the same ids). Fixed: Redis keeps no id, but a fleet mixing
    /// versions sends ids to one server.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn wire_id(self) -> u64 {
        match self {
            Algorithm::TokenBucket => 0,
            Algorithm::Gcra => 1,
            Algorithm::FixedWindow => 2,
            Algorithm::SlidingLog => 3,
            Algorithm::SlidingWindow => 4,
            Algorithm::LeakyBucket => 5,
        }
    }

    /// Whether the algorithm takes `limit` and `window` (rather than
    /// `capacity` and `rate`).
    pub const fn is_windowed(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = QuotaError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == text)
            .ok_or_else(|| QuotaError::UnknownAlgorithm(text.to_owned()))
    }
}

/// A quota: which algorithm decides, and its numbers.
///
/// Bucket algorithms (token bucket, GCRA, leaky bucket) take a `capacity` and
/// a [`Rate`]; window algorithms (fixed window, sliding log, sliding window)
/// take a `limit` per `window`. A `Quota` can only be built valid: the
/// constructors reject zeros, wrong combinations, and quotas too large to
/// compute exactly in integer microseconds.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::{Algorithm, Quota, Rate};
///
/// let quota = Quota::new(10, Rate::per_second(2)?)?; // a token bucket
/// assert_eq!(quota.capacity(), 10);
/// // An empty bucket is full again after capacity / rate = 5 s.
/// assert_eq!(quota.replenish_all(), Duration::from_secs(5));
///
/// let daily = Quota::fixed_window(1_000, Quota::parse_window("1d")?)?;
/// assert_eq!(daily.window(), Some(Duration::from_secs(86_400)));
///
/// // The builder checks combinations, as the attribute does at compile time.
/// let wrong = Quota::builder(Algorithm::FixedWindow).capacity(5).build();
/// assert!(wrong.unwrap_err().to_string().contains("`fixed_window` takes `limit` and `window`"));
/// # Ok::<(), ratelimit_core::QuotaError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    algorithm: Algorithm,
    capacity: u64,
    rate: Rate,
    /// Zero for bucket algorithms.
    window_us: u64,
}

impl Quota {
    /// A token bucket of `capacity` tokens refilled at `rate`.
    pub fn new(capacity: u64, rate: Rate) -> Result<Self, QuotaError> {
        Self::bucket(Algorithm::TokenBucket, capacity, rate)
    }

    /// A token bucket of `capacity` tokens refilled at `rate`.
    pub fn token_bucket(capacity: u64, rate: Rate) -> Result<Self, QuotaError> {
        Self::bucket(Algorithm::TokenBucket, capacity, rate)
    }

    /// GCRA: the token bucket's admissions, with one number of state per key.
    pub fn gcra(capacity: u64, rate: Rate) -> Result<Self, QuotaError> {
        Self::bucket(Algorithm::Gcra, capacity, rate)
    }

    /// A queue of `capacity` requests drained at `rate`; admitted requests
    /// carry a [`Decision::delay`](crate::Decision::delay).
    pub fn leaky_bucket(capacity: u64, rate: Rate) -> Result<Self, QuotaError> {
        Self::bucket(Algorithm::LeakyBucket, capacity, rate)
    }

    /// At most `limit` per `window`, windows aligned to the Unix epoch.
    pub fn fixed_window(limit: u64, window: Duration) -> Result<Self, QuotaError> {
        Self::windowed(Algorithm::FixedWindow, limit, window)
    }

    /// Exactly `limit` in any window of length `window` (memory grows with `limit`).
    pub fn sliding_log(limit: u64, window: Duration) -> Result<Self, QuotaError> {
        Self::windowed(Algorithm::SlidingLog, limit, window)
    }

    /// The two-window weighted counter: about `limit` per sliding `window`.
    pub fn sliding_window(limit: u64, window: Duration) -> Result<Self, QuotaError> {
        Self::windowed(Algorithm::SlidingWindow, limit, window)
    }

    /// `n` per second, with a burst of `n` (token bucket).
    pub fn per_second(n: u64) -> Result<Self, QuotaError> {
        Self::new(n, Rate::per_second(n)?)
    }

    /// `n` per minute, with a burst of `n` (token bucket).
    pub fn per_minute(n: u64) -> Result<Self, QuotaError> {
        Self::new(n, Rate::per_minute(n)?)
    }

    /// `n` per hour, with a burst of `n` (token bucket).
    pub fn per_hour(n: u64) -> Result<Self, QuotaError> {
        Self::new(n, Rate::per_hour(n)?)
    }

    /// Starts a quota for `algorithm` from named options, checking that the
    /// options fit the algorithm.
    pub fn builder(algorithm: Algorithm) -> QuotaBuilder {
        QuotaBuilder {
            algorithm,
            capacity: None,
            rate: None,
            limit: None,
            window: None,
        }
    }

    fn bucket(algorithm: Algorithm, capacity: u64, rate: Rate) -> Result<Self, QuotaError> {
        if capacity == 0 {
            return Err(QuotaError::ZeroCapacity);
        }
        match capacity.checked_mul(rate.period_us) {
            Some(depth) if depth <= MAX_EXACT => Ok(Self {
                algorithm,
                capacity,
                rate,
                window_us: 0,
            }),
            _ => Err(QuotaError::TooLarge),
        }
    }

    fn windowed(algorithm: Algorithm, limit: u64, window: Duration) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroCapacity);
        }
        let window_us = u64::try_from(window.as_micros()).map_err(|_| QuotaError::TooLarge)?;
        if window_us == 0 || !window_us.is_multiple_of(1_000) {
            return Err(QuotaError::InvalidWindow(format!("{window:?}")));
        }
        // The sliding window weighs counts by elapsed milliseconds.
        if limit
            .checked_mul(window_us / 1_000)
            .is_none_or(|w| w > MAX_EXACT)
            || window_us > MAX_EXACT
        {
            return Err(QuotaError::TooLarge);
        }
        let rate = Rate::from_parts(u128::from(limit), u128::from(window_us))?;
        Ok(Self {
            algorithm,
            capacity: limit,
            rate,
            window_us,
        })
    }

    /// Parses a window length: `"1s"`, `"1m"`, `"1h"`, `"1d"`, `"10s"`, `"500ms"`
    /// (the units of [`Rate`]'s strings). Windows are whole milliseconds.
    pub fn parse_window(text: &str) -> Result<Duration, QuotaError> {
        let invalid = || QuotaError::InvalidWindow(text.to_owned());
        let (count, unit) = parse_span(text).ok_or_else(invalid)?;
        let micros = count
            .checked_mul(u128::from(unit))
            .and_then(|us| u64::try_from(us).ok())
            .ok_or(QuotaError::TooLarge)?;
        if micros == 0 || !micros.is_multiple_of(1_000) {
            return Err(invalid());
        }
        Ok(Duration::from_micros(micros))
    }

    /// Builds a quota from parts that the `#[rate_limit]` attribute already
    /// checked at compile time.
    ///
    /// The attribute calls it in a `static`, so an invalid quota that slipped
    /// through would fail the build, never a request.
    #[doc(hidden)]
    pub const fn __checked(
        algorithm: Algorithm,
        capacity: u64,
        tokens: u64,
        period_us: u64,
        window_us: u64,
    ) -> Self {
        assert!(capacity > 0 && tokens > 0 && period_us > 0);
        assert!(tokens <= MAX_EXACT && period_us <= MAX_EXACT);
        if algorithm.is_windowed() {
            assert!(window_us > 0 && window_us.is_multiple_of(1_000) && window_us <= MAX_EXACT);
            assert!(capacity <= MAX_EXACT / (window_us / 1_000));
        } else {
            assert!(window_us == 0);
            assert!(capacity <= MAX_EXACT / period_us);
        }
        Self {
            algorithm,
            capacity,
            rate: Rate { tokens, period_us },
            window_us,
        }
    }

    /// The algorithm that decides.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The most tokens one key can spend at once: the bucket size, or the
    /// window's limit.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill rate; for window algorithms, `limit` per `window`.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The window of a window algorithm.
    pub fn window(&self) -> Option<Duration> {
        (self.window_us > 0).then(|| Duration::from_micros(self.window_us))
    }

    pub(crate) fn window_us(&self) -> u64 {
        self.window_us
    }

    /// How long an idle key takes to be able to spend `capacity` again.
    pub fn replenish_all(&self) -> Duration {
        if self.algorithm.is_windowed() {
            return Duration::from_micros(self.window_us);
        }
        Duration::from_micros(self.depth().div_ceil(self.rate.tokens))
    }

    /// The longest `retry_after` this quota gives, on a clock that does not
    /// go back, whatever state a key holds (state left by another quota
    /// included): the time to refill an empty bucket; the window for the
    /// fixed window and the sliding log; twice the window for the sliding
    /// window counter, whose previous window fades over the next one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_core::Quota;
    ///
    /// assert_eq!(Quota::new(10, "2/s".parse()?)?.longest_wait(), Duration::from_secs(5));
    /// let window = Quota::sliding_window(100, Duration::from_secs(60))?;
    /// assert_eq!(window.longest_wait(), Duration::from_secs(120));
    /// # Ok::<(), ratelimit_core::QuotaError>(())
    /// ```
    pub fn longest_wait(&self) -> Duration {
        match self.algorithm {
            Algorithm::SlidingWindow => Duration::from_micros(2 * self.window_us),
            _ => self.replenish_all(),
        }
    }

    /// The same quota cut to `share` (in (0, 1]) for one instance's local
    /// fallback: capacity or limit scaled down (at least 1), the rate scaled
    /// down, the window kept. Falls back to coarser precision for the share
    /// when the exact fraction does not fit, and to the whole quota when none
    /// does.
    pub(crate) fn scaled(&self, share: f64) -> Quota {
        if !(share > 0.0 && share < 1.0) {
            return *self;
        }
        for scale in [1_000_000u64, 1_000, 100] {
            let parts = (share * scale as f64).round().max(1.0) as u64;
            let capacity =
                (u128::from(self.capacity) * u128::from(parts) / u128::from(scale)).max(1) as u64;
            let quota = if self.algorithm.is_windowed() {
                Quota::windowed(
                    self.algorithm,
                    capacity,
                    Duration::from_micros(self.window_us),
                )
            } else {
                Rate::from_parts(
                    u128::from(self.rate.tokens) * u128::from(parts),
                    u128::from(self.rate.period_us) * u128::from(scale),
                )
                .and_then(|rate| Quota::bucket(self.algorithm, capacity, rate))
            };
            if let Ok(quota) = quota {
                return quota;
            }
        }
        *self
    }

    /// The bucket depth in the algorithm's unit (1/tokens of a microsecond).
    pub(crate) fn depth(&self) -> u64 {
        self.capacity * self.rate.period_us
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Quota {{ {self} }}")
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.window() {
            Some(window) => write!(
                f,
                "{} of {} per {:?}",
                self.algorithm, self.capacity, window
            ),
            None => write!(
                f,
                "{} of {} at {}",
                self.algorithm, self.capacity, self.rate
            ),
        }
    }
}

/// Builds a [`Quota`] from named options; see [`Quota::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct QuotaBuilder {
    algorithm: Algorithm,
    capacity: Option<u64>,
    rate: Option<Rate>,
    limit: Option<u64>,
    window: Option<Duration>,
}

impl QuotaBuilder {
    /// The bucket size (bucket algorithms).
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// The refill rate (bucket algorithms).
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// Requests per window (window algorithms).
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The window (window algorithms).
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// Checks the combination and builds the quota.
    pub fn build(self) -> Result<Quota, QuotaError> {
        let algorithm = self.algorithm;
        let wrong = |option: &'static str| QuotaError::WrongOption { algorithm, option };
        if algorithm.is_windowed() {
            if self.capacity.is_some() {
                return Err(wrong("capacity"));
            }
            if self.rate.is_some() {
                return Err(wrong("rate"));
            }
            match (self.limit, self.window) {
                (Some(limit), Some(window)) => Quota::windowed(algorithm, limit, window),
                (None, _) => Err(QuotaError::MissingOption {
                    algorithm,
                    option: "limit",
                }),
                (_, None) => Err(QuotaError::MissingOption {
                    algorithm,
                    option: "window",
                }),
            }
        } else {
            if self.limit.is_some() {
                return Err(wrong("limit"));
            }
            if self.window.is_some() {
                return Err(wrong("window"));
            }
            match (self.capacity, self.rate) {
                (Some(capacity), Some(rate)) => Quota::bucket(algorithm, capacity, rate),
                (None, _) => Err(QuotaError::MissingOption {
                    algorithm,
                    option: "capacity",
                }),
                (_, None) => Err(QuotaError::MissingOption {
                    algorithm,
                    option: "rate",
                }),
            }
        }
    }
}

fn expected_options(algorithm: &Algorithm) -> &'static str {
    if algorithm.is_windowed() {
        "`limit` and `window`"
    } else {
        "`capacity` and `rate`"
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
    /// A window that is not a whole, non-zero number of milliseconds.
    #[error("invalid window `{0}`; expected a whole number of milliseconds such as \"1s\", \"1m\", \"1h\" or \"1d\"")]
    InvalidWindow(String),
    /// An algorithm name that does not exist.
    #[error("unknown algorithm `{0}`; expected one of `token_bucket`, `gcra`, `fixed_window`, `sliding_log`, `sliding_window`, `leaky_bucket`")]
    UnknownAlgorithm(String),
    /// An option the algorithm does not take.
    #[error("`{algorithm}` takes {}, not `{option}`", expected_options(algorithm))]
    WrongOption {
        /// The algorithm.
        algorithm: Algorithm,
        /// The option given.
        option: &'static str,
    },
    /// An option the algorithm needs.
    #[error(
        "`{algorithm}` needs `{option}`; it takes {}",
        expected_options(algorithm)
    )]
    MissingOption {
        /// The algorithm.
        algorithm: Algorithm,
        /// The option missing.
        option: &'static str,
    },
    /// The quota cannot be computed exactly in integer microseconds.
    #[error(
        "quota too large to compute exactly: capacity times the rate's period (or limit times the \
         window in milliseconds) must stay under 2^52; lower the capacity or shorten the period"
    )]
    TooLarge,
}

#[cfg(test)]
mod tests {
    /// The Lua scripts name each algorithm's id; they must be the ids the
    /// Rust side sends.
    #[test]
    fn the_scripts_name_the_ids_the_limiter_sends() {
        let prelude = include_str!("../scripts/prelude.lua");
        let line = prelude
            .lines()
            .find(|l| l.starts_with("local TOKEN_BUCKET,"))
            .expect("the ids' line in prelude.lua");
        let (names, ids) = line["local ".len()..].split_once(" = ").unwrap();
        let named: Vec<(String, u64)> = names
            .split(", ")
            .zip(ids.split(", "))
            .map(|(name, id)| (name.to_lowercase(), id.parse().unwrap()))
            .collect();
        assert_eq!(named.len(), Algorithm::ALL.len(), "{line}");
        for algorithm in Algorithm::ALL {
            assert!(
                named.contains(&(algorithm.name().to_owned(), algorithm.wire_id())),
                "{algorithm} is not {} in {line}",
                algorithm.wire_id()
            );
        }
    }

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
        assert_eq!("0".parse::<Rate>(), Err(QuotaError::ZeroRate));
        // A bare number is tokens per second.
        assert_eq!("5".parse::<Rate>(), "5/s".parse::<Rate>());
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
        assert!(Quota::sliding_window(1_000_000, Duration::from_secs(86_400)).is_ok());
        assert!(matches!(
            Quota::fixed_window(5, Duration::from_micros(1_500)),
            Err(QuotaError::InvalidWindow(_))
        ));
    }

    #[test]
    fn a_share_of_a_quota_scales_capacity_and_rate() {
        let quota = Quota::new(100, "10/s".parse().unwrap()).unwrap();
        let quarter = quota.scaled(0.25);
        assert_eq!(quarter.capacity(), 25);
        assert_eq!(quarter.rate(), "2.5/s".parse().unwrap());
        assert_eq!(quota.scaled(1.0), quota);
        assert_eq!(
            Quota::new(1, "1/s".parse().unwrap())
                .unwrap()
                .scaled(0.1)
                .capacity(),
            1
        );
        let window = Quota::fixed_window(10, Duration::from_secs(60))
            .unwrap()
            .scaled(0.5);
        assert_eq!(
            (window.capacity(), window.window()),
            (5, Some(Duration::from_secs(60)))
        );
    }

    #[test]
    fn wrong_option_combinations_are_runtime_errors_too() {
        let rate = Rate::per_second(1).unwrap();
        let err = Quota::builder(Algorithm::SlidingLog)
            .limit(5)
            .rate(rate)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`sliding_log` takes `limit` and `window`, not `rate`"
        );
        let err = Quota::builder(Algorithm::Gcra)
            .capacity(5)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`gcra` needs `rate`; it takes `capacity` and `rate`"
        );
        let err = Quota::builder(Algorithm::LeakyBucket)
            .capacity(5)
            .rate(rate)
            .window(Duration::from_secs(1))
            .build()
            .unwrap_err();
        assert!(
            matches!(
                err,
                QuotaError::WrongOption {
                    option: "window",
                    ..
                }
            ),
            "{err}"
        );
        let ok = Quota::builder(Algorithm::FixedWindow)
            .limit(5)
            .window(Quota::parse_window("1m").unwrap())
            .build()
            .unwrap();
        assert_eq!(ok.rate(), "5/min".parse().unwrap());
        assert_eq!(
            "sliding_window".parse::<Algorithm>(),
            Ok(Algorithm::SlidingWindow)
        );
        assert!("bogus".parse::<Algorithm>().is_err());
    }

    #[test]
    fn display_round_trips_through_from_str() {
        for text in ["5/s", "1/600ms", "7/min", "1/86400us", "3/2h"] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!(rate.to_string().parse::<Rate>().unwrap(), rate, "{text}");
        }
    }
}
