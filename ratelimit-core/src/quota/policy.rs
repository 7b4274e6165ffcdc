//! A quota as a policy a client can follow: so many units in every window
//! of so many seconds.

use std::num::NonZeroU64;

use super::{Algorithm, Quota, Rate};

/// The largest integer a Structured Field carries (RFC 9651), so that a
/// policy fits the IETF `RateLimit-Policy` header field as it is.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// What a [`Quota`] allows again and again: [`quota_units`](Self::quota_units)
/// in every [`window_secs`](Self::window_secs) seconds. It is the `q` and `w`
/// of the IETF `RateLimit-Policy` header field, and what every denial by a
/// check names ([`RateLimited::policy`](crate::RateLimited::policy)).
///
/// `q / w` is the quota's sustained rate, and `q` is at least its burst (the
/// capacity, or the window's limit): `w` is the smallest whole number of
/// seconds, at least one and at least the time an empty quota takes to fill
/// again, so both hold. A bucket of 10 at 100/s is `q=100;w=1`, not
/// `q=10;w=1`, which would tell a client to send a tenth of what it may; a
/// bucket of 20 at 10/s is `q=20;w=2`; 5 a minute is `q=5;w=60`.
///
/// `w` is then rounded up to a whole multiple of the rate's period where
/// needed so that `q` is a whole number (1 every 1.2 s is `q=5;w=6`), as
/// long as that window is at most a minute or twice the smallest one; past
/// that (a rate such as 1 every 1.000001 s), `w` stays the smallest window
/// and `q` is rounded down, so the sustained rate is understated by less
/// than one unit per window and never overstated.
///
/// Saying exactly `capacity + rate * w` (what a full bucket can spend in
/// `w`) was not chosen: it overstates the rate a client can keep up, and a
/// client pacing itself at `q / w` would be denied.
///
/// ```
/// use ratelimit_core::Quota;
///
/// let policy = Quota::new(10, "100/s".parse()?)?.policy();
/// assert_eq!((policy.quota_units(), policy.window_secs()), (100, 1));
/// let policy = Quota::per_minute(5)?.policy();
/// assert_eq!((policy.quota_units(), policy.window_secs()), (5, 60));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuotaPolicy {
    // Non-zero, so that a denial's `Option<QuotaPolicy>` takes no room of
    // its own.
    q: NonZeroU64,
    w: NonZeroU64,
}

impl QuotaPolicy {
    /// `q`: the units allowed in every window.
    pub fn quota_units(&self) -> u64 {
        self.q.get()
    }

    /// `w`: the window, in whole seconds.
    pub fn window_secs(&self) -> u64 {
        self.w.get()
    }
}

impl Quota {
    /// This quota as a policy: so many units in every window of so many
    /// seconds (see [`QuotaPolicy`]).
    pub fn policy(&self) -> QuotaPolicy {
        self.policy
    }
}

impl QuotaPolicy {
    /// The policy of a quota of these parts (checked: `tokens`,
    /// `period_us` and `capacity` non-zero, the depth below 2^53).
    pub(super) const fn of(
        algorithm: Algorithm,
        capacity: u64,
        rate: Rate,
        window_us: u64,
    ) -> Self {
        let per_second = rate.tokens as u128 * 1_000_000;
        let period_us = rate.period_us as u128;
        // The time an empty quota takes to fill again, in whole seconds.
        let fill_us = if algorithm.is_windowed() {
            window_us
        } else {
            (capacity * rate.period_us).div_ceil(rate.tokens)
        };
        let smallest = fill_us.div_ceil(1_000_000) as u128;
        let smallest = if smallest == 0 { 1 } else { smallest };
        // `per_second * w / period_us` is whole when `w` is a multiple of `step`.
        let step = period_us / gcd(per_second, period_us);
        let exact = smallest.div_ceil(step).saturating_mul(step);
        let longest = if 2 * smallest > 60 { 2 * smallest } else { 60 };
        let w = if exact <= longest { exact } else { smallest };
        let q = per_second.saturating_mul(w) / period_us;
        Self {
            q: clamp(q),
            w: clamp(w),
        }
    }
}

/// `n` within `1..=SF_INTEGER_MAX`.
const fn clamp(n: u128) -> NonZeroU64 {
    let n = if n > SF_INTEGER_MAX as u128 {
        SF_INTEGER_MAX
    } else {
        n as u64
    };
    match NonZeroU64::new(n) {
        Some(n) => n,
        None => NonZeroU64::MIN,
    }
}

const fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn advertised(quota: &Quota) -> (u64, u64) {
        let policy = quota.policy();
        (policy.quota_units(), policy.window_secs())
    }

    fn q_w(capacity: u64, rate: &str) -> (u64, u64) {
        advertised(&Quota::new(capacity, rate.parse().unwrap()).unwrap())
    }

    #[test]
    fn the_policy_tells_the_sustained_rate_and_at_least_the_burst() {
        assert_eq!(q_w(10, "100/s"), (100, 1), "fast: the rate, not the burst");
        assert_eq!(q_w(20, "10/s"), (20, 2));
        assert_eq!(q_w(100, "50/s"), (100, 2));
        assert_eq!(q_w(5, "5/min"), (5, 60));
        assert_eq!(q_w(3, "3/10s"), (3, 10));
        assert_eq!(q_w(10, "1/h"), (10, 36_000));
        // 1 every 1.2 s: no whole q in 2 s, 5 in 6 s.
        assert_eq!(q_w(1, "1/1200ms"), (5, 6));
        // 1 every 480 ms: 25 in 12 s.
        assert_eq!(q_w(1, "1/480ms"), (25, 12));
        // No whole q within a minute: the smallest window, q rounded down.
        let odd = Quota::new(
            1,
            crate::quota::Rate::new(1, Duration::from_micros(1_000_001)).unwrap(),
        )
        .unwrap();
        let (q, w) = advertised(&odd);
        assert_eq!(w, 2, "1.000001 s to fill: the smallest whole window is 2 s");
        assert_eq!(q, 1, "rounded down, never overstated");
        let window = Quota::fixed_window(100, Duration::from_secs(60)).unwrap();
        assert_eq!(advertised(&window), (100, 60));
        let short = Quota::fixed_window(5, Duration::from_millis(500)).unwrap();
        assert_eq!(advertised(&short), (10, 1));
        for (capacity, rate) in [(10, "100/s"), (7, "3/s"), (1, "1/480ms"), (1000, "1/d")] {
            let quota = Quota::new(capacity, rate.parse().unwrap()).unwrap();
            let (q, w) = advertised(&quota);
            assert!(q >= capacity, "{quota}: q={q} is at least the burst");
            let per_second = quota.rate().per_second_f64();
            assert!(
                ((q as f64 / w as f64) - per_second).abs() < 1e-9,
                "{quota}: q/w = {q}/{w} is the rate {per_second}/s"
            );
        }
    }
}
