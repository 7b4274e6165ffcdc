//! The limiter's configuration: which backend, how to reach it, and how to
//! behave when it fails.

use std::sync::Arc;
use std::time::Duration;

use super::{
    AtomicU64, Breaker, DenyCache, FailurePolicy, Inner, Leases, Limiter, Stats,
    DEFAULT_MEMORY_MAX_KEYS, DEFAULT_PREFIX, DEFAULT_TIMEOUT,
};
use crate::backend::memory::MemoryBackend;
use crate::backend::Backend;
use crate::breaker::BreakerConfig;
use crate::clock::{Clock, MonotonicClock};
use crate::error::{ConfigError, Error};

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
    /// password and database; each Sentinel its own URL's user and password
    /// (the same in every URL when certificates are given). With
    /// `rediss://` Sentinel URLs (all of them, and the `tls` feature), the
    /// Sentinels and the master are reached over TLS, trusting the
    /// certificates given to [`tls`](Self::tls).
    ///
    /// ```
    /// use ratelimit_core::{ConfigError, Error, Limiter};
    ///
    /// let limiter = Limiter::builder()
    ///     .sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .build()?; // connects on the first decision
    /// assert_eq!(limiter.backend_name(), "redis");
    ///
    /// # #[cfg(feature = "tls")] {
    /// let half_tls = Limiter::builder()
    ///     .sentinel("mymaster", ["rediss://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .build();
    /// assert!(matches!(half_tls, Err(Error::Config(ConfigError::Unsupported { .. }))));
    /// # }
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

    /// Certificates for `rediss://` URLs (standalone, Sentinel, cluster): a
    /// private CA to trust, a client certificate for mutual TLS. Without them a
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

    /// The bound on how long a check (or a refund, an inspection, a reset)
    /// waits for the backend, however many calls it makes (default 100 ms).
    /// One that takes longer fails with [`Error::Timeout`] and the failure
    /// policy applies. Connections are made within timeouts of their own,
    /// and so are the second call of a leased request whose lease was
    /// refused and the shadow half of a check mixing enforced and shadow
    /// requests: see the failures chapter of the guide.
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

    /// The `retry_after` of a denial under [`FailurePolicy::Closed`] (default
    /// 1 s), above zero: a denial that says "retry now" while the backend is
    /// down would send every client straight back.
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
    /// more distinct keys it forgets those nearest to refilled (see
    /// [`memory_max_keys`](Self::memory_max_keys) for what that allows).
    pub fn local_max_keys(mut self, keys: usize) -> Self {
        self.local_max_keys = keys;
        self
    }

    /// The most keys the memory backend keeps (default 1,000,000, about
    /// 150 MiB at most, and 8 bytes more for each admission a sliding log
    /// holds). Keys whose bucket is full again are dropped first,
    /// as Redis expires them, which changes no decision; beyond the bound,
    /// the keys nearest to refilled are forgotten, and a forgotten key is
    /// admitted again as a fresh one. So a flood of distinct keys (one per
    /// client address, say) under-limits the keys it pushes out instead of
    /// growing the process until it is killed. A caller who can send about
    /// this many distinct keys can so win a spent key's quota back (for a
    /// window, the keys nearest to refilled are those whose window ends
    /// first, however spent): set the bound above the distinct keys a
    /// window sees, or keep the state in Redis.
    ///
    /// ```
    /// use ratelimit_core::{Limiter, Quota, Request};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::builder().memory().memory_max_keys(10_000).build()?;
    /// let hourly = Quota::per_hour(1)?;
    /// for ip in 0..20_000 {
    ///     let key = format!("ip:{ip}");
    ///     limiter.check(Request::new(&hourly, &key)).await.unwrap();
    /// }
    /// // The newest key is still known, and still spent.
    /// assert!(limiter.check(Request::new(&hourly, "ip:19999")).await.is_err());
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
    /// the figures the backend would give at that instant (see [`Decision`](crate::Decision)
    /// for what a cached answer promises). When a key may admit only one more
    /// request, one caller asks the backend and the others wait for its
    /// answer (within the check's [`timeout`](Self::timeout), which its own
    /// call, if it then makes one, shares). Under more distinct
    /// spent keys than this, the cache forgets some, which only costs
    /// backend calls.
    pub fn deny_cache_max_keys(mut self, keys: usize) -> Self {
        self.deny_cache_max_keys = keys;
        self
    }

    /// How long leased tokens ([`Request::lease`](super::Request::lease)) may be served before
    /// the rest are dropped (default 1 s): the bound on how stale a lease's
    /// view of the quota can be. Zero (or less than a microsecond) turns
    /// leases off: each request is decided on its own.
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
            return Err(ConfigError::NotPositive { setting: "timeout" }.into());
        }
        if self.prefix.contains(['{', '}']) {
            return Err(ConfigError::HashTagInPrefix {
                prefix: self.prefix,
            }
            .into());
        }
        if !(self.local_share > 0.0 && self.local_share <= 1.0) {
            return Err(ConfigError::OutOfRange {
                setting: "local_share",
                range: "(0, 1]",
                example: "0.25 for one of four instances",
                value: self.local_share,
            }
            .into());
        }
        if !(0.0..=1.0).contains(&self.denial_log_sample) {
            return Err(ConfigError::OutOfRange {
                setting: "denial_log_sample",
                range: "[0, 1]",
                example: "0.01",
                value: self.denial_log_sample,
            }
            .into());
        }
        if self.local_max_keys == 0 {
            return Err(ConfigError::NotPositive {
                setting: "local_max_keys",
            }
            .into());
        }
        if self.memory_max_keys == 0 {
            return Err(ConfigError::NotPositive {
                setting: "memory_max_keys",
            }
            .into());
        }
        // A denial that says "retry now" while the backend is down sends
        // every client straight back (`Retry-After: 0`).
        if self.closed_retry_after.is_zero() {
            return Err(ConfigError::NotPositive {
                setting: "closed_retry_after",
            }
            .into());
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
            BackendChoice::Redis(url) => {
                Backend::Redis(Box::new(crate::backend::redis::RedisBackend::new(
                    crate::backend::redis::Endpoint::Fixed(crate::backend::redis::open_client(
                        url, &self.tls,
                    )?),
                    self.prefix.clone(),
                    self.timeout,
                    self.clock.clone(),
                )))
            }
            #[cfg(feature = "redis")]
            BackendChoice::Sentinel { master, sentinels } => {
                Backend::Redis(Box::new(crate::backend::redis::RedisBackend::new(
                    crate::backend::redis::Endpoint::sentinel(master, sentinels, &self.tls)?,
                    self.prefix.clone(),
                    self.timeout,
                    self.clock.clone(),
                )))
            }
            #[cfg(not(feature = "redis"))]
            BackendChoice::Sentinel { .. } => {
                return Err(ConfigError::FeatureOff {
                    what: "Redis Sentinel",
                    feature: "redis",
                }
                .into())
            }
            #[cfg(feature = "cluster")]
            BackendChoice::Cluster(nodes) => {
                Backend::Cluster(Box::new(crate::backend::cluster::ClusterBackend::new(
                    nodes,
                    &self.tls,
                    self.prefix.clone(),
                    self.timeout,
                    self.clock.clone(),
                    self.breaker,
                )?))
            }
            #[cfg(not(feature = "cluster"))]
            BackendChoice::Cluster(_) => {
                return Err(ConfigError::FeatureOff {
                    what: "Redis Cluster",
                    feature: "cluster",
                }
                .into())
            }
            #[cfg(not(feature = "redis"))]
            BackendChoice::Redis(_) => {
                return Err(ConfigError::FeatureOff {
                    what: "a Redis URL",
                    feature: "redis",
                }
                .into())
            }
        };
        // The local fallback, the deny cache and refunds run on this
        // process's clock (the memory backend's own), whatever the backend's.
        Ok(Limiter {
            inner: Arc::new(Inner::new(backend, &self, clock)),
        })
    }
}

impl Inner {
    pub(super) fn new(backend: Backend, builder: &LimiterBuilder, clock: Arc<dyn Clock>) -> Self {
        let rules = crate::rules::Rules::default();
        let deny_cache = (builder.deny_cache_max_keys > 0 && backend.can_fail()).then(|| {
            DenyCache::new(builder.deny_cache_max_keys, builder.timeout).following(rules.changes())
        });
        let denial_log_every = if builder.denial_log_sample <= 0.0 {
            0
        } else {
            (1.0 / builder.denial_log_sample).round().max(1.0) as u64
        };
        /// The next limiter's number.
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Inner {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            backend,
            failure_policy: builder.failure_policy,
            closed_retry_after: builder.closed_retry_after,
            local_share: builder.local_share,
            local: MemoryBackend::bounded(clock.clone(), builder.local_max_keys),
            breaker: Breaker::new(builder.breaker, builder.timeout),
            deny_cache,
            leases: Leases::new(crate::lease::MAX_KEYS),
            resets: super::refund::Resets::new(),
            refunded: super::refund::Refunded::new(),
            lease_ttl: builder.lease_ttl,
            cache_clock: clock,
            timeout: builder.timeout,
            rules,
            stats: Stats::default(),
            denial_log_every,
            last_warning: AtomicU64::new(0),
            last_duplicate: AtomicU64::new(0),
            last_lost_refund: AtomicU64::new(0),
        }
    }
}
