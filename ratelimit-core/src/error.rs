//! Denials and faults, kept apart: a denial is never an error, and a backend
//! error is never a denial.

use std::fmt;
use std::time::Duration;

use crate::quota::QuotaError;

/// Why a call was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenialCause {
    /// The key's quota is spent for now.
    Quota,
    /// The backend failed and the failure policy is
    /// [`FailurePolicy::Closed`](crate::FailurePolicy::Closed).
    BackendUnavailable,
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
    /// The name of the rule that denied (the function's path for the attribute).
    pub rule: Option<&'static str>,
    /// The quota's capacity.
    pub limit: u64,
    /// Whole tokens left.
    pub remaining: u64,
    /// How long to wait before the same call can succeed.
    pub retry_after: Duration,
    /// Whether the quota or the failure policy denied.
    pub cause: DenialCause,
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
            cause: DenialCause::Quota,
        }
    }

    /// Names the rule that denied.
    pub fn with_rule(mut self, rule: &'static str) -> Self {
        self.rule = Some(rule);
        self
    }

    /// Sets why the call was denied.
    pub fn with_cause(mut self, cause: DenialCause) -> Self {
        self.cause = cause;
        self
    }

    /// Whether waiting can help: false only for a cost above the capacity.
    pub fn is_retryable(&self) -> bool {
        !matches!(self.cause, DenialCause::CostExceedsCapacity { .. })
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate limited on `{}`", self.key)?;
        match self.cause {
            DenialCause::Quota => write!(f, "; retry after {:?}", self.retry_after),
            DenialCause::BackendUnavailable => write!(
                f,
                " (backend unavailable, failing closed); retry after {:?}",
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

/// A fault of the backend or of the configuration. Never a denial.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request costs more than the quota's capacity: "never", not "not now".
    #[error("cost {cost} exceeds the capacity {capacity} of the quota; such a request can never be admitted")]
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The quota's capacity.
        capacity: u64,
    },
    /// The backend did not answer within the limiter's timeout.
    #[error("the rate limit backend did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error or the connection failed.
    #[cfg(feature = "redis")]
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The circuit breaker is open: the backend failed repeatedly and is
    /// skipped until a probe call succeeds.
    #[error("the rate limit backend is failing; calls skip it until a probe succeeds")]
    CircuitOpen,
    /// The backend answered something the limiter does not understand.
    #[error("unexpected reply from the rate limit backend: {0}")]
    UnexpectedReply(String),
    /// The key holds a value this quota's algorithm did not write (another
    /// application's key, or another algorithm's state under the same
    /// name). That key alone cannot be decided: nothing was written to it,
    /// the other keys of the same backend call were decided as usual, and
    /// the circuit breaker does not count it, as the backend is healthy.
    /// Give the rule a key of its own, or delete the key.
    #[error(
        "the key `{key}` holds a value `{algorithm}` did not write; another writer or algorithm \
         uses this key; give the limit a key of its own or delete the key"
    )]
    ForeignValue {
        /// The full key, prefix included, as it is named in the backend.
        key: String,
        /// The algorithm that was asked to decide.
        algorithm: crate::quota::Algorithm,
    },
    /// More decisions are waiting for the backend than the limiter queues
    /// (the backend is slower than the calls arrive): this call was not
    /// sent. The failure policy answers it; the circuit breaker does not
    /// count it.
    #[error(
        "{0} decisions are already waiting for the rate limit backend; this call was not sent"
    )]
    Overloaded(usize),
    /// The limiter was configured wrongly.
    #[error("invalid limiter configuration: {0}")]
    Config(String),
    /// An invalid quota.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// [`install`](crate::install) was called after a global limiter was set or used.
    #[error(
        "a global limiter is already in place; call `ratelimit::install` once, at start-up, \
         before the first rate-limited call"
    )]
    AlreadyInstalled,
}

impl Error {
    /// Whether the fault came from the backend (and so a failure policy applies),
    /// rather than from the request or the configuration.
    pub fn is_backend(&self) -> bool {
        match self {
            Error::Timeout(_)
            | Error::UnexpectedReply(_)
            | Error::CircuitOpen
            | Error::ForeignValue { .. }
            | Error::Overloaded(_) => true,
            #[cfg(feature = "redis")]
            Error::Redis(_) => true,
            _ => false,
        }
    }

    /// Whether the fault says the backend itself is failing (it timed out,
    /// the connection broke, it answered an error or nonsense), which is
    /// what the circuit breaker counts. A foreign value at one key, a full
    /// queue or a configuration error says nothing about the backend's
    /// health.
    pub fn is_backend_failure(&self) -> bool {
        match self {
            Error::Timeout(_) | Error::UnexpectedReply(_) => true,
            #[cfg(feature = "redis")]
            Error::Redis(_) => true,
            _ => false,
        }
    }
}
