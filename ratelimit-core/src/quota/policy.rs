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
