//! Denials: what a caller gets instead of running, and why. A denial is
//! never an [`Error`](crate::Error).

use std::fmt;
use std::time::Duration;

use crate::error::ErrorKind;

/// Why a call was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenialCause {
    /// The key's quota is spent for now.
    Quota,
    /// The backend failed and the failure policy is
    /// [`FailurePolicy::Closed`](crate::FailurePolicy::Closed).
    BackendUnavailable {
        /// What kind of fault the backend had: an outage to ride out, or a
        /// misconfiguration to fix ([`ErrorKind::is_misconfiguration`]).
        kind: ErrorKind,
    },
    /// The backend failed and the local fallback limiter
    /// ([`FailurePolicy::Local`](crate::FailurePolicy::Local)), with its share
    /// of the quota, denied.
    LocalFallback,
    /// The request costs more than the quota's capacity: it can never be
    /// admitted, however long the caller waits. `retry_after` is
    /// [`Duration::MAX`].
    CostExceedsCapacity {
        /// The cost the call asked for.
        cost: u64,
    },
    /// The check named the same key twice: it can never be decided as
    /// written (each limit needs a key of its own). The caller's mistake,
    /// counted as an error; `retry_after` is [`Duration::MAX`].
    DuplicateKey,
}

/// The typed denial a rate-limited function returns instead of running its body.
///
/// A function under `#[rate_limit]` returns `Err(E::from(rate_limited))`,
/// so its error type implements `From<RateLimited>`.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::RateLimited;
///
/// let denied = RateLimited::new("order:submit:42", 10, 0, Duration::from_millis(480));
/// assert_eq!(denied.to_string(), "rate limited on `order:submit:42`; retry after 480ms");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimited {
    /// The key that was limited, without the limiter's prefix.
    pub key: String,
    /// The name of the rule that denied: for the attribute, its `rule = "..."`,
    /// else the module path and the function's name (which methods of one
    /// name in one module share).
    pub rule: Option<&'static str>,
    /// The quota's capacity.
    pub limit: u64,
    /// Whole tokens left.
    pub remaining: u64,
    /// How long to wait before the same call can succeed: [`Duration::MAX`]
    /// when waiting never helps (a cost above the capacity, a check naming
    /// one key twice; see [`is_retryable`](Self::is_retryable)), so add it
    /// to an instant with `checked_add`, not `+`.
    pub retry_after: Duration,
    /// How long until the key is back to its full quota (as
    /// [`Decision::reset_after`](crate::Decision::reset_after)).
    /// [`RateLimited::new`] sets it to `retry_after`.
    pub reset_after: Duration,
    /// Whether the quota or the failure policy denied.
    pub cause: DenialCause,
    /// The policy of the quota that denied ([`Quota::policy`](crate::Quota::policy)),
    /// which HTTP responses advertise: every denial by
    /// [`Limiter::check`](crate::Limiter::check) names it; `None` for one
    /// built with [`RateLimited::new`].
    pub policy: Option<crate::QuotaPolicy>,
}

impl RateLimited {
    /// A denial by the quota.
    pub fn new(key: impl Into<String>, limit: u64, remaining: u64, retry_after: Duration) -> Self {
        Self {
            key: key.into(),
            rule: None,
            limit,
            remaining,
            retry_after,
            reset_after: retry_after,
            cause: DenialCause::Quota,
            policy: None,
        }
    }

    /// The denial by a quota that `decision` (not allowed) describes.
    pub(crate) fn from_decision(key: &str, decision: &crate::Decision) -> Self {
        Self {
            reset_after: decision.reset_after,
            ..Self::new(
                key,
                decision.limit,
                decision.remaining,
                decision.retry_after,
            )
        }
    }

    /// The denial of a request that can never be admitted: `cost` above
    /// the quota's `capacity`.
    pub(crate) fn never_admittable(key: &str, capacity: u64, cost: u64) -> Self {
        Self::new(key, capacity, 0, Duration::MAX)
            .with_cause(DenialCause::CostExceedsCapacity { cost })
    }

    /// Names the rule that denied.
    pub(crate) fn with_quota(mut self, quota: &crate::Quota) -> Self {
        self.policy = Some(quota.policy());
        self
    }

    pub(crate) fn with_rule(mut self, rule: &'static str) -> Self {
        self.rule = Some(rule);
        self
    }

    /// Sets why the call was denied.
    pub(crate) fn with_cause(mut self, cause: DenialCause) -> Self {
        self.cause = cause;
        self
    }

    /// Whether waiting can help: false for a cost above the capacity and
    /// for a check that names a key twice.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self.cause,
            DenialCause::CostExceedsCapacity { .. } | DenialCause::DuplicateKey
        )
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate limited on `{}`", self.key)?;
        match self.cause {
            DenialCause::Quota => write!(f, "; retry after {:?}", self.retry_after),
            DenialCause::BackendUnavailable { kind } => write!(
                f,
                " (backend unavailable: {kind}; failing closed); retry after {:?}",
                self.retry_after
            ),
            DenialCause::LocalFallback => write!(
                f,
                " by the local fallback limiter (backend unavailable); retry after {:?}",
                self.retry_after
            ),
            DenialCause::CostExceedsCapacity { cost } => write!(
                f,
                "; cost {cost} exceeds the capacity {} and can never be admitted",
                self.limit
            ),
            DenialCause::DuplicateKey => write!(
                f,
                "; the check names this key twice and can never be decided; give each limit a \
                 key of its own"
            ),
        }
    }
}

impl std::error::Error for RateLimited {}

/// So functions returning `std::io::Result` can be rate limited: the denial
/// is an [`std::io::ErrorKind::Other`] error carrying the [`RateLimited`],
/// which `get_ref().downcast_ref::<RateLimited>()` gives back.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::RateLimited;
///
/// let error = std::io::Error::from(RateLimited::new("k", 1, 0, Duration::from_secs(1)));
/// let denied = error.get_ref().and_then(|e| e.downcast_ref::<RateLimited>()).unwrap();
/// assert_eq!(denied.retry_after, Duration::from_secs(1));
/// ```
impl From<RateLimited> for std::io::Error {
    fn from(denied: RateLimited) -> Self {
        std::io::Error::other(denied)
    }
}
