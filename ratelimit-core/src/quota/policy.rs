//! A quota as a policy a client can follow: so many units in every window
//! of so many seconds.

use std::num::NonZeroU64;

use super::Quota;

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
        let rate = self.rate();
        let per_second = u128::from(rate.tokens()) * 1_000_000;
        let period_us = rate.period().as_micros().max(1);
        let fill = self.replenish_all();
        let fill_secs = fill.as_secs() + u64::from(fill.subsec_nanos() > 0);
        let smallest = u128::from(fill_secs.max(1));
        // `per_second * w / period_us` is whole when `w` is a multiple of `step`.
        let step = u128::from(rate.whole_seconds());
        let exact = smallest.div_ceil(step).saturating_mul(step);
        let w = if exact <= (2 * smallest).max(60) {
            exact
        } else {
            smallest
        };
        let q = per_second.saturating_mul(w) / period_us;
        let clamp = |n: u128| {
            let n = u64::try_from(n)
                .unwrap_or(u64::MAX)
                .clamp(1, SF_INTEGER_MAX);
            NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
        };
        QuotaPolicy {
            q: clamp(q),
            w: clamp(w),
        }
    }
}
