//! The limiter: resolves a request to a backend decision and applies the
//! failure policy when the backend fails.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::memory::MemoryBackend;
use crate::backend::Backend;
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::error::{DenialCause, Error, RateLimited};
use crate::quota::Quota;

/// The default key prefix, so limiter keys are easy to find and to keep apart
/// from an application's own keys.
pub const DEFAULT_PREFIX: &str = "rl:";

/// The default bound on every backend call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// What [`Limiter::acquire`] (and so `#[rate_limit]`) does when the backend
/// fails or times out. Backend errors are never reported as denials unless
/// the policy says to deny, and then the denial says the backend was the cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Allow the call: the service keeps running without limits while the
    /// backend is down. The default, as a limiter must not take its service
    /// down with it.
    #[default]
    Open,
    /// Deny the call with [`DenialCause::BackendUnavailable`] and this
    /// `retry_after`: for limits that protect something that must never be
    /// flooded.
    Closed {
        /// What the denial tells the caller to wait.
        retry_after: Duration,
    },
}

/// A rate limiter: a backend plus how to use it. Cheap to clone; clones share
/// the backend (and the Redis connection).
///
/// ```
/// use ratelimit_core::{Limiter, Quota};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let limiter = Limiter::memory();
/// let quota = Quota::per_second(2)?;
/// assert!(limiter.acquire(&quota, "user:7", 1).await.is_ok());
/// assert!(limiter.acquire(&quota, "user:7", 1).await.is_ok());
/// let denied = limiter.acquire(&quota, "user:7", 1).await.unwrap_err();
/// assert!(denied.retry_after <= std::time::Duration::from_millis(500));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    failure_policy: FailurePolicy,
    /// Second (since the epoch) of the last backend-failure warning, so an
    /// outage logs about once a second rather than once per call.
    last_warning: AtomicU64,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("backend", &self.inner.backend.name())
            .field("failure_policy", &self.inner.failure_policy)
            .finish()
    }
}

impl Limiter {
    /// Starts a [`LimiterBuilder`].
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// An in-process limiter with default settings. The limit holds within
    /// this process only.
    pub fn memory() -> Self {
        Self::from_backend(
            Backend::Memory(MemoryBackend::new(Arc::new(MonotonicClock::new()))),
            FailurePolicy::default(),
        )
    }

    /// Redis at `REDIS_URL` when it is set, the memory backend otherwise.
    pub fn from_env() -> Result<Self, Error> {
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.trim().is_empty() => Self::builder().redis(url).build(),
            _ => Ok(Self::memory()),
        }
    }

    fn from_backend(backend: Backend, failure_policy: FailurePolicy) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend,
                failure_policy,
                last_warning: AtomicU64::new(0),
            }),
        }
    }

    /// The backend's name: `"memory"` or `"redis"`.
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// Asks the backend for `cost` tokens from `key`'s bucket, with no failure
    /// policy: a backend fault is an `Err`, a denial is an `Ok` decision with
    /// `allowed == false`.
    ///
    /// A cost above the capacity is [`Error::CostExceedsCapacity`]; a cost of
    /// zero reads the bucket without consuming.
    pub async fn decide(&self, quota: &Quota, key: &str, cost: u64) -> Result<Decision, Error> {
        if cost > quota.capacity() {
            return Err(Error::CostExceedsCapacity {
                cost,
                capacity: quota.capacity(),
            });
        }
        self.inner.backend.decide(quota, key, cost).await
    }

    /// Takes `cost` tokens from `key`'s bucket, or says why not.
    ///
    /// A denial by the quota is `Err(RateLimited)` with the exact `retry_after`.
    /// A backend fault is handled by the [`FailurePolicy`]: allowed (the
    /// decision has `fallback == true`) or denied with
    /// [`DenialCause::BackendUnavailable`]. A cost above the capacity is denied
    /// with [`DenialCause::CostExceedsCapacity`] and `retry_after` of
    /// [`Duration::MAX`].
    pub async fn acquire(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, RateLimited> {
        match self.decide(quota, key, cost).await {
            Ok(decision) if decision.allowed => Ok(decision),
            Ok(decision) => Err(RateLimited::new(
                key,
                decision.limit,
                decision.remaining,
                decision.retry_after,
            )),
            Err(Error::CostExceedsCapacity { cost, capacity }) => {
                Err(RateLimited::new(key, capacity, 0, Duration::MAX)
                    .with_cause(DenialCause::CostExceedsCapacity { cost }))
            }
            Err(error) => self.on_backend_error(quota, key, error),
        }
    }

    fn on_backend_error(
        &self,
        quota: &Quota,
        key: &str,
        error: Error,
    ) -> Result<Decision, RateLimited> {
        self.warn_throttled(key, &error);
        match self.inner.failure_policy {
            FailurePolicy::Open => Ok(Decision {
                allowed: true,
                limit: quota.capacity(),
                remaining: 0,
                retry_after: Duration::ZERO,
                reset_after: Duration::ZERO,
                delay: Duration::ZERO,
                fallback: true,
            }),
            FailurePolicy::Closed { retry_after } => {
                Err(RateLimited::new(key, quota.capacity(), 0, retry_after)
                    .with_cause(DenialCause::BackendUnavailable))
            }
        }
    }

    fn warn_throttled(&self, key: &str, error: &Error) {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.inner.last_warning.load(Ordering::Relaxed);
        if last != second
            && self
                .inner
                .last_warning
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                backend = self.inner.backend.name(),
                key,
                policy = ?self.inner.failure_policy,
                %error,
                "rate limit backend failed; applying the failure policy (logged at most once a second)"
            );
        }
    }
}

/// Configures a [`Limiter`].
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::{FailurePolicy, Limiter};
///
/// let limiter = Limiter::builder()
///     .redis("redis://127.0.0.1:6379")
///     .prefix("shop:rl:")
///     .timeout(Duration::from_millis(50))
///     .failure_policy(FailurePolicy::Open)
///     .build()?; // connects lazily, on the first decision
/// assert_eq!(limiter.backend_name(), "redis");
/// # Ok::<(), ratelimit_core::Error>(())
/// ```
#[must_use]
pub struct LimiterBuilder {
    backend: BackendChoice,
    prefix: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
    failure_policy: FailurePolicy,
}

enum BackendChoice {
    Memory,
    Redis(String),
}

impl Default for LimiterBuilder {
    fn default() -> Self {
        Self {
            backend: BackendChoice::Memory,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            clock: None,
            failure_policy: FailurePolicy::default(),
        }
    }
}

impl LimiterBuilder {
    /// Keeps state in this process (the default).
    pub fn memory(mut self) -> Self {
        self.backend = BackendChoice::Memory;
        self
    }

    /// Keeps state in Redis at `url` (`redis://host:port/db`,
    /// `rediss://...`, `redis+unix:///path`), shared by every instance.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.backend = BackendChoice::Redis(url.into());
        self
    }

    /// Prepended to every Redis key (default `rl:`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on every backend call (default 100 ms). A call that takes
    /// longer fails with [`Error::Timeout`] and the failure policy applies.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Decides with this clock instead of Redis `TIME` (Redis) or the
    /// monotonic clock (memory). With Redis, instances whose clocks disagree
    /// then disagree on refill; the default Redis `TIME` has no such skew.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// What to do when the backend fails (default [`FailurePolicy::Open`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// Builds the limiter. Fails on an invalid configuration, never because
    /// Redis is unreachable: the connection is made on the first decision.
    pub fn build(self) -> Result<Limiter, Error> {
        if self.timeout.is_zero() {
            return Err(Error::Config(
                "the timeout must be greater than zero".into(),
            ));
        }
        if self.prefix.contains(['{', '}']) {
            return Err(Error::Config(format!(
                "the prefix `{}` contains a hash tag brace; put hash tags in key templates, \
                 where they choose a slot per key, not in the prefix",
                self.prefix
            )));
        }
        let backend = match self.backend {
            BackendChoice::Memory => {
                let clock = self
                    .clock
                    .unwrap_or_else(|| Arc::new(MonotonicClock::new()));
                Backend::Memory(MemoryBackend::new(clock))
            }
            #[cfg(feature = "redis")]
            BackendChoice::Redis(url) => Backend::Redis(crate::backend::redis::RedisBackend::new(
                &url,
                self.prefix,
                self.timeout,
                self.clock,
            )?),
            #[cfg(not(feature = "redis"))]
            BackendChoice::Redis(_) => {
                return Err(Error::Config(
                    "a Redis URL was given but the `redis` feature is off; enable it in Cargo.toml"
                        .into(),
                ))
            }
        };
        Ok(Limiter::from_backend(backend, self.failure_policy))
    }
}
