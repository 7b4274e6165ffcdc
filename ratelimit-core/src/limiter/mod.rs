//! The limiter: one request pipeline. A check goes through the policy step
//! (`policy.rs`: invalid requests, shadow mode, the failure policy, counting),
//! the round trip (`round_trip.rs`: the deny cache, leases, the circuit
//! breaker, the backend), and reporting (`report.rs`); `builder.rs`
//! configures it and `request.rs` holds what callers ask and get.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::memory::MemoryBackend;
use crate::backend::{Backend, Deadline};
use crate::breaker::{Breaker, CircuitState};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
use crate::denial::RateLimited;
use crate::deny_cache::DenyCache;
use crate::error::{ConfigError, Error};
use crate::lease::Leases;
use crate::metrics::{Stats, StatsSnapshot};
use crate::quota::Quota;

mod builder;
mod policy;
mod refund;
pub(crate) mod report;
mod request;
mod round_trip;

pub use builder::LimiterBuilder;
pub use policy::FailurePolicy;
pub use request::{Admitted, OwnedAdmitted, Request};

/// The default key prefix, so limiter keys are easy to find and to keep apart
/// from an application's own keys.
pub const DEFAULT_PREFIX: &str = "rl:";

/// The default bound on the keys the memory backend keeps
/// ([`LimiterBuilder::memory_max_keys`]).
pub const DEFAULT_MEMORY_MAX_KEYS: usize = 1_000_000;

/// The default bound on every backend call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// A rate limiter: a backend plus how to use it. Cheap to clone; clones share
/// the backend (and the Redis connection), the circuit breaker and the counters.
///
/// ```
/// use ratelimit_core::{Limiter, Quota, Request};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let limiter = Limiter::memory();
/// let quota = Quota::per_second(2)?;
/// assert!(limiter.check(Request::new(&quota, "user:7")).await.is_ok());
/// assert!(limiter.check(Request::new(&quota, "user:7")).await.is_ok());
/// let denied = limiter.check(Request::new(&quota, "user:7")).await.unwrap_err();
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
    /// Unique in the process (see [`request::Origin`]).
    id: u64,
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
    /// How long one operation waits for the backend, in all (see
    /// [`Deadline`]), its wait for another caller's call on the same key
    /// included.
    timeout: Duration,
    /// Tokens leased from the backend, served in process.
    leases: Leases,
    /// When keys were last reset, so refunds of older admissions give
    /// nothing back.
    resets: refund::Resets,
    /// Bucket refunds made, so later ones give back no refilled token.
    refunded: refund::Refunded,
    lease_ttl: Duration,
    /// Named rules, changeable while running.
    rules: crate::rules::Rules,
    stats: Stats,
    /// Log one denial in this many (0: none).
    denial_log_every: u64,
    /// Second (since the epoch) of the last backend-failure warning, so an
    /// outage logs about once a second rather than once per call.
    last_warning: AtomicU64,
    /// When a check that names a key twice was last logged.
    last_duplicate: AtomicU64,
    /// When a refund the backend did not take was last logged.
    last_lost_refund: AtomicU64,
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
            let master = var("REDIS_SENTINEL_MASTER").ok_or(Error::Config(
                ConfigError::MissingVariable {
                    set: "REDIS_SENTINELS",
                    missing: "REDIS_SENTINEL_MASTER",
                    what: "the master's name, such as `mymaster`",
                },
            ))?;
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

    /// The backend's name, as metrics and logs give it: `"memory"`, `"redis"`
    /// (one Redis, or a master named by Sentinels) or `"redis-cluster"`.
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

    /// Decides one request or several (a slice, an array or a `Vec` of
    /// [`Request`]s) at one instant, all or nothing: either every request
    /// admits and each takes its cost, or none takes anything and the
    /// denial names the request that denied, with the longest `retry_after`
    /// among those that denied.
    ///
    /// - A denial by a quota is `Err(RateLimited)` with the exact
    ///   `retry_after`.
    /// - A backend fault is answered by each request's [`FailurePolicy`]
    ///   ([`Request::on_error`], else the limiter's), all or nothing: a
    ///   request failing closed denies the check
    ///   ([`DenialCause::BackendUnavailable`](crate::DenialCause::BackendUnavailable));
    ///   the requests with the local policy are decided together by the
    ///   local limiter; those failing open admit, with
    ///   [`Decision::fallback`] set.
    /// - A cost above its capacity can never be admitted: it is denied with
    ///   [`DenialCause::CostExceedsCapacity`](crate::DenialCause::CostExceedsCapacity)
    ///   and a `retry_after` of [`Duration::MAX`]. A check naming one key
    ///   twice is denied with [`DenialCause::DuplicateKey`](crate::DenialCause::DuplicateKey)
    ///   and logged as an error.
    /// - A request whose denial is in the deny cache is denied with no
    ///   backend call.
    /// - Requests in [shadow mode](Request::shadow) never deny: their
    ///   would-be denial is in [`Admitted::would_deny`].
    ///
    /// ```
    /// use ratelimit_core::{Limiter, Quota, Request};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::memory();
    /// let per_user = Quota::per_minute(10)?;
    /// let per_ip = Quota::per_minute(1)?;
    /// // One limit.
    /// limiter.check(Request::new(&per_user, "user:7")).await?;
    /// // Several, all or nothing.
    /// let both = |ip| [Request::new(&per_user, "user:7"), Request::new(&per_ip, ip)];
    /// limiter.check(both("ip:1")).await?;
    /// let denied = limiter.check(both("ip:1")).await.unwrap_err();
    /// assert_eq!(denied.key, "ip:1");
    /// // The user's quota was not touched by the denied check.
    /// assert_eq!(limiter.inspect(&per_user, "user:7", 0).await?.remaining, 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn check<'a>(
        &self,
        requests: impl AsRef<[Request<'a>]>,
    ) -> Result<Admitted<'a>, RateLimited> {
        let requests = requests.as_ref();
        if let Some(memory) = self.inner.backend.memory() {
            // The memory backend answers at once: the budget is taken first,
            // so a caller gone at the yield has taken nothing, and a task
            // that must yield decides when it is back.
            answered_in_process().await;
            return self.checked_in_memory(memory, requests);
        }
        // Boxed: a remote check's future is large (the round trip's state),
        // and every future holding a check would carry and copy it, the
        // memory backend's too.
        Box::pin(self.check_requests(requests)).await
    }

    /// Gives back what an admitted [`check`](Self::check) took: for "count
    /// only failures" (refund the calls that succeeded), or to return the
    /// cost of a call whose work did not happen. `admitted` is the check's
    /// receipt, taken by value, so an admission is refunded at most once.
    ///
    /// Each request's cost goes back where it was taken: to the backend, to
    /// the token lease that served it (while that lease lives), or to the
    /// local limiter of the failure policy; an admission by
    /// [`FailurePolicy::Open`] took nothing. What a refund gives back depends
    /// on the algorithm:
    ///
    /// - the token bucket, GCRA and the leaky bucket: the part of the cost
    ///   the bucket has not refilled since. A bucket refills its oldest debt
    ///   first, so an admission's tokens come back in the order taken: all
    ///   of the cost right after the check, none of it once the bucket would
    ///   have been full again without it. What is given back is exactly what
    ///   the bucket would hold had the admission not been made, counting the
    ///   refunds this limiter made since of admissions before it, which
    ///   moved its tokens up the debt (they drain sooner). Refunds of the
    ///   key that overlap the admission's check in time, and other
    ///   instances' refunds, cannot be placed before or after it, and are
    ///   not counted: a refund after such a one can give back what refilled
    ///   meanwhile;
    /// - the fixed window: the cost, while the admission's window lasts;
    ///   after it ends the next window starts whole anyway, and nothing is
    ///   given;
    /// - the sliding window counter: the cost, while the admission's window
    ///   is the current or the previous one (and so weighs on the estimate);
    /// - the sliding log: the admission's own entries leave the log, while
    ///   they are in it.
    ///
    /// A window's refund finds the admission's window from when the check
    /// was made, measured on this process's clock, so it holds whatever the
    /// offset between this clock and Redis's, as long as round trips stay
    /// under half a window. This limiter's cached denials of the keys are
    /// forgotten, as they may end sooner now; other instances' deny caches
    /// answer their denials of the keys for at most a second more, as after
    /// a [`reset`](Self::reset).
    ///
    /// An admission of a key this limiter (or a clone) [reset](Self::reset)
    /// since gives nothing back, as the reset deleted what it took; a key
    /// reset by another instance, or forgotten by a Redis restarted without
    /// persistence, cannot be known here, and its refund gives the cost to
    /// the count begun since. (Keys are told apart by a hash
    /// into 1,024 slots of the part before any `~`, the mark of a key's
    /// variants: a key that shares a reset key's slot gives nothing back
    /// either, which admits less, never more.)
    ///
    /// An admission made by another limiter (not this one or a clone) is
    /// [`Error::OtherLimiter`], and nothing is given back.
    ///
    /// A backend fault is an `Err`. The refund is sent once and never again:
    /// one that failed to reach the backend leaves the cost taken (which
    /// admits less, never more), and one that timed out may still land
    /// when the backend answers, but never twice.
    ///
    /// ```
    /// use ratelimit_core::{Limiter, Quota, Request};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::memory();
    /// let partner = Quota::per_minute(2)?;
    /// // Count only the calls the partner API accepted.
    /// for accepted in [false, true, false, true] {
    ///     let admitted = limiter.check(Request::new(&partner, "partner")).await?;
    ///     if !accepted {
    ///         limiter.refund(admitted).await?;
    ///     }
    /// }
    /// assert!(limiter.check(Request::new(&partner, "partner")).await.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn refund(&self, admitted: Admitted<'_>) -> Result<(), Error> {
        self.give_back(&admitted).await
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
    /// A cost above the capacity is `allowed: false` with a `retry_after` of
    /// [`Duration::MAX`], as [`check`](Self::check) denies it.
    ///
    /// ```
    /// use ratelimit_core::{Limiter, Quota, Request};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let limiter = Limiter::memory();
    /// let quota = Quota::per_minute(3)?;
    /// limiter.check(Request::new(&quota, "user:7").cost(3)).await?;
    /// let seen = limiter.inspect(&quota, "user:7", 1).await?;
    /// assert!(!seen.allowed && seen.remaining == 0);
    /// limiter.reset("user:7").await?;
    /// assert_eq!(limiter.inspect(&quota, "user:7", 1).await?.remaining, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn inspect(&self, quota: &Quota, key: &str, cost: u64) -> Result<Decision, Error> {
        let deadline = Deadline::after(self.inner.timeout);
        if cost > quota.capacity() {
            // Never admittable: the key's figures, with no wait that helps.
            let state = self.inner.backend.peek(quota, key, 0, &deadline).await?;
            return Ok(Decision {
                allowed: false,
                retry_after: Duration::MAX,
                ..state
            });
        }
        self.inner.backend.peek(quota, key, cost, &deadline).await
    }

    /// Gives `key` its whole quota back, under any quota: deletes its state
    /// in the backend (and that of the variants `key~<algorithm>` that the
    /// attribute and the HTTP layer keep when a rule moves a key to another
    /// algorithm than its own, so a denial's key resets whatever the rule;
    /// not `key~<position>`, which a stacked attribute whose key repeats an
    /// earlier one's keeps its state under),
    /// and forgets what this limiter keeps of them in process
    /// (cached denials, leased tokens, a lease a check in flight would
    /// bring, and what the [`FailurePolicy::Local`] limiter counted), even
    /// when the call fails or is dropped before Redis answers, as the reset
    /// may land all the same. A [`refund`](Self::refund) of an admission
    /// this limiter made before the reset gives nothing back: what it took
    /// was deleted. Other instances' deny caches answer their denials of the
    /// key for at most a second more, and their leases
    /// serve what they hold until they end (at most the lease TTL). A
    /// backend fault is an `Err`.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        // The reset may land though the call fails, or though its caller is
        // gone before the answer: what this limiter keeps of the key is
        // forgotten before it is sent, and again when it ends or is dropped,
        // for what a check in flight brings back before the reset landed.
        let keys: Vec<String> = std::iter::once(key.to_owned())
            .chain(crate::key::algorithm_variants(key))
            .collect();
        let _forgotten: Vec<Forgotten<'_>> = keys
            .iter()
            .map(|key| Forgotten::now(&self.inner, key))
            .collect();
        self.inner
            .backend
            .reset(&keys, &Deadline::after(self.inner.timeout))
            .await
    }

    /// Counts a request that an HTTP layer's allowlist let through without
    /// asking, under `rule`.
    #[doc(hidden)]
    pub fn __exempt(&self, rule: &'static str) {
        self.inner
            .stats
            .record(rule, crate::metrics::Outcome::Exempt);
    }

    /// What an admission of a check beginning now names: this limiter
    /// (shared by its clones), so that only it takes their refunds, and the
    /// resets it has begun so far. Read before the check decides.
    pub(crate) fn origin(&self) -> request::Origin {
        let begun = self.inner.resets.begun();
        request::Origin {
            limiter: self.inner.id,
            resets: begun,
            done: begun,
            arrived_us: 0,
        }
    }

    /// `origin` once its check's decisions have arrived.
    pub(crate) fn arrived(&self, origin: request::Origin) -> request::Origin {
        request::Origin {
            done: self.inner.resets.begun(),
            arrived_us: self.inner.cache_clock.now_micros(),
            ..origin
        }
    }

    /// Logs a refund made for the caller (`what` gave back, such as "a
    /// call's tokens") that failed, at most once a second per limiter: an
    /// outage fails every refund, and callers each log nothing of their own.
    #[doc(hidden)]
    pub fn __refund_lost(&self, what: &'static str, error: &Error) {
        if report::once_a_second(&self.inner.last_lost_refund) {
            tracing::warn!(
                backend = self.inner.backend.name(),
                kind = %error.kind(),
                %error,
                "could not give back {what}; what it took stays taken (logged at most once a \
                 second)"
            );
        }
    }

    /// Whether `self` and `other` are clones of one limiter.
    #[doc(hidden)]
    pub fn __same(&self, other: &Limiter) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
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

/// Called when a decision is answered without waiting on anything (the
/// memory backend, a cached denial, a leased token): takes a unit of the
/// task's Tokio budget, and yields once the budget is spent, as Tokio's own
/// channels and sockets do. Without it, a task calling in a loop on a denied
/// key would keep its thread until the denial expires, and every other task
/// there (those waiting on Redis replies too) would wait as long. Outside a
/// Tokio runtime it returns at once.
///
/// Where the answer takes something (a token of the memory backend or of a
/// lease), it is called before: a caller that drops its future at the
/// yield has taken nothing.
///
/// It yields once at most, and wakes its task itself: the next poll goes
/// on, budget or not. A future polled by another executor inside a Tokio
/// task (`futures::executor::block_on` in a synchronous helper) never hands
/// the task back to Tokio, which alone gives the budget back and wakes the
/// tasks that yielded for it; such a check was never answered. Tokio puts a
/// task that wakes itself with its budget spent behind the others, as any
/// task ready to run, rather than after its next look at timers and
/// sockets (which it takes every 61 tasks it runs).
async fn answered_in_process() {
    use std::future::Future as _;
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut yielded, true) {
            return std::task::Poll::Ready(());
        }
        let polled = std::pin::pin!(tokio::task::consume_budget()).poll(cx);
        if polled.is_pending() {
            cx.waker().wake_by_ref();
        }
        polled
    })
    .await;
}

/// What a [`Limiter::reset`] forgets of its key in process, once when made
/// and again when dropped.
struct Forgotten<'a> {
    inner: &'a Inner,
    key: &'a str,
}

impl<'a> Forgotten<'a> {
    fn now(inner: &'a Inner, key: &'a str) -> Self {
        let forgotten = Self { inner, key };
        forgotten.forget();
        forgotten
    }

    fn forget(&self) {
        let Self { inner, key } = *self;
        // Admissions asked for until now give nothing back (see `Resets`).
        inner.resets.mark(key);
        // A lease kept would serve tokens the backend no longer counts, and
        // a cached denial deny a key made whole.
        inner.leases.remove(key);
        if let Some(cache) = &inner.deny_cache {
            cache.forget(key);
        }
        // What the failure policy's local limiter counted goes too: the
        // quota is whole again wherever this limiter counts it.
        inner.local.reset(key);
    }
}

impl Drop for Forgotten<'_> {
    fn drop(&mut self) {
        self.forget();
    }
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
            let key = format!("ip:{ip}");
            limiter.check(Request::new(&hourly, &key)).await.unwrap();
            peak = peak.max(held_keys(&limiter));
        }
        assert!(peak <= 5_000, "100,000 distinct keys held {peak}");
        assert!(
            limiter
                .check(Request::new(&hourly, "ip:99999"))
                .await
                .is_err(),
            "the newest key was forgotten"
        );
    }

    /// Shadow mode has one meaning for one limit or many: the enforced
    /// requests of a check are decided (all or nothing) before those in
    /// shadow mode, which never deny and take nothing when they would.
    #[tokio::test]
    async fn requests_in_shadow_mode_are_decided_after_the_enforced_ones() {
        let limiter = Limiter::memory();
        let (user, global) = (Quota::per_minute(3).unwrap(), Quota::per_minute(1).unwrap());
        let check = [
            Request::new(&user, "user:1").rule("user"),
            Request::new(&global, "global").rule("global").shadow(true),
        ];
        let first = limiter.check(check).await.unwrap();
        assert!(first.would_deny().is_none());
        assert_eq!(first.decisions().len(), 2);
        // The shadow limit is spent: the call goes ahead, and the user's
        // limit still takes its token.
        let second = limiter.check(check).await.unwrap();
        let would = second.would_deny().expect("the global limit would deny");
        assert_eq!((would.key.as_str(), would.rule), ("global", Some("global")));
        assert_eq!(second.decisions().len(), 1, "only the user's limit took");
        assert_eq!(
            limiter.inspect(&user, "user:1", 0).await.unwrap().remaining,
            1
        );
        assert_eq!(limiter.stats().shadow_denied, 1);
        // An enforced denial denies, and the shadow limit is not asked.
        limiter.check(check).await.unwrap();
        let denied = limiter.check(check).await.unwrap_err();
        assert_eq!(denied.key, "user:1");
        assert_eq!(limiter.stats().shadow_denied, 2);
        assert_eq!(limiter.stats().denied, 1);
    }

    /// A check naming one key twice can never be decided as written: denied
    /// (in shadow mode too, as a would-be denial; once by an enforced
    /// request and once in shadow mode, as a denial) and counted as an
    /// error.
    #[tokio::test]
    async fn a_key_named_twice_is_the_callers_mistake() {
        let limiter = Limiter::memory();
        let quota = Quota::per_minute(5).unwrap();
        let twice = [Request::new(&quota, "k"), Request::new(&quota, "k").cost(2)];
        let denied = limiter.check(twice).await.unwrap_err();
        assert_eq!(denied.cause, crate::DenialCause::DuplicateKey);
        assert!(!denied.is_retryable());
        let shadowed = twice.map(|r| r.shadow(true));
        let admitted = limiter.check(shadowed).await.unwrap();
        assert_eq!(
            admitted.would_deny().map(|d| d.cause),
            Some(crate::DenialCause::DuplicateKey)
        );
        // An enforced request and one in shadow mode on one key: the
        // shadow request would take from the enforced one's state.
        let mixed = [twice[0], twice[1].shadow(true)];
        let denied = limiter.check(mixed).await.unwrap_err();
        assert_eq!(denied.cause, crate::DenialCause::DuplicateKey);
        assert_eq!(limiter.stats().errors, 3);
        assert_eq!(limiter.inspect(&quota, "k", 0).await.unwrap().remaining, 5);
    }

    /// Every future that awaits a check (an axum handler's, the attribute's
    /// function's) holds the check's future and is moved with it: the round
    /// trip's state, nearly 2 KB, stays boxed behind it.
    #[test]
    fn a_check_holds_no_round_trip_inline() {
        let limiter = Limiter::memory();
        let quota = Quota::per_minute(5).unwrap();
        let one = limiter.check(Request::new(&quota, "k"));
        let several = limiter.check([Request::new(&quota, "a"), Request::new(&quota, "b")]);
        for size in [std::mem::size_of_val(&one), std::mem::size_of_val(&several)] {
            assert!(size <= 512, "a check's future takes {size} bytes");
        }
    }

    #[test]
    // Without the `redis` feature, the memory backend is the only one.
    #[allow(irrefutable_let_patterns)]
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
            Err(Error::Config(ConfigError::NotPositive {
                setting: "memory_max_keys"
            }))
        ));
    }

    /// A closed policy's denial that says "retry now" would send every
    /// client straight back to a backend that is down.
    #[test]
    fn a_closed_retry_after_of_zero_is_refused() {
        assert!(matches!(
            Limiter::builder()
                .closed_retry_after(Duration::ZERO)
                .build(),
            Err(Error::Config(ConfigError::NotPositive {
                setting: "closed_retry_after"
            }))
        ));
        assert!(Limiter::builder()
            .closed_retry_after(Duration::from_millis(1))
            .build()
            .is_ok());
    }
}
