//! The answer to one request for tokens.

use std::fmt;
use std::time::Duration;

/// What the limiter decided for one request.
///
/// `retry_after` is exact for a key with no other traffic: a request of the
/// same cost made `retry_after` from now is admitted, and one made earlier is
/// not. This holds for a denial answered from the local deny cache as for one
/// answered by Redis: the cache denies only what Redis would deny, and gives
/// the figures Redis would give as of the latest instant it can have decided
/// the reply it learned them from (that reply's arrival), so its waits are
/// never shorter than Redis's and longer by at most that reply's round trip,
/// and its `remaining` never larger. A check of several limits that one of
/// them denies from the cache is denied without asking about the others:
/// its `retry_after` is that limit's, and another limit of the check may
/// deny for longer.
#[derive(Clone, Copy)]
#[non_exhaustive]
pub struct Decision {
    /// Whether the request was admitted (and its cost consumed).
    pub allowed: bool,
    /// The quota's capacity.
    pub limit: u64,
    /// Whole tokens left after this decision.
    pub remaining: u64,
    /// Time until the denied request could succeed; zero when allowed.
    pub retry_after: Duration,
    /// Time until the key is back to its full quota (the bucket full again,
    /// the window's count gone).
    pub reset_after: Duration,
    /// For the leaky bucket: how long the admitted request must wait for its
    /// turn before it runs. Zero for every other algorithm. The attribute
    /// sleeps for it before running the body.
    pub delay: Duration,
    /// True when the backend failed and the failure policy allowed the call;
    /// `remaining` is then unknown and reported as 0.
    pub fallback: bool,
    /// For the bucket algorithms: the bucket's debt after this decision, in
    /// the algorithm's units (a token is `rate.period_us` of them, and
    /// `rate.tokens` are repaid every microsecond). The deny cache answers
    /// later requests exactly from it. Not part of the public figures, so
    /// neither compared nor printed.
    pub(crate) debt: Option<u64>,
    /// The sliding log's tag of this admission's entries, which a refund
    /// removes them by (0: none).
    pub(crate) tag: u64,
    /// When the request was sent, on the limiter's clock (the memory
    /// backend's own): a refund measures from it what the admission still
    /// holds of a bucket, or finds its window.
    pub(crate) at: u64,
    /// Where the admission's cost was taken, so a refund gives it back there.
    pub(crate) via: Via,
}

/// Where an admission's cost was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// The backend (or the memory backend).
    Backend,
    /// A token lease of this process, by its id.
    Lease(u64),
    /// The local limiter, while the backend failed.
    Local,
    /// Nowhere: the failure policy admitted without counting.
    Nothing,
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.allowed == other.allowed
            && self.limit == other.limit
            && self.remaining == other.remaining
            && self.retry_after == other.retry_after
            && self.reset_after == other.reset_after
            && self.delay == other.delay
            && self.fallback == other.fallback
    }
}

impl Eq for Decision {}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.allowed)
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("retry_after", &self.retry_after)
            .field("reset_after", &self.reset_after)
            .field("delay", &self.delay)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl Decision {
    /// This decision, asked for at `at` on the limiter's clock (a refund
    /// measures from it what the admission still holds).
    #[inline]
    pub(crate) fn asked_at(self, at: u64) -> Self {
        Self { at, ..self }
    }

    /// An admission by [`FailurePolicy::Open`](crate::FailurePolicy::Open):
    /// the backend failed, so nothing is known of the quota's state.
    pub(crate) fn fail_open(limit: u64) -> Self {
        Self {
            fallback: true,
            via: Via::Nothing,
            ..Self::from_micros(true, limit, 0, 0, 0, 0)
        }
    }

    #[inline]
    pub(crate) fn from_micros(
        allowed: bool,
        limit: u64,
        remaining: u64,
        retry_after_us: u64,
        reset_after_us: u64,
        delay_us: u64,
    ) -> Self {
        Self {
            allowed,
            limit,
            remaining,
            retry_after: Duration::from_micros(retry_after_us),
            reset_after: Duration::from_micros(reset_after_us),
            delay: Duration::from_micros(delay_us),
            fallback: false,
            debt: None,
            tag: 0,
            at: 0,
            via: Via::Backend,
        }
    }
}
