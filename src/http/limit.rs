//! One dimension of a [`RateLimitLayer`](super::RateLimitLayer): where its
//! key comes from, and what its quota is at each request.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use axum::http::request::Parts;
use axum::http::HeaderName;

use super::fields;
use super::key::{KeyFuture, KeySource, TrustedProxies};
use crate::{Algorithm, FailurePolicy, Limiter, Quota};

/// What a limit does with a request whose key cannot be determined: no such
/// header, no bearer token, or a key closure that returned `None`. (An
/// address limit served with no peer addresses is the service's mistake,
/// answered `500`: see [`Limit::per_peer_ip`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Every such request takes a token from one bucket of the limit's
    /// quota, shared by all of them (the default): leaving the key out never
    /// escapes the limit, and never spends another client's tokens. Its key
    /// is the limit's prefix followed by `%unknown`, which no escaped value
    /// can equal.
    #[default]
    SharedBucket,
    /// Such requests pass this limit unlimited and without its header
    /// fields (the layer's other limits still apply): for keys that only
    /// some requests have, such as an API key on routes that also serve
    /// anonymous users who are limited by another limit.
    Unlimited,
}

/// A named rule of the limiter's [`Rules`](crate::Rules), with the quota
/// that applies while no rule of that name is set: the layer's counterpart
/// of the attribute's `rule = "..."`, changed while the service runs with
/// `limiter.rules().set(name, quota)` (or a `RedisRuleSource`, feature
/// `redis`) and looked up at each request.
///
/// ```
/// use ratelimit::http::NamedRule;
/// use ratelimit::{Limiter, Quota};
///
/// let limiter = Limiter::memory();
/// let free = NamedRule::new("api.tier.free", Quota::per_minute(60)?);
/// assert_eq!(free.resolve(&limiter), Quota::per_minute(60)?, "the default while unset");
/// limiter.rules().set("api.tier.free", Quota::per_minute(30)?);
/// assert_eq!(free.resolve(&limiter), Quota::per_minute(30)?, "the rule once set");
/// # Ok::<(), ratelimit::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedRule {
    name: &'static str,
    default: Quota,
}

impl NamedRule {
    /// The rule `name`, `default` while the limiter has no rule of that name.
    pub fn new(name: &'static str, default: Quota) -> Self {
        Self { name, default }
    }

    /// The rule's name in the limiter's rules.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The quota that applies while no rule of this name is set.
    pub fn default_quota(&self) -> Quota {
        self.default
    }

    /// The quota in force on `limiter` now: its rule of this name, or the
    /// default.
    pub fn resolve(&self, limiter: &Limiter) -> Quota {
        limiter.rules().get(self.name).unwrap_or(self.default)
    }
}

/// What a closure makes of a request's head.
type PerRequest<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;

/// Where a [`Limit`]'s quota comes from at each request: fixed, a named rule
/// (hot reloaded), or chosen for each request by a closure, such as a tier
/// read from a token or a header.
///
/// A [`Quota`] or a [`NamedRule`] converts into one, so
/// `Limit::global(Quota::per_second(100)?)` is a fixed quota.
///
/// ```
/// use axum::http::request::Parts;
/// use ratelimit::http::{Limit, NamedRule, QuotaSource};
/// use ratelimit::Quota;
///
/// fn is_pro(request: &Parts) -> bool {
///     request.headers.get("x-plan").is_some_and(|plan| plan == "pro")
/// }
///
/// // Per API key, a tier's quota, each tier a rule operators can change:
/// let free = NamedRule::new("api.tier.free", Quota::per_minute(60)?);
/// let pro = NamedRule::new("api.tier.pro", Quota::per_minute(600)?);
/// let tiered = QuotaSource::rule_per_request(move |request| if is_pro(request) { pro } else { free });
/// let _limit = Limit::per_header("x-api-key".parse().unwrap(), tiered).name("tier");
///
/// // Or quotas computed in code, with no rule:
/// let fixed_tiers = QuotaSource::per_request(|request| {
///     let quota = if is_pro(request) { Quota::per_minute(600) } else { Quota::per_minute(60) };
///     quota.expect("valid quotas")
/// });
/// # let _ = fixed_tiers;
/// # Ok::<(), ratelimit::QuotaError>(())
/// ```
///
/// A key keeps its state when its quota changes (a rule reload, a client
/// moving to another tier), as the runtime's quota changes define. When the
/// quota's algorithm is not the limit's own (a fixed quota's, a rule's
/// default's, the token bucket for closures), the state lives under the key
/// with `~<algorithm>` appended, as the attribute does, so one key never
/// holds two algorithms' state.
#[derive(Clone)]
pub struct QuotaSource(Source);

#[derive(Clone)]
enum Source {
    Fixed(Quota),
    Rule(NamedRule),
    PerRequest(PerRequest<Quota>),
    RulePerRequest(PerRequest<NamedRule>),
}

impl QuotaSource {
    /// The same quota for every request.
    pub fn fixed(quota: Quota) -> Self {
        Self(Source::Fixed(quota))
    }

    /// The limiter's rule `name` at each request, `default` while it is not
    /// set.
    pub fn rule(name: &'static str, default: Quota) -> Self {
        Self(Source::Rule(NamedRule::new(name, default)))
    }

    /// The quota `quota` returns for each request's head.
    pub fn per_request<F>(quota: F) -> Self
    where
        F: Fn(&Parts) -> Quota + Send + Sync + 'static,
    {
        Self(Source::PerRequest(Arc::new(quota)))
    }

    /// The rule `rule` returns for each request's head, resolved on the
    /// limiter at that request: tiers whose quotas can be changed while the
    /// service runs.
    pub fn rule_per_request<F>(rule: F) -> Self
    where
        F: Fn(&Parts) -> NamedRule + Send + Sync + 'static,
    {
        Self(Source::RulePerRequest(Arc::new(rule)))
    }

    /// The quota for `request` on `limiter`.
    pub(crate) fn resolve(&self, limiter: &Limiter, request: &Parts) -> Quota {
        match &self.0 {
            Source::Fixed(quota) => *quota,
            Source::Rule(rule) => rule.resolve(limiter),
            Source::PerRequest(quota) => quota(request),
            Source::RulePerRequest(rule) => rule(request).resolve(limiter),
        }
    }

    /// The quota when it is the same for every request, to compute its
    /// fields once.
    pub(crate) fn fixed_quota(&self) -> Option<Quota> {
        match &self.0 {
            Source::Fixed(quota) => Some(*quota),
            _ => None,
        }
    }

    /// The algorithm whose state a key holds under its own name; a quota of
    /// another decides on `key~<algorithm>`. Closures have no quota of their
    /// own, so the default algorithm, as for the attribute's
    /// `quota = <expression>`.
    pub(crate) fn home_algorithm(&self) -> Algorithm {
        match &self.0 {
            Source::Fixed(quota) => quota.algorithm(),
            Source::Rule(rule) => rule.default.algorithm(),
            Source::PerRequest(_) | Source::RulePerRequest(_) => Algorithm::TokenBucket,
        }
    }
}

impl From<Quota> for QuotaSource {
    fn from(quota: Quota) -> Self {
        Self::fixed(quota)
    }
}

impl From<NamedRule> for QuotaSource {
    fn from(rule: NamedRule) -> Self {
        Self(Source::Rule(rule))
    }
}

impl fmt::Debug for QuotaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Fixed(quota) => f.debug_tuple("Fixed").field(quota).finish(),
            Source::Rule(rule) => f.debug_tuple("Rule").field(rule).finish(),
            Source::PerRequest(_) => f.write_str("PerRequest(..)"),
            Source::RulePerRequest(_) => f.write_str("RulePerRequest(..)"),
        }
    }
}

/// One limit of a [`RateLimitLayer`](super::RateLimitLayer): a key for each
/// request (its client's address, a header, a token, a closure's value, or
/// one key for every request) and the quota of that key.
///
/// A layer decides all its limits at once, all or nothing (see
/// [`RateLimitLayer::limit`](super::RateLimitLayer::limit)).
///
/// ```
/// use ratelimit::http::{Limit, TrustedProxies};
/// use ratelimit::{FailurePolicy, Quota};
///
/// let per_client = Limit::per_client_ip(TrustedProxies::new(["10.0.0.0/8"])?, Quota::per_second(10)?)
///     .name("ip");
/// // If the backend fails, the whole service's limit still holds, in process:
/// let everyone = Limit::global(Quota::per_second(1_000)?)
///     .name("global")
///     .on_error(FailurePolicy::Local);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Limit {
    pub(crate) name: Option<String>,
    pub(crate) source: KeySource,
    pub(crate) quota: QuotaSource,
    pub(crate) on_error: Option<FailurePolicy>,
    pub(crate) prefix: Option<String>,
    pub(crate) missing_key: MissingKey,
    pub(crate) ipv6_prefix_len: u8,
}

impl Limit {
    fn new(source: KeySource, quota: QuotaSource) -> Self {
        Self {
            name: None,
            source,
            quota,
            on_error: None,
            prefix: None,
            missing_key: MissingKey::default(),
            ipv6_prefix_len: 64,
        }
    }

    /// Per peer address, from axum's `ConnectInfo<SocketAddr>`: serve the
    /// router with `into_make_service_with_connect_info::<SocketAddr>()`.
    /// Without it no request has an address, and the limit answers `500`
    /// (code `"rate_limit_misconfigured"`) with an error in the log. Behind
    /// a proxy every request has the proxy's address; use
    /// [`per_client_ip`](Self::per_client_ip).
    pub fn per_peer_ip(quota: impl Into<QuotaSource>) -> Self {
        Self::new(KeySource::PeerIp, quota.into())
    }

    /// Per client address: the peer's, or, when the peer is one of
    /// `proxies`, the client its forwarding header names. See
    /// [`TrustedProxies`].
    pub fn per_client_ip(proxies: TrustedProxies, quota: impl Into<QuotaSource>) -> Self {
        Self::new(KeySource::ClientIp(proxies), quota.into())
    }

    /// Per value of `header`, such as an API key. The key holds 128 bits of
    /// the value's SHA-256 (of its raw bytes, which need not be UTF-8),
    /// never the value: a header keyed on is most often a credential, and
    /// keys end up in Redis and in logs.
    pub fn per_header(header: HeaderName, quota: impl Into<QuotaSource>) -> Self {
        Self::new(KeySource::Header(header), quota.into())
    }

    /// Per `Authorization: Bearer` token. The key holds 128 bits of the
    /// token's SHA-256, never the token.
    pub fn per_bearer_token(quota: impl Into<QuotaSource>) -> Self {
        Self::new(KeySource::BearerToken, quota.into())
    }

    /// Per value `key` returns for the request's head, escaped; `None` is
    /// handled as [`MissingKey`] says.
    pub fn per_key<F>(key: F, quota: impl Into<QuotaSource>) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Self::new(KeySource::Custom(Arc::new(key)), quota.into())
    }

    /// Per value the future `key` returns for the request's head, escaped:
    /// for keys that take an await to find, such as a verified token's
    /// subject or a tenant looked up in a cache. `key` runs on the request's
    /// head and returns a `'static` future, so take from the head what the
    /// lookup needs (a header's value, a clone of an extension) before the
    /// `async move` block. `None` is handled as [`MissingKey`] says; values
    /// share the namespace of [`per_key`](Self::per_key)'s.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use std::sync::Arc;
    ///
    /// use ratelimit::http::{Limit, MissingKey};
    /// use ratelimit::Quota;
    ///
    /// // API keys to tenants, as a database or a cache would answer.
    /// let tenants: Arc<HashMap<String, String>> =
    ///     Arc::new([("k-123".to_owned(), "acme".to_owned())].into());
    /// let per_tenant = Limit::per_key_async(
    ///     move |request| {
    ///         let api_key = request.headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    ///         let tenants = Arc::clone(&tenants);
    ///         async move { tenants.get(&api_key?).cloned() }
    ///     },
    ///     Quota::per_minute(600)?,
    /// )
    /// .name("tenant")
    /// .on_missing_key(MissingKey::SharedBucket);
    /// # let _ = per_tenant;
    /// # Ok::<(), ratelimit::QuotaError>(())
    /// ```
    pub fn per_key_async<F, Fut>(key: F, quota: impl Into<QuotaSource>) -> Self
    where
        F: Fn(&Parts) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        let key = move |request: &Parts| -> KeyFuture { Box::pin(key(request)) };
        Self::new(KeySource::Async(Arc::new(key)), quota.into())
    }

    /// One bucket for every request: a limit on the whole service.
    pub fn global(quota: impl Into<QuotaSource>) -> Self {
        Self::new(KeySource::Global, quota.into())
    }

    /// Names the limit: its policy in the `RateLimit-Policy` and `RateLimit`
    /// fields, its `rule` label in metrics and its denials' rule are
    /// `<layer name>.<name>`. Unnamed, a limit is named as its layer.
    ///
    /// # Panics
    ///
    /// If `name` is empty or not printable ASCII, which the fields cannot carry.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        fields::check_policy_name(&name);
        self.name = Some(name);
        self
    }

    /// Uses `policy` for this limit when the backend fails, instead of the
    /// limiter's: a limit failing closed denies the request (`503 Service
    /// Unavailable`), those with the local policy are decided in process,
    /// and those failing open admit.
    pub fn on_error(mut self, policy: FailurePolicy) -> Self {
        self.on_error = Some(policy);
        self
    }

    /// Replaces the default key prefix (`http:<name>:<source>:`, see the
    /// [module documentation](super#keys)) with `prefix`, used as written.
    /// The limiter's own prefix (`rl:` by default) still comes first.
    ///
    /// The layer refuses (panics when it is built) two limits one of whose
    /// prefixes begins the other's where a value could spell the rest:
    /// `tenant:` beside a global limit's `tenant:all` would let a client
    /// whose key is `all` take the global bucket. End each prefix with a
    /// separator such as `:`. Limits of other layers on the same limiter are
    /// not checked: give them prefixes of their own.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// What to do with requests whose key cannot be determined (default
    /// [`MissingKey::SharedBucket`]).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// Keys IPv6 clients by their network of `len` bits (default 64; 128 keys
    /// each address on its own). IPv4 addresses are always keyed as they are.
    ///
    /// # Panics
    ///
    /// If `len` is greater than 128.
    #[track_caller]
    pub fn ipv6_prefix_len(mut self, len: u8) -> Self {
        check_ipv6_prefix_len(len);
        self.ipv6_prefix_len = len;
        self
    }
}

/// Panics unless `len` is an IPv6 prefix length.
#[track_caller]
pub(crate) fn check_ipv6_prefix_len(len: u8) {
    assert!(
        len <= 128,
        "invalid IPv6 prefix length {len}; a prefix length is at most 128"
    );
}
