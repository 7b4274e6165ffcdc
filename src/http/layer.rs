//! The tower layer that limits requests: its configuration.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::{HeaderName, StatusCode};
use axum::response::Response;
use tower::Layer;

use super::denial::Denial;
use super::exempt::Exemption;
use super::fields;
use super::limit::Limit;
use super::problem::{self};
use super::service::{
    policy_field, DenialHook, Hook, Prepared, RateLimitService, RefundOn, Shared,
};
use crate::{KeyBuilder, Limiter};

/// A [tower] layer that limits requests to a service: one token per request
/// from each of its [`Limit`]s (per client address, per token, for the
/// whole service...), decided all or nothing; a `429 Too Many Requests`
/// ([`TooManyRequests`](super::TooManyRequests)) without calling the service when a limit is spent;
/// and the rate limit header fields on every response. See the
/// [module documentation](super) for keys and fields.
///
/// Put it on a whole router with `Router::layer` or on some routes with
/// `Router::route_layer` (or on one method router). [`new`](Self::new)
/// makes a layer of one [`Limit`] (here per peer address);
/// [`limit`](Self::limit) adds more:
///
/// ```
/// use std::net::SocketAddr;
///
/// use axum::body::Body;
/// use axum::extract::ConnectInfo;
/// use axum::http::Request;
/// use axum::{routing::get, Router};
/// use ratelimit::http::{Limit, RateLimitLayer};
/// use ratelimit::{Limiter, ManualClock, Quota};
/// // A `Router` is always ready: it can be called without `poll_ready`.
/// use tower::Service;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // A stopped clock, so the numbers below are exact.
/// let limiter = Limiter::builder().clock(ManualClock::new(1_000_000)).build()?;
/// let app = Router::new()
///     .route("/search", get(|| async { "results" }))
///     .route_layer(
///         RateLimitLayer::new(limiter, Limit::per_peer_ip(Quota::per_minute(2)?))
///             .name("search")
///             .legacy_headers(true),
///     );
///
/// let request = || {
///     let mut request = Request::get("/search").body(Body::empty()).unwrap();
///     // What `into_make_service_with_connect_info::<SocketAddr>()` records:
///     request.extensions_mut().insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 4711))));
///     request
/// };
/// let first = app.clone().call(request()).await?;
/// assert_eq!(first.status(), 200);
/// assert_eq!(first.headers()["ratelimit-policy"], r#""search";q=2;w=60"#);
/// assert_eq!(first.headers()["ratelimit"], r#""search";r=1;t=30"#);
/// assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
///
/// app.clone().call(request()).await?;
/// let third = app.clone().call(request()).await?;
/// assert_eq!(third.status(), 429);
/// assert_eq!(third.headers()["retry-after"], "30");
/// assert_eq!(third.headers()["ratelimit"], r#""search";r=0;t=30"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// Layers (and limits) with the same name and key source share buckets.
/// Give each quota its own name (or [`key_prefix`](Limit::key_prefix)), as
/// a key shared by two quotas is limited by neither as written.
///
/// Nested layers decide one after the other: the outer one takes its token
/// first, so a request that an inner layer then denies still spent the
/// outer token. Limits of one layer never do that.
///
/// [tower]: https://docs.rs/tower/0.5
#[derive(Debug, Clone)]
#[must_use]
pub struct RateLimitLayer {
    limiter: Limiter,
    name: String,
    limits: Vec<Limit>,
    exemptions: Vec<Exemption>,
    on_denied: Option<Hook<DenialHook>>,
    refund_on: Option<Hook<RefundOn>>,
    legacy_headers: bool,
    shadow: bool,
    request_id_header: HeaderName,
}

impl RateLimitLayer {
    /// Limits requests by `limit`, in buckets kept by `limiter`, under the
    /// policy name `default` (see [`name`](Self::name)); add more limits with
    /// [`limit`](Self::limit).
    pub fn new(limiter: Limiter, limit: Limit) -> Self {
        Self {
            limiter,
            name: "default".to_owned(),
            limits: vec![limit],
            exemptions: Vec::new(),
            on_denied: None,
            refund_on: None,
            legacy_headers: false,
            shadow: false,
            request_id_header: problem::REQUEST_ID,
        }
    }

    /// Adds `limit` to the ones decided for each request. The limits of a
    /// layer are decided all or nothing, in one [`Limiter::check`]: the
    /// request is admitted when every limit admits it, and each limit then
    /// takes its token; when one denies, none takes a token, so a flood from
    /// one client spends that client's bucket and nobody else's, however
    /// many other limits it passes.
    ///
    /// ```
    /// use axum::http::request::Parts;
    /// use axum::{routing::get, Router};
    /// use ratelimit::http::{Limit, NamedRule, QuotaSource, RateLimitLayer, TrustedProxies};
    /// use ratelimit::{FailurePolicy, Limiter, Quota};
    ///
    /// // A tier from the request, each tier a named rule operators can change:
    /// let free = NamedRule::new("api.tier.free", Quota::per_minute(60)?);
    /// let pro = NamedRule::new("api.tier.pro", Quota::per_minute(600)?);
    /// let tier = move |request: &Parts| match request.headers.get("x-plan") {
    ///     Some(plan) if plan == "pro" => pro,
    ///     _ => free,
    /// };
    ///
    /// let proxies = TrustedProxies::new(["10.0.0.0/8"])?;
    /// let layer = RateLimitLayer::new(
    ///     Limiter::memory(),
    ///     Limit::per_client_ip(proxies, Quota::per_second(10)?).name("ip"),
    /// )
    /// .limit(Limit::per_bearer_token(QuotaSource::rule_per_request(tier)).name("tier"))
    /// .limit(
    ///     Limit::global(QuotaSource::rule("api.global", Quota::per_second(1_000)?))
    ///         .name("global")
    ///         .on_error(FailurePolicy::Local),
    /// )
    /// .name("api");
    /// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// Each limit is a policy of its own in the fields, named
    /// `api.ip`, `api.tier` and `api.global` here; a limit with no
    /// [`name`](Limit::name) is named as the layer, so at most one may have
    /// none.
    ///
    /// # Panics
    ///
    /// When the layer is applied (`Router::layer`), if two of its limits
    /// have the same name, or key prefixes whose keys could meet (see
    /// [`Limit::key_prefix`]).
    pub fn limit(mut self, limit: Limit) -> Self {
        self.limits.push(limit);
        self
    }

    /// Names the layer: the policy name of its unnamed limit, and the first
    /// part of its named limits' (`<name>.<limit>`), in the `RateLimit-Policy`
    /// and `RateLimit` fields, the metrics' `rule` label, and the default
    /// key prefix `http:<policy>:`.
    ///
    /// # Panics
    ///
    /// If `name` is empty or not printable ASCII, which the fields cannot carry.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        fields::check_policy_name(&name);
        self.name = name;
        self
    }

    /// Lets the requests `exemption` covers through without asking the
    /// layer's limits: an allowlist entry (see [`Exemption`]). Exemptions
    /// are tried in the order added; the first that covers a request is
    /// the one counted.
    pub fn exempt(mut self, exemption: Exemption) -> Self {
        self.exemptions.push(exemption);
        self
    }

    /// Answers denials with what `hook` makes of them instead of the
    /// problem document ([`TooManyRequests`](super::TooManyRequests)):
    /// `hook` is given the denial, the denying limit's policy and the
    /// request's head ([`Denial`]), and [`Denial::problem`] is the default
    /// response, to adjust or to send as it is. The layer sets the
    /// `RateLimit-Policy` and `RateLimit` fields of its limits on the hook's
    /// response (replacing any the hook set), and `Retry-After` when the
    /// hook set none and retrying can help.
    ///
    /// The hook is called for every denial: a spent quota (`429`), and also
    /// a failing backend under [`FailurePolicy::Closed`](crate::FailurePolicy::Closed)
    /// (`503`) or a check that names a key twice (`500`), whose default
    /// status [`Denial::problem`] keeps; answering those `429` would tell
    /// clients an outage is theirs to wait out.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use axum::response::IntoResponse;
    /// use ratelimit::http::{Limit, RateLimitLayer};
    /// use ratelimit::{Limiter, Quota};
    ///
    /// let per_ip = Limit::per_peer_ip(Quota::per_second(10)?);
    /// let layer = RateLimitLayer::new(Limiter::memory(), per_ip)
    ///     .on_denied(|denial| {
    ///         if denial.problem().status() != StatusCode::TOO_MANY_REQUESTS {
    ///             return denial.problem().into_response();
    ///         }
    ///         let body = format!("{{\"error\":\"slow_down\",\"limit\":\"{}\"}}", denial.limit());
    ///         (StatusCode::TOO_MANY_REQUESTS, body).into_response()
    ///     });
    /// # let _ = layer;
    /// # Ok::<(), ratelimit::QuotaError>(())
    /// ```
    pub fn on_denied<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Denial<'_>) -> Response + Send + Sync + 'static,
    {
        self.on_denied = Some(Hook(Arc::new(hook)));
        self
    }

    /// Gives a request's tokens back ([`Limiter::refund`]) when `refund`
    /// says so of the service's response status, so that only some
    /// responses count: only failures, to limit retries of a failing
    /// operation (`|status| !status.is_server_error()`), or only successes
    /// (`|status| !status.is_success()`), so that rejected requests do not
    /// spend a client's quota. An error of the service, which has no
    /// status, is taken for a 500. The response keeps the fields of the
    /// admission; the refund is made before it is sent (a backend call
    /// when the limiter is remote). A refund that fails is logged; it is
    /// never sent twice (see [`Limiter::refund`]).
    ///
    /// ```
    /// use ratelimit::http::{Limit, RateLimitLayer};
    /// use ratelimit::{Limiter, Quota};
    ///
    /// // Five failed logins a minute per address; successful ones are free.
    /// let per_ip = Limit::per_peer_ip(Quota::per_minute(5)?);
    /// let layer = RateLimitLayer::new(Limiter::memory(), per_ip)
    ///     .name("login")
    ///     .refund_on(|status| status.is_success());
    /// # let _ = layer;
    /// # Ok::<(), ratelimit::QuotaError>(())
    /// ```
    pub fn refund_on<F>(mut self, refund: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.refund_on = Some(Hook(Arc::new(refund)));
        self
    }

    /// Shadow mode: decide, record and send the fields as usual, but never
    /// deny; a request its limits would deny (a spent quota, a backend
    /// failing closed) reaches the service, with the fields of that denial
    /// (`r=0`). For rolling a limit out: metrics and the fields show what it
    /// would do, and nothing is refused. A would-be denial takes no token,
    /// exactly as a denial would not, so the buckets hold what they would
    /// hold with the layer enforcing.
    ///
    /// Would-be denials are counted as `shadow_denied` under the limit that
    /// would deny ([`Request::shadow`](crate::Request::shadow)), never as
    /// `denied`.
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }

    /// Also sets `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds) on every response (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy_headers = on;
        self
    }

    /// Reads the request id copied into problem bodies from `header`
    /// instead of `X-Request-Id`.
    pub fn request_id_header(mut self, header: HeaderName) -> Self {
        self.request_id_header = header;
        self
    }

    #[track_caller]
    fn shared(&self) -> Shared {
        let limits: Vec<Prepared> = self.limits.iter().map(|l| self.prepare(l)).collect();
        for (i, limit) in limits.iter().enumerate() {
            for earlier in &limits[..i] {
                assert!(
                    earlier.name != limit.name,
                    "two limits of the rate limit layer `{}` are named `{}`; give each a name \
                     of its own with `Limit::name`",
                    self.name,
                    limit.name
                );
                if let Some((short, long)) = keys_can_meet(earlier, limit) {
                    panic!(
                        "the key prefix `{}` of the limit `{}` begins the key prefix `{}` of `{}`, \
                         and a value could spell the rest, so the limits could share buckets; \
                         give each a prefix that no other begins, or follow the shorter with a \
                         separator the other does not have there (such as `:`)",
                        short.prefix, short.name, long.prefix, long.name
                    );
                }
            }
        }
        let exemptions = self
            .exemptions
            .iter()
            .map(|e| (e.clone(), intern(&format!("{}.{}", self.name, e.name))))
            .collect();
        Shared {
            limiter: self.limiter.clone(),
            limits,
            exemptions,
            on_denied: self.on_denied.clone(),
            refund_on: self.refund_on.clone(),
            legacy_headers: self.legacy_headers,
            shadow: self.shadow,
            request_id_header: self.request_id_header.clone(),
            name: intern(&self.name),
            no_peer_address: super::key::NoPeerAddress::new(),
        }
    }

    fn prepare(&self, limit: &Limit) -> Prepared {
        let name = match &limit.name {
            Some(own) => intern(&format!("{}.{own}", self.name)),
            None => intern(&self.name),
        };
        let prefix = limit.prefix.clone().unwrap_or_else(|| {
            let mut key = KeyBuilder::new();
            key.push_literal("http:");
            key.push_value(name);
            key.push_literal(":");
            limit.source.push_tag(&mut key);
            key.finish()
        });
        Prepared {
            limit: limit.clone(),
            name,
            prefix,
            home: limit.quota.home_algorithm(),
            fixed: limit.quota.fixed_quota().map(|q| policy_field(name, &q)),
        }
    }
}

/// Whether two limits' keys can meet: one's prefix begins the other's, and
/// what follows is text an escaped value (or none, for a global limit's key,
/// the prefix alone) could spell; then the limit with the shorter prefix,
/// and the other.
fn keys_can_meet<'a>(a: &'a Prepared, b: &'a Prepared) -> Option<(&'a Prepared, &'a Prepared)> {
    let (short, long) = if a.prefix.len() <= b.prefix.len() {
        (a, b)
    } else {
        (b, a)
    };
    let rest = long.prefix.strip_prefix(short.prefix.as_str())?;
    rest.chars()
        .all(ratelimit_core::key::__in_escaped_value)
        .then_some((short, long))
}

/// One `&'static str` per distinct name, as the runtime's rule names
/// ([`Request::rule`](crate::Request::rule)) are static. Layers are built
/// at startup (and `Layer::layer` may run once per route), so each name is
/// leaked once, never per request.
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(name) = names.get(name) {
        return name;
    }
    let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(name);
    name
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    #[track_caller]
    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            shared: Arc::new(self.shared()),
        }
    }
}
