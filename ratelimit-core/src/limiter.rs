//! The limiter: sends a request to the backend through the circuit breaker,
//! applies the failure policy when the backend fails, and reports what it
//! did (metrics, tracing, counters).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::Instrument as _;

use crate::backend::memory::MemoryBackend;
use crate::backend::Backend;
use crate::breaker::{Breaker, BreakerConfig, CircuitState};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::deny_cache::{Consulted, DenyCache};
use crate::error::{DenialCause, Error, RateLimited};
use crate::lease::Leases;
use crate::metrics::{Outcome, Stats, StatsSnapshot};
use crate::quota::{Algorithm, Quota};

mod policy;
pub use policy::FailurePolicy;

/// The default key prefix, so limiter keys are easy to find and to keep apart
/// from an application's own keys.
pub const DEFAULT_PREFIX: &str = "rl:";

/// The default bound on the keys the memory backend keeps
/// ([`LimiterBuilder::memory_max_keys`]).
pub const DEFAULT_MEMORY_MAX_KEYS: usize = 1_000_000;

/// The default bound on every backend call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// Per-call settings: the rule's name (for metrics, logs and denials), a
/// failure policy overriding the limiter's, and shadow mode.
///
/// ```
/// use ratelimit_core::{CallOptions, FailurePolicy};
///
/// const CHECKOUT: CallOptions = CallOptions::new("checkout").on_error(FailurePolicy::Closed);
/// assert_eq!(CHECKOUT.rule, "checkout");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallOptions {
    /// The rule's name: a metrics label, and named in denials.
    pub rule: &'static str,
    /// Overrides the limiter's failure policy for this call.
    pub on_error: Option<FailurePolicy>,
    /// Decide and record as usual, but never deny: a would-be denial returns
    /// `Ok` with `allowed == false`, for rolling a new limit out.
    pub shadow: bool,
    /// Token leases: take up to this many tokens in one backend call and
    /// serve them in process until they run out or the lease expires
    /// ([`LimiterBuilder::lease_ttl`]). 0 (the default) takes tokens one call
    /// at a time. The global bound holds exactly; unused leased tokens are
    /// lost at expiry, which can under-admit. Not used by the leaky bucket,
    /// whose admissions carry each call's own delay.
    pub lease: u64,
}

impl CallOptions {
    /// Options for the rule `rule`, with the limiter's failure policy.
    pub const fn new(rule: &'static str) -> Self {
        Self {
            rule,
            on_error: None,
            shadow: false,
            lease: 0,
        }
    }

    /// Leases up to `tokens` tokens per backend call (see [`CallOptions::lease`]).
    pub const fn lease(mut self, tokens: u64) -> Self {
        self.lease = tokens;
        self
    }

    /// Uses `policy` when the backend fails.
    pub const fn on_error(mut self, policy: FailurePolicy) -> Self {
        self.on_error = Some(policy);
        self
    }

    /// Shadow mode: never deny.
    pub const fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }
}

impl Default for CallOptions {
    fn default() -> Self {
        Self::new("")
    }
}

/// One dimension of a limit checked with others, all or nothing: see
/// [`Limiter::check_all`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Dimension<'a> {
    /// The dimension's quota.
    pub quota: &'a Quota,
    /// The key, without the limiter's prefix.
    pub key: &'a str,
    /// Tokens to take.
    pub cost: u64,
    /// The rule's name, for metrics and denials.
    pub rule: &'static str,
    /// This dimension's failure policy, overriding the limiter's: see
    /// [`Limiter::check_all`].
    pub on_error: Option<FailurePolicy>,
}

impl<'a> Dimension<'a> {
    /// `cost` 1 of `quota` from `key`.
    pub fn new(quota: &'a Quota, key: &'a str) -> Self {
        Self {
            quota,
            key,
            cost: 1,
            rule: "",
            on_error: None,
        }
    }

    /// Uses `policy` for this dimension when the backend fails.
    pub fn on_error(mut self, policy: FailurePolicy) -> Self {
        self.on_error = Some(policy);
        self
    }

    /// Takes `cost` tokens.
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Names the rule.
    pub fn rule(mut self, rule: &'static str) -> Self {
        self.rule = rule;
        self
    }
}

/// What a check of several dimensions in shadow mode found: see
/// [`Limiter::check_all_shadow`].
#[derive(Debug)]
#[must_use = "a would-be denial is only reported here"]
pub enum ShadowCheck {
    /// Every dimension admitted, and each consumed.
    Admitted(Vec<Decision>),
    /// The check would have been denied, by this denial (which dimension,
    /// why, when to retry). Nothing was consumed; the call goes ahead.
    WouldDeny(RateLimited),
}

/// A rate limiter: a backend plus how to use it. Cheap to clone; clones share
/// the backend (and the Redis connection), the circuit breaker and the counters.
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
/// assert_eq!(limiter.stats().denied, 1);
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
    closed_retry_after: Duration,
    local_share: f64,
    /// The in-process limiter behind [`FailurePolicy::Local`].
    local: MemoryBackend,
    breaker: Breaker,
    /// Denials kept in process until their `retry_after` (remote backends only).
    deny_cache: Option<DenyCache>,
    /// The deny cache's clock: the caller's clock when configured.
    cache_clock: Arc<dyn Clock>,
    /// The backend call timeout, also the longest a caller waits for another
    /// caller's backend call on the same key.
    timeout: Duration,
    /// Tokens leased from the backend, served in process.
    leases: Leases,
    lease_ttl: Duration,
    /// Named rules, changeable while running.
    rules: crate::rules::Rules,
    stats: Stats,
    /// Log one denial in this many (0: none).
    denial_log_every: u64,
    /// Second (since the epoch) of the last backend-failure warning, so an
    /// outage logs about once a second rather than once per call.
    last_warning: AtomicU64,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("backend", &self.inner.backend.name())
            .field("failure_policy", &self.inner.failure_policy)
            .field("circuit", &self.inner.breaker.state())
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
        Self::builder()
            .memory()
            .build()
            .unwrap_or_else(|_| unreachable_config())
    }

    /// From the environment: the master Redis Sentinel names
    /// `REDIS_SENTINEL_MASTER`, found through `REDIS_SENTINELS`
    /// (comma-separated `host:port`, or URLs) when that is set; else Redis
    /// at `REDIS_URL` when it is set; else the memory backend.
    ///
    /// Nothing is connected yet: call [`ping`](Self::ping) at start-up, so a
    /// wrong password, an untrusted certificate or a missing permission
    /// stops the service there.
    ///
    /// ```no_run
    /// # async fn start() -> Result<(), ratelimit_core::Error> {
    /// let limiter = ratelimit_core::Limiter::from_env()?;
    /// limiter.ping().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_env() -> Result<Self, Error> {
        let var = |name| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(sentinels) = var("REDIS_SENTINELS") {
            let master = var("REDIS_SENTINEL_MASTER").ok_or_else(|| {
                Error::Config(
                    "REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER is not; set it to the \
                     master's name, such as `mymaster`"
                        .into(),
                )
            })?;
            let urls: Vec<String> = sentinels
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    if s.contains("://") {
                        s.to_owned()
                    } else {
                        format!("redis://{s}")
                    }
                })
                .collect();
            return Self::builder().sentinel(master, urls).build();
        }
        match var("REDIS_URL") {
            Some(url) => Self::builder().redis(url).build(),
            None => Ok(Self::memory()),
        }
    }

    /// The backend's name: `"memory"` or `"redis"`.
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// The named rules this limiter resolves quotas from.
    pub fn rules(&self) -> &crate::rules::Rules {
        &self.inner.rules
    }

    /// The circuit breaker's state.
    pub fn circuit_state(&self) -> CircuitState {
        self.inner
            .backend
            .circuit_state()
            .unwrap_or_else(|| self.inner.breaker.state())
    }

    /// What this limiter (and its clones) decided so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// Asks the backend for `cost` tokens from `key`'s quota, with no failure
    /// policy: a backend fault (or an open circuit breaker) is an `Err`, a
    /// denial is an `Ok` decision with `allowed == false`.
    ///
    /// A cost above the capacity is [`Error::CostExceedsCapacity`]; a cost of
    /// zero reads the state without consuming.
    pub async fn decide(&self, quota: &Quota, key: &str, cost: u64) -> Result<Decision, Error> {
        let result = self.decide_quietly(quota, key, cost).await;
        let outcome = match &result {
            Ok(d) if d.allowed => Outcome::Allowed,
            Ok(_) => Outcome::Denied,
            Err(_) => Outcome::Error,
        };
        self.inner.stats.record("", outcome);
        result
    }

    async fn decide_quietly(&self, quota: &Quota, key: &str, cost: u64) -> Result<Decision, Error> {
        if cost > quota.capacity() {
            return Err(Error::CostExceedsCapacity {
                cost,
                capacity: quota.capacity(),
            });
        }
        let backend = &self.inner.backend;
        if !backend.can_fail() {
            let decision = backend.decide(quota, key, cost).await;
            answered_in_process().await;
            return decision;
        }
        self.inner.leases.forget_other_quota(quota, key);
        let Some(cache) = &self.inner.deny_cache else {
            return self.guarded(backend.decide(quota, key, cost)).await;
        };
        let clock = &*self.inner.cache_clock;
        let probe = match cache
            .consult(quota, key, cost, clock, self.inner.timeout)
            .await
        {
            Consulted::Denied(cached) => {
                self.inner.stats.cache_hit();
                answered_in_process().await;
                return Ok(cached);
            }
            Consulted::Failed(error) => return Err(error),
            Consulted::Ask(probe) => probe,
        };
        // The backend decides between these two instants; the cache keeps
        // both (see `deny_cache`).
        let asked = cache.asked(key, clock.now_micros());
        let result = self.guarded(backend.decide(quota, key, cost)).await;
        let now = clock.now_micros();
        cache.record(quota, key, cost, asked, now, &result, probe);
        result
    }

    /// Verifies that this limiter can decide now, and names the cause when
    /// it cannot: the connection (refused, a host that does not resolve), the
    /// credentials, TLS (the certificate's fault), the kind of server (a
    /// cluster node given as one Redis, a replica given as the master, and
    /// the reverse), the script's load, and the ACL permission for the keys
    /// under the prefix. One round trip or a few; nothing is written.
    ///
    /// Call it at start-up, so a misconfiguration stops the service there
    /// instead of running every call on the [`FailurePolicy`], and from a
    /// readiness endpoint. [`Error::kind`] tells a misconfiguration
    /// ([`ErrorKind::is_misconfiguration`](crate::ErrorKind::is_misconfiguration))
    /// from an outage. The memory backend is always ready.
    ///
    /// ```
    /// use ratelimit_core::Limiter;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::from_env()?;
    /// limiter.ping().await?;
    /// # Ok::<(), ratelimit_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn ping(&self) -> Result<(), Error> {
        self.inner.backend.ping().await
    }

    /// The decision a request of `cost` from `key` would get now, with
    /// nothing consumed or written (on Redis, one script call that decides
    /// and writes nothing): for operators and dashboards, not for the
    /// request path. A backend fault is an `Err`; no failure policy applies.
    ///
    /// ```
    /// use ratelimit_core::{Limiter, Quota};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::memory();
    /// let quota = Quota::per_minute(3)?;
    /// limiter.acquire(&quota, "user:7", 3).await.unwrap();
    /// let seen = limiter.inspect(&quota, "user:7", 1).await?;
    /// assert!(!seen.allowed && seen.remaining == 0);
    /// limiter.reset("user:7").await?;
    /// assert_eq!(limiter.inspect(&quota, "user:7", 1).await?.remaining, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn inspect(&self, quota: &Quota, key: &str, cost: u64) -> Result<Decision, Error> {
        if cost > quota.capacity() {
            return Err(Error::CostExceedsCapacity {
                cost,
                capacity: quota.capacity(),
            });
        }
        self.inner.backend.peek(quota, key, cost).await
    }

    /// Gives `key` its whole quota back, under any quota: deletes its state
    /// in the backend, and forgets what this limiter keeps of it in process
    /// (cached denials, leased tokens). Other instances' deny caches hold
    /// their denials of the key until they expire (at most their
    /// `retry_after`). A backend fault is an `Err`.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        self.inner.backend.reset(key).await?;
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(key);
        }
        self.inner.leases.remove(key);
        Ok(())
    }

    /// Decides several dimensions at one instant, all or nothing: either
    /// every dimension admits and each consumes, or none consumes. With no
    /// failure policy: a backend fault is an `Err`.
    ///
    /// The keys must be distinct; a cost above its capacity is
    /// [`Error::CostExceedsCapacity`].
    pub async fn decide_all(&self, dimensions: &[Dimension<'_>]) -> Result<Vec<Decision>, Error> {
        for (i, d) in dimensions.iter().enumerate() {
            if d.cost > d.quota.capacity() {
                return Err(Error::CostExceedsCapacity {
                    cost: d.cost,
                    capacity: d.quota.capacity(),
                });
            }
            if dimensions[..i].iter().any(|e| e.key == d.key) {
                return Err(Error::Config(format!(
                    "the key `{}` is given twice; each dimension needs a key of its own",
                    d.key
                )));
            }
        }
        let requests: Vec<(&Quota, &str, u64)> = dimensions
            .iter()
            .map(|d| (d.quota, d.key, d.cost))
            .collect();
        let backend = &self.inner.backend;
        if !backend.can_fail() {
            let decisions = backend.decide_all(&requests).await;
            answered_in_process().await;
            return decisions;
        }
        for d in dimensions {
            self.inner.leases.forget_other_quota(d.quota, d.key);
        }
        let cache = self.inner.deny_cache.as_ref();
        let asked: Option<Vec<_>> = cache.map(|cache| {
            let now = self.inner.cache_clock.now_micros();
            dimensions.iter().map(|d| cache.asked(d.key, now)).collect()
        });
        let result = self.guarded(backend.decide_all(&requests)).await;
        if let (Some(cache), Some(asked), Ok(decisions)) = (cache, asked, &result) {
            // A check that admitted consumed on every key. In one that was
            // denied, a dimension denied is denied on its own too; one that
            // admitted consumed nothing, or got its tokens back (across Redis
            // Cluster slots, by a refund), which may let a cached denial
            // succeed sooner: it is forgotten after the denials are learned,
            // since a `forget` keeps answers asked for before it out.
            let now = self.inner.cache_clock.now_micros();
            let all_admitted = decisions.iter().all(|d| d.allowed);
            for ((d, decision), asked) in dimensions.iter().zip(decisions).zip(asked) {
                if all_admitted || !decision.allowed {
                    cache.learn(d.quota, d.key, d.cost, asked, now, decision);
                }
            }
            if !all_admitted {
                for (d, decision) in dimensions.iter().zip(decisions) {
                    if decision.allowed {
                        cache.forget(d.key);
                    }
                }
            }
        }
        result
    }

    /// Takes tokens from several dimensions at once (say a user's, an IP's
    /// and a global quota), all or nothing: either every dimension admits
    /// and each consumes, or none consumes and the denial names the dimension
    /// that denied, with the longest `retry_after` among those that denied.
    /// A backend fault is handled by each dimension's [`FailurePolicy`]
    /// ([`Dimension::on_error`], else the limiter's), all or nothing: a
    /// dimension failing closed denies the check, dimensions with the local
    /// policy are decided together by the local limiter, and dimensions
    /// failing open admit. A dimension whose denial is in the deny cache
    /// denies the check with no backend call. A check that names one key twice can never
    /// be decided as written: it is denied as never admittable
    /// ([`DenialCause::CostExceedsCapacity`], `retry_after` of
    /// [`Duration::MAX`]) and logged as an error; [`decide_all`](Self::decide_all)
    /// reports it as [`Error::Config`].
    ///
    /// ```
    /// use ratelimit_core::{Dimension, Limiter, Quota};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::memory();
    /// let per_user = Quota::per_minute(10)?;
    /// let per_ip = Quota::per_minute(1)?;
    /// let check = |ip| [Dimension::new(&per_user, "user:7"), Dimension::new(&per_ip, ip)];
    /// limiter.check_all(&check("ip:1")).await.unwrap();
    /// let denied = limiter.check_all(&check("ip:1")).await.unwrap_err();
    /// assert_eq!(denied.key, "ip:1");
    /// // The user's quota was not touched by the denied call.
    /// let user = limiter.decide(&per_user, "user:7", 0).await?;
    /// assert_eq!(user.remaining, 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn check_all(
        &self,
        dimensions: &[Dimension<'_>],
    ) -> Result<Vec<Decision>, RateLimited> {
        self.check_all_as(dimensions, false).await
    }

    /// [`check_all`](Self::check_all) in shadow mode, for rolling a new limit
    /// out: decides and records as `check_all` does (the deny cache, the
    /// failure policies, all or nothing), but a would-be denial is counted as
    /// `shadow_denied` instead of `denied` (or `fallback_denied`) and
    /// returned as [`ShadowCheck::WouldDeny`], which the caller lets through.
    /// A would-be denial consumes nothing, as a denial does. A check that
    /// names one key twice is a `WouldDeny` too, counted as an `error`: it
    /// is the caller's mistake, and would be denied whatever the quotas.
    ///
    /// ```
    /// use ratelimit_core::{Dimension, Limiter, Quota, ShadowCheck};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::memory();
    /// let per_user = Quota::per_minute(10)?;
    /// let global = Quota::per_minute(1)?;
    /// let check = [
    ///     Dimension::new(&per_user, "user:7").rule("user"),
    ///     Dimension::new(&global, "global").rule("global"),
    /// ];
    /// assert!(matches!(limiter.check_all_shadow(&check).await, ShadowCheck::Admitted(_)));
    /// match limiter.check_all_shadow(&check).await {
    ///     ShadowCheck::WouldDeny(denied) => assert_eq!(denied.rule, Some("global")),
    ///     ShadowCheck::Admitted(_) => unreachable!("the global quota is spent"),
    /// }
    /// assert_eq!(limiter.stats().shadow_denied, 1);
    /// assert_eq!(limiter.stats().denied, 0);
    /// // Nothing was taken from the user by the would-be denial.
    /// assert_eq!(limiter.inspect(&per_user, "user:7", 1).await?.remaining, 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn check_all_shadow(&self, dimensions: &[Dimension<'_>]) -> ShadowCheck {
        match self.check_all_as(dimensions, true).await {
            Ok(decisions) => ShadowCheck::Admitted(decisions),
            Err(denied) => ShadowCheck::WouldDeny(denied),
        }
    }

    /// [`check_all`](Self::check_all), with denials counted as would-be
    /// denials when `shadow`.
    async fn check_all_as(
        &self,
        dimensions: &[Dimension<'_>],
        shadow: bool,
    ) -> Result<Vec<Decision>, RateLimited> {
        let rule = dimensions.first().map_or("", |d| d.rule);
        if let Some(denied) = self.cached_denial(dimensions, shadow).await {
            return Err(denied);
        }
        match self.decide_all(dimensions).await {
            Ok(decisions) if decisions.iter().all(|d| d.allowed) => {
                for d in dimensions {
                    self.inner.stats.record(d.rule, Outcome::Allowed);
                }
                Ok(decisions)
            }
            Ok(decisions) => {
                let (dimension, decision) = longest_denial(dimensions, &decisions)
                    .unwrap_or((&dimensions[0], &decisions[0]));
                Err(self.denied_by(dimension, decision, shadow))
            }
            Err(Error::CostExceedsCapacity { cost, capacity }) => {
                let dimension = dimensions
                    .iter()
                    .find(|d| d.cost == cost && d.quota.capacity() == capacity);
                let (key, rule) = dimension.map_or(("", rule), |d| (d.key, d.rule));
                let denied = RateLimited::new(key, capacity, 0, Duration::MAX)
                    .with_cause(DenialCause::CostExceedsCapacity { cost });
                Err(self.counted_denial(denied, rule, shadow))
            }
            Err(Error::Config(message)) => {
                // A caller's mistake, not a backend fault: never failed open.
                self.inner.stats.record(rule, Outcome::Error);
                tracing::error!(%message, "invalid multi-dimension check; denied");
                Err(RateLimited::new(
                    dimensions.first().map_or("", |d| d.key),
                    0,
                    0,
                    Duration::MAX,
                )
                .with_cause(DenialCause::CostExceedsCapacity { cost: 0 }))
            }
            Err(error) => {
                self.fall_back_all(dimensions, error, self.inner.failure_policy, shadow)
                    .await
            }
        }
    }

    /// The denial of a check of several dimensions by `dimension`, as
    /// decided in `decision`: counted (as a would-be denial when `shadow`)
    /// and logged.
    fn denied_by(
        &self,
        dimension: &Dimension<'_>,
        decision: &Decision,
        shadow: bool,
    ) -> RateLimited {
        let denied = RateLimited::new(
            dimension.key,
            decision.limit,
            decision.remaining,
            decision.retry_after,
        );
        self.counted_denial(denied, dimension.rule, shadow)
    }

    /// `denied`, named after `rule` (when it has a name), counted under it
    /// as a denial (a would-be denial when `shadow`), and logged.
    fn counted_denial(&self, denied: RateLimited, rule: &'static str, shadow: bool) -> RateLimited {
        let denied = if rule.is_empty() {
            denied
        } else {
            denied.with_rule(rule)
        };
        self.inner
            .stats
            .record(rule, Outcome::Denied.shadowed(shadow));
        self.log_denial(&denied, shadow);
        denied
    }

    /// A check of several dimensions denied by the deny cache: the longest
    /// live cached denial among its dimensions, if any. Such a check could
    /// not be admitted before that denial ends, whatever the others hold.
    async fn cached_denial(
        &self,
        dimensions: &[Dimension<'_>],
        shadow: bool,
    ) -> Option<RateLimited> {
        let cache = self.inner.deny_cache.as_ref()?;
        let now = self.inner.cache_clock.now_micros();
        let (dimension, decision) = dimensions
            .iter()
            .filter_map(|d| Some((d, cache.peek(d.quota, d.key, d.cost, now)?)))
            .max_by_key(|(_, decision)| decision.retry_after)?;
        self.inner.stats.cache_hit();
        answered_in_process().await;
        Some(self.denied_by(dimension, &decision, shadow))
    }

    /// Whether `self` and `other` are clones of one limiter.
    #[doc(hidden)]
    pub fn __same(&self, other: &Limiter) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Takes `cost` tokens from `key`'s quota, or says why not.
    ///
    /// A denial by the quota is `Err(RateLimited)` with the exact `retry_after`.
    /// A backend fault is handled by the [`FailurePolicy`]: allowed (the
    /// decision has `fallback == true`), denied with
    /// [`DenialCause::BackendUnavailable`], or decided by the local limiter.
    /// A cost above the capacity is denied with
    /// [`DenialCause::CostExceedsCapacity`] and `retry_after` of
    /// [`Duration::MAX`].
    pub async fn acquire(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, RateLimited> {
        self.acquire_with(quota, key, cost, &CallOptions::default())
            .await
    }

    /// [`acquire`](Self::acquire) with a rule name, a failure policy and shadow
    /// mode for this call.
    pub async fn acquire_with(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        options: &CallOptions,
    ) -> Result<Decision, RateLimited> {
        let span = tracing::debug_span!(
            "ratelimit.acquire",
            rule = options.rule,
            key,
            cost,
            backend = self.inner.backend.name()
        );
        let result = if options.lease > cost
            && self.inner.backend.can_fail()
            && !matches!(
                quota.algorithm(),
                Algorithm::LeakyBucket | Algorithm::SlidingLog
            ) {
            self.decide_leased(quota, key, cost, options.lease)
                .instrument(span)
                .await
        } else {
            self.decide_quietly(quota, key, cost).instrument(span).await
        };
        let (result, outcome) = match result {
            Ok(decision) if decision.allowed => (Ok(decision), Outcome::Allowed),
            Ok(decision) => (
                Err(RateLimited::new(
                    key,
                    decision.limit,
                    decision.remaining,
                    decision.retry_after,
                )),
                Outcome::Denied,
            ),
            Err(Error::CostExceedsCapacity { cost, capacity }) => (
                Err(RateLimited::new(key, capacity, 0, Duration::MAX)
                    .with_cause(DenialCause::CostExceedsCapacity { cost })),
                Outcome::Denied,
            ),
            Err(error) => {
                let policy = options.on_error.unwrap_or(self.inner.failure_policy);
                self.fall_back(quota, key, cost, error, policy).await
            }
        };
        let denied = match result {
            Ok(decision) => {
                self.inner.stats.record(options.rule, outcome);
                return Ok(decision);
            }
            Err(denied) => denied,
        };
        let denied = if options.rule.is_empty() {
            denied
        } else {
            denied.with_rule(options.rule)
        };
        if options.shadow {
            self.inner.stats.record(options.rule, Outcome::ShadowDenied);
            self.log_denial(&denied, true);
            return Ok(Decision {
                allowed: false,
                limit: denied.limit,
                remaining: denied.remaining,
                retry_after: denied.retry_after,
                reset_after: Duration::ZERO,
                delay: Duration::ZERO,
                fallback: !matches!(
                    denied.cause,
                    DenialCause::Quota | DenialCause::CostExceedsCapacity { .. }
                ),
                debt: None,
            });
        }
        self.inner.stats.record(options.rule, outcome);
        self.log_denial(&denied, false);
        Err(denied)
    }

    /// Serves `cost` from a live lease, or leases up to `lease` tokens from
    /// the backend (falling back to `cost` alone when that many are not there).
    async fn decide_leased(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> Result<Decision, Error> {
        let now = self.inner.cache_clock.now_micros();
        if let Some(left) = self.inner.leases.take(quota, key, cost, now) {
            answered_in_process().await;
            return Ok(Decision::from_micros(true, quota.capacity(), left, 0, 0, 0));
        }
        let lease = lease.min(quota.capacity()).max(cost);
        let decision = self.decide_quietly(quota, key, lease).await?;
        if decision.allowed {
            // Cut so the lease never serves a token the algorithm could not
            // have admitted when it was counted (see `lease`): `now` is read
            // before the call, so these end no later than they should.
            let mut expires = now.saturating_add(self.inner.lease_ttl.as_micros() as u64);
            let reset = now.saturating_add(decision.reset_after.as_micros() as u64);
            let window = quota.window().map_or(0, |w| w.as_micros() as u64);
            let owed_until = match quota.algorithm() {
                Algorithm::FixedWindow => {
                    expires = expires.min(reset);
                    None
                }
                // Its reset is a window after the end of the current one.
                Algorithm::SlidingWindow => {
                    expires = expires.min(reset.saturating_sub(window));
                    None
                }
                _ => Some(reset),
            };
            self.inner
                .leases
                .put(quota, key, lease - cost, now, expires, owed_until);
            return Ok(decision);
        }
        if lease == cost {
            return Ok(decision);
        }
        self.decide_quietly(quota, key, cost).await
    }

    /// Logs one denial in `denial_log_every`: a flood of denials must not
    /// flood the logs.
    fn log_denial(&self, denied: &RateLimited, shadow: bool) {
        let every = self.inner.denial_log_every;
        if every == 0 || !self.inner.stats.denials_seen().is_multiple_of(every) {
            return;
        }
        tracing::info!(
            rule = denied.rule.unwrap_or(""),
            key = %denied.key,
            retry_after = ?denied.retry_after,
            cause = ?denied.cause,
            shadow,
            sampled_one_in = every,
            "rate limited"
        );
    }

    fn warn_throttled(&self, key: &str, error: &Error, policy: FailurePolicy) {
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
            let backend = self.inner.backend.name();
            let kind = error.kind();
            if kind.is_misconfiguration() {
                tracing::error!(
                    backend,
                    key,
                    ?policy,
                    %kind,
                    %error,
                    "rate limit backend refuses this limiter's configuration; applying the failure \
                     policy until it is fixed (logged at most once a second)"
                );
            } else {
                tracing::warn!(
                    backend,
                    key,
                    ?policy,
                    %kind,
                    %error,
                    "rate limit backend failed; applying the failure policy (logged at most once a second)"
                );
            }
        }
    }
}

/// Among the dimensions that denied, the one whose `retry_after` is longest:
/// the whole check cannot succeed before it.
fn longest_denial<'a, 'd>(
    dimensions: &'a [Dimension<'d>],
    decisions: &'a [Decision],
) -> Option<(&'a Dimension<'d>, &'a Decision)> {
    dimensions
        .iter()
        .zip(decisions)
        .filter(|(_, d)| !d.allowed)
        .max_by_key(|(_, d)| d.retry_after)
}

/// The default configuration is valid; this is never reached.
#[cold]
fn unreachable_config() -> Limiter {
    Limiter {
        inner: Arc::new(Inner::new(
            Backend::Memory(MemoryBackend::bounded(
                Arc::new(MonotonicClock::new()),
                DEFAULT_MEMORY_MAX_KEYS,
            )),
            &LimiterBuilder::default(),
            Arc::new(MonotonicClock::new()),
        )),
    }
}

impl Inner {
    fn new(backend: Backend, builder: &LimiterBuilder, clock: Arc<dyn Clock>) -> Self {
        let deny_cache = (builder.deny_cache_max_keys > 0 && backend.can_fail())
            .then(|| DenyCache::new(builder.deny_cache_max_keys));
        let denial_log_every = if builder.denial_log_sample <= 0.0 {
            0
        } else {
            (1.0 / builder.denial_log_sample).round().max(1.0) as u64
        };
        Inner {
            backend,
            failure_policy: builder.failure_policy,
            closed_retry_after: builder.closed_retry_after,
            local_share: builder.local_share,
            local: MemoryBackend::bounded(clock.clone(), builder.local_max_keys),
            breaker: Breaker::new(builder.breaker),
            deny_cache,
            leases: Leases::new(builder.deny_cache_max_keys.max(1)),
            lease_ttl: builder.lease_ttl,
            cache_clock: clock,
            timeout: builder.timeout,
            rules: crate::rules::Rules::default(),
            stats: Stats::default(),
            denial_log_every,
            last_warning: AtomicU64::new(0),
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
///     .failure_policy(FailurePolicy::Local)
///     .local_share(0.25) // four instances share each quota while Redis is down
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
    closed_retry_after: Duration,
    local_share: f64,
    local_max_keys: usize,
    memory_max_keys: usize,
    breaker: BreakerConfig,
    denial_log_sample: f64,
    deny_cache_max_keys: usize,
    lease_ttl: Duration,
    tls: crate::tls::TlsConfig,
}

// Without the `redis` (or `cluster`) feature an address is only refused at
// `build`, never read.
#[cfg_attr(not(all(feature = "redis", feature = "cluster")), allow(dead_code))]
enum BackendChoice {
    Memory,
    Redis(String),
    Cluster(Vec<String>),
    Sentinel {
        master: String,
        sentinels: Vec<String>,
    },
}

impl Default for LimiterBuilder {
    fn default() -> Self {
        Self {
            backend: BackendChoice::Memory,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            clock: None,
            failure_policy: FailurePolicy::default(),
            closed_retry_after: Duration::from_secs(1),
            local_share: 1.0,
            local_max_keys: 100_000,
            memory_max_keys: DEFAULT_MEMORY_MAX_KEYS,
            breaker: BreakerConfig::default(),
            denial_log_sample: 0.01,
            deny_cache_max_keys: 100_000,
            lease_ttl: Duration::from_secs(1),
            tls: crate::tls::TlsConfig::default(),
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
    /// `redis://user:password@host`, `rediss://...` for TLS (see
    /// [`tls`](Self::tls)), `redis+unix:///path`), shared by every instance.
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.backend = BackendChoice::Redis(url.into());
        self
    }

    /// Keeps state in the Redis master that Redis Sentinel names `master`,
    /// given any of the Sentinels (`redis://host:26379`). After a failed
    /// call the Sentinels are asked again (at most every 100 ms) where the
    /// master is, so a failover is followed within about the Sentinels' own
    /// `down-after-milliseconds` plus their election; meanwhile the failure
    /// policy answers. The master's connections take the first URL's user,
    /// password and database.
    ///
    /// ```
    /// use ratelimit_core::Limiter;
    ///
    /// let limiter = Limiter::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .build()?; // connects on the first decision
    /// assert_eq!(limiter.backend_name(), "redis");
    /// # Ok::<(), ratelimit_core::Error>(())
    /// ```
    pub fn sentinel<I, S>(mut self, master: impl Into<String>, sentinels: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.backend = BackendChoice::Sentinel {
            master: master.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        };
        self
    }

    /// Keeps state in a Redis Cluster, given any of its nodes
    /// (`redis://host:port`); the client discovers the others and follows
    /// failovers. Keys that one check names together should share a hash tag
    /// (`"{user:<id>}:..."`) so they are decided by one script call.
    pub fn cluster<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.backend = BackendChoice::Cluster(nodes.into_iter().map(Into::into).collect());
        self
    }

    /// Certificates for a `rediss://` URL (standalone or cluster): a private
    /// CA to trust, a client certificate for mutual TLS. Without them a
    /// `rediss://` URL trusts the platform's roots. See [`TlsConfig`](crate::TlsConfig).
    pub fn tls(mut self, tls: crate::tls::TlsConfig) -> Self {
        self.tls = tls;
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

    /// The `retry_after` of a denial under [`FailurePolicy::Closed`] (default 1 s).
    pub fn closed_retry_after(mut self, retry_after: Duration) -> Self {
        self.closed_retry_after = retry_after;
        self
    }

    /// The share of each quota the local fallback limiter grants this
    /// instance, in (0, 1] (default 1: each instance alone may use the whole
    /// quota). With N instances, `1.0 / N` keeps the total near the quota.
    pub fn local_share(mut self, share: f64) -> Self {
        self.local_share = share;
        self
    }

    /// The most keys the local fallback limiter keeps (default 100,000): under
    /// more distinct keys it forgets those nearest to refilled.
    pub fn local_max_keys(mut self, keys: usize) -> Self {
        self.local_max_keys = keys;
        self
    }

    /// The most keys the memory backend keeps (default 1,000,000, about
    /// 150 MiB at most). Keys whose bucket is full again are dropped first,
    /// as Redis expires them, which changes no decision; beyond the bound,
    /// the keys nearest to refilled are forgotten, and a forgotten key is
    /// admitted again as a fresh one. So a flood of distinct keys (one per
    /// client address, say) under-limits the keys it pushes out instead of
    /// growing the process until it is killed.
    ///
    /// ```
    /// use ratelimit_core::{Limiter, Quota};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().memory_max_keys(10_000).build()?;
    /// let hourly = Quota::per_hour(1)?;
    /// for ip in 0..20_000 {
    ///     limiter.acquire(&hourly, &format!("ip:{ip}"), 1).await.unwrap();
    /// }
    /// // The newest key is still known, and still spent.
    /// assert!(limiter.acquire(&hourly, "ip:19999", 1).await.is_err());
    /// # Ok::<(), ratelimit_core::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn memory_max_keys(mut self, keys: usize) -> Self {
        self.memory_max_keys = keys;
        self
    }

    /// The most keys the local deny cache keeps (default 100,000; 0 turns
    /// it off). What the backend's replies teach of a key (a bucket's debt,
    /// a fixed window's count, a sliding algorithm's denial) answers the
    /// requests it cannot admit yet in process, with no backend call, with
    /// the figures the backend would give at that instant (see [`Decision`]
    /// for what a cached answer promises). When a key may admit only one more
    /// request, one caller asks the backend and the others wait for its
    /// answer (at most the [`timeout`](Self::timeout)). Under more distinct
    /// spent keys than this, the cache forgets some, which only costs
    /// backend calls.
    pub fn deny_cache_max_keys(mut self, keys: usize) -> Self {
        self.deny_cache_max_keys = keys;
        self
    }

    /// How long leased tokens ([`CallOptions::lease`]) may be served before
    /// the rest are dropped (default 1 s): the bound on how stale a lease's
    /// view of the quota can be.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The circuit breaker's settings.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// The share of denials logged at `info` (default 0.01, one in a
    /// hundred; 0 logs none). Every denial is counted regardless.
    pub fn denial_log_sample(mut self, share: f64) -> Self {
        self.denial_log_sample = share;
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
        if !(self.local_share > 0.0 && self.local_share <= 1.0) {
            return Err(Error::Config(format!(
                "the local share must be in (0, 1], such as 0.25 for one of four instances; got {}",
                self.local_share
            )));
        }
        if !(0.0..=1.0).contains(&self.denial_log_sample) {
            return Err(Error::Config(format!(
                "the denial log sample must be in [0, 1], such as 0.01; got {}",
                self.denial_log_sample
            )));
        }
        if self.local_max_keys == 0 {
            return Err(Error::Config(
                "the local limiter must keep at least one key".into(),
            ));
        }
        if self.memory_max_keys == 0 {
            return Err(Error::Config(
                "the memory backend must keep at least one key; the default is 1,000,000".into(),
            ));
        }
        let clock: Arc<dyn Clock> = self
            .clock
            .clone()
            .unwrap_or_else(|| Arc::new(MonotonicClock::new()));
        let backend = match &self.backend {
            BackendChoice::Memory => {
                Backend::Memory(MemoryBackend::bounded(clock.clone(), self.memory_max_keys))
            }
            #[cfg(feature = "redis")]
            BackendChoice::Redis(url) => Backend::Redis(Box::new(crate::backend::redis::RedisBackend::new(
                crate::backend::redis::Endpoint::Fixed(crate::backend::redis::open_client(url, &self.tls)?),
                self.prefix.clone(),
                self.timeout,
                self.clock.clone(),
            ))),
            #[cfg(feature = "redis")]
            BackendChoice::Sentinel { master, sentinels } => Backend::Redis(Box::new(crate::backend::redis::RedisBackend::new(
                crate::backend::redis::Endpoint::sentinel(master, sentinels)?,
                self.prefix.clone(),
                self.timeout,
                self.clock.clone(),
            ))),
            #[cfg(not(feature = "redis"))]
            BackendChoice::Sentinel { .. } => {
                return Err(Error::Config(
                    "Redis Sentinel was given but the `redis` feature is off; enable it in Cargo.toml"
                        .into(),
                ))
            }
            #[cfg(feature = "cluster")]
            BackendChoice::Cluster(nodes) => Backend::Cluster(Box::new(crate::backend::cluster::ClusterBackend::new(
                nodes,
                &self.tls,
                self.prefix.clone(),
                self.timeout,
                self.clock.clone(),
                self.breaker,
            )?)),
            #[cfg(not(feature = "cluster"))]
            BackendChoice::Cluster(_) => {
                return Err(Error::Config(
                    "Redis Cluster nodes were given but the `cluster` feature is off; enable it in Cargo.toml".into(),
                ))
            }
            #[cfg(not(feature = "redis"))]
            BackendChoice::Redis(_) => {
                return Err(Error::Config(
                    "a Redis URL was given but the `redis` feature is off; enable it in Cargo.toml"
                        .into(),
                ))
            }
        };
        // The local fallback runs on this process's clock, whatever the backend's.
        let local_clock: Arc<dyn Clock> = match &self.clock {
            Some(clock) => clock.clone(),
            None => Arc::new(MonotonicClock::new()),
        };
        Ok(Limiter {
            inner: Arc::new(Inner::new(backend, &self, local_clock)),
        })
    }
}

/// Called when a decision was answered without waiting on anything (the
/// memory backend, a cached denial, a leased token): takes a unit of the
/// task's Tokio budget, and yields once the budget is spent, as Tokio's own
/// channels and sockets do. Without it, a task calling in a loop on a denied
/// key would keep its thread until the denial expires, and every other task
/// there (those waiting on Redis replies too) would wait as long. Outside a
/// Tokio runtime it returns at once.
async fn answered_in_process() {
    tokio::task::consume_budget().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_keys(limiter: &Limiter) -> usize {
        match &limiter.inner.backend {
            Backend::Memory(memory) => memory.len(),
            #[allow(unreachable_patterns)]
            _ => unreachable!("a memory limiter"),
        }
    }

    #[tokio::test]
    async fn the_memory_backend_holds_at_most_its_bound_under_a_flood_of_distinct_keys() {
        let limiter = Limiter::builder().memory_max_keys(5_000).build().unwrap();
        // One token an hour: no key refills during the test, so no key can
        // be dropped as full; only the bound keeps memory in check.
        let hourly = Quota::per_hour(1).unwrap();
        let mut peak = 0;
        for ip in 0..100_000 {
            limiter
                .acquire(&hourly, &format!("ip:{ip}"), 1)
                .await
                .unwrap();
            peak = peak.max(held_keys(&limiter));
        }
        assert!(peak <= 5_000, "100,000 distinct keys held {peak}");
        assert!(
            limiter.acquire(&hourly, "ip:99999", 1).await.is_err(),
            "the newest key was forgotten"
        );
    }

    #[test]
    fn the_default_memory_limiter_is_bounded() {
        let limiter = Limiter::memory();
        let Backend::Memory(memory) = &limiter.inner.backend else {
            unreachable!("a memory limiter")
        };
        assert_eq!(memory.max_keys(), DEFAULT_MEMORY_MAX_KEYS);
        let built = Limiter::builder().build().unwrap();
        let Backend::Memory(memory) = &built.inner.backend else {
            unreachable!("a memory limiter")
        };
        assert_eq!(memory.max_keys(), DEFAULT_MEMORY_MAX_KEYS);
        assert!(matches!(
            Limiter::builder().memory_max_keys(0).build(),
            Err(Error::Config(_))
        ));
    }
}
