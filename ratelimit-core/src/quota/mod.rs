//! Quotas: how many tokens a bucket holds and how fast it refills.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

mod policy;
mod rate;

pub use policy::QuotaPolicy;
#[doc(hidden)]
pub use rate::__span_micros;
pub use rate::Rate;
pub(crate) use rate::{parse_span, MAX_EXACT};

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
    /// Follows from the rest (see [`Quota::policy`]).
    policy: QuotaPolicy,
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

    /// Exactly `limit` in any window of length `window`. The log keeps one
    /// entry per admitted unit, so its memory, and the work of an admission
    /// of a large cost, grow with `limit`: at most [`Quota::MAX_LOG_LIMIT`]
    /// ([`QuotaError::LogTooLong`] above it; `sliding_window` keeps two
    /// counts for any limit).
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
            Some(depth) if depth <= MAX_EXACT => Ok(Self::of_parts(algorithm, capacity, rate, 0)),
            _ => Err(QuotaError::TooLarge),
        }
    }

    /// The largest `limit` of a sliding log. Its log keeps one entry per
    /// admitted unit (a sorted-set member in Redis, some 70 bytes): a key
    /// holds at most this many, and one admission writes at most this many,
    /// which Redis does in a few milliseconds, inside one script that
    /// nothing else runs beside.
    pub const MAX_LOG_LIMIT: u64 = 10_000;

    fn windowed(algorithm: Algorithm, limit: u64, window: Duration) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroCapacity);
        }
        if algorithm == Algorithm::SlidingLog && limit > Self::MAX_LOG_LIMIT {
            return Err(QuotaError::LogTooLong { limit });
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
        Ok(Self::of_parts(algorithm, limit, rate, window_us))
    }

    /// A quota of checked parts, with its policy worked out once: every
    /// denial names it, so it is never computed on the request path.
    const fn of_parts(algorithm: Algorithm, capacity: u64, rate: Rate, window_us: u64) -> Self {
        Self {
            algorithm,
            capacity,
            rate,
            window_us,
            policy: QuotaPolicy::of(algorithm, capacity, rate, window_us),
        }
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
        Self::of_parts(algorithm, capacity, Rate { tokens, period_us }, window_us)
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
    /// included, but for a bucket's debt, below): the time to refill an
    /// empty bucket; the window for the fixed window and the sliding log;
    /// twice the window for the sliding window counter, whose previous
    /// window fades over the next one.
    ///
    /// A bucket's debt run up under another quota (a slower rate, a larger
    /// capacity) is waited out as it is: up to that quota's longest wait.
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
    /// down, the window kept. The share is read in millionths, rounded down,
    /// or in coarser parts when that fraction does not fit, and at last in
    /// whole tokens: the capacity rounded down, one token per period rounded
    /// up. So never more than the share (but for the one token kept; the
    /// bucket's depth is then the quota's own, which fits).
    pub(crate) fn scaled(&self, share: f64) -> Quota {
        if !(share > 0.0 && share < 1.0) {
            return *self;
        }
        for scale in [1_000_000u64, 1_000, 100] {
            // Rounded down: a part rounded up is more than the share, and
            // the fallbacks of every instance more than the quota.
            let parts = (share * scale as f64).floor() as u64;
            if parts == 0 {
                continue;
            }
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
        let capacity = ((self.capacity as f64 * share).floor() as u64).max(1);
        let per_token =
            (self.rate.period_us as f64 / self.rate.tokens as f64 / share).ceil() as u128;
        Rate::from_parts(1, per_token)
            .and_then(|rate| Quota::bucket(self.algorithm, capacity, rate))
            // Not reached for a quota that was valid: a share of one token
            // at the quota's own pace, rather than the whole quota.
            .or_else(|_| Quota::bucket(self.algorithm, 1, self.rate))
            .unwrap_or(*self)
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
    /// A sliding log's limit above [`Quota::MAX_LOG_LIMIT`]: the log keeps
    /// one entry per admitted unit.
    #[error(
        "a sliding log's limit is at most 10000 (it keeps one entry per admitted unit), not \
         {limit}; `sliding_window` limits any number with two counts"
    )]
    LogTooLong {
        /// The limit given.
        limit: u64,
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
        let prelude = include_str!("../../scripts/prelude.lua");
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
        // No exact fraction fits: whole tokens, never more than the share.
        let large = Quota::new(1_000_000, "1/h".parse().unwrap()).unwrap();
        let third = large.scaled(1.0 / 3.0);
        let per_second = |q: &Quota| q.rate().tokens() as f64 / q.rate().period().as_secs_f64();
        assert!(third.capacity() <= 333_333, "{third:?}");
        assert!(
            per_second(&third) <= per_second(&large) / 3.0 * (1.0 + 1e-9),
            "{third:?}"
        );
        let window = Quota::fixed_window(10, Duration::from_secs(60))
            .unwrap()
            .scaled(0.5);
        assert_eq!(
            (window.capacity(), window.window()),
            (5, Some(Duration::from_secs(60)))
        );
    }

    /// A share is never more than the share, at whatever precision it
    /// fits: the capacity and the rate scaled by at most `share` (the local
    /// fallbacks of N instances admit at most the quota). The coarser
    /// precisions rounded to nearest: 1/60 of 100,000 at 1/h was 2,000 at
    /// 1/50h, and 1/153 of 1,000,000 at 1/h 10,000 at 1/100h (1.53 times).
    #[test]
    fn a_share_is_never_more_than_the_share() {
        let per_second = |q: &Quota| q.rate().tokens() as f64 / q.rate().period().as_secs_f64();
        let mut quotas = Vec::new();
        for capacity in [1, 7, 100, 100_000, 1_000_000, 10_000_000] {
            for rate in ["1/h", "1000/d", "7/min", "10/s", "1/365d", "1000000/s"] {
                if let Ok(quota) = Quota::new(capacity, rate.parse().unwrap()) {
                    quotas.push(quota);
                }
            }
            if let Ok(window) = Quota::fixed_window(capacity, Duration::from_secs(60)) {
                quotas.push(window);
            }
        }
        for quota in &quotas {
            for n in 2..=500u32 {
                let share = 1.0 / f64::from(n);
                let part = quota.scaled(share);
                // At least one token is kept, whatever the share.
                let most = (quota.capacity() as f64 * share).max(1.0);
                assert!(
                    part.capacity() as f64 <= most * (1.0 + 1e-9),
                    "1/{n} of {quota:?} is {part:?}"
                );
                if !quota.algorithm().is_windowed() && part.capacity() > 1 {
                    assert!(
                        per_second(&part) <= per_second(quota) * share * (1.0 + 1e-9),
                        "1/{n} of {quota:?} is {part:?}"
                    );
                }
            }
        }
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

    /// A sliding log keeps an entry per admitted unit: a limit of millions
    /// would let one key, and one admission, hold and write millions.
    #[test]
    fn a_sliding_log_is_refused_a_limit_it_cannot_keep() {
        let minute = Duration::from_secs(60);
        let max = Quota::MAX_LOG_LIMIT;
        assert!(Quota::sliding_log(max, minute).is_ok());
        let error = Quota::sliding_log(max + 1, minute).unwrap_err();
        assert_eq!(error, QuotaError::LogTooLong { limit: max + 1 });
        assert!(
            error.to_string().contains(&format!("at most {max} ")),
            "{error}"
        );
        // The other windowed algorithms keep counts, of any limit.
        assert!(Quota::sliding_window(10_000_000, minute).is_ok());
        assert!(Quota::fixed_window(10_000_000, minute).is_ok());
        // The same through a rule's text.
        let rule = "algorithm=sliding_log limit=10000000 window=1m".parse::<Quota>();
        assert_eq!(
            rule,
            Err(crate::RuleError::Quota(QuotaError::LogTooLong {
                limit: 10_000_000
            }))
        );
    }
}
