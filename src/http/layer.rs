//! The tower layer that limits requests.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Request};
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service};

use super::fields;
use super::key::{KeySource, TrustedProxies};
use super::problem::{self, TooManyRequests};
use crate::{Decision, KeyBuilder, Limiter, Quota, RateLimited};

/// What a layer does with a request whose key cannot be determined: no
/// `ConnectInfo` for an address key, no such header, no bearer token, or a
/// key closure that returned `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Every such request takes a token from one bucket of the layer's
    /// quota, shared by all of them (the default): leaving the key out never
    /// escapes the limit, and never spends another client's tokens. Its key
    /// is the layer's prefix followed by `%unknown`, which no escaped value
    /// can equal.
    #[default]
    SharedBucket,
    /// Such requests pass this layer unlimited and without its header
    /// fields: for keys that only some requests have, such as an API key on
    /// routes that also serve anonymous users who are limited by another
    /// layer.
    Unlimited,
}

/// A [tower] layer that limits requests to a service: one token per request
/// from the bucket of the request's key, a `429 Too Many Requests`
/// ([`TooManyRequests`]) without calling the service when there is none, and
/// the rate limit header fields on every response. See the
/// [module documentation](super) for keys and fields.
///
/// Put it on a whole router with `Router::layer` or on some routes with
/// `Router::route_layer` (or on one method router), each with its quota:
///
/// ```
/// use std::net::SocketAddr;
///
/// use axum::body::Body;
/// use axum::extract::ConnectInfo;
/// use axum::http::Request;
/// use axum::{routing::get, Router};
/// use ratelimit::http::RateLimitLayer;
/// use ratelimit::{Limiter, ManualClock, Quota};
/// use tower::ServiceExt;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // A stopped clock, so the numbers below are exact.
/// let limiter = Limiter::builder().clock(ManualClock::new(1_000_000)).build()?;
/// let app = Router::new()
///     .route("/search", get(|| async { "results" }))
///     .route_layer(
///         RateLimitLayer::new(limiter, Quota::per_minute(2)?)
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
/// let first = app.clone().oneshot(request()).await?;
/// assert_eq!(first.status(), 200);
/// assert_eq!(first.headers()["ratelimit-policy"], r#""search";q=2;w=60"#);
/// assert_eq!(first.headers()["ratelimit"], r#""search";r=1;t=30"#);
/// assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
///
/// app.clone().oneshot(request()).await?;
/// let third = app.oneshot(request()).await?;
/// assert_eq!(third.status(), 429);
/// assert_eq!(third.headers()["retry-after"], "30");
/// assert_eq!(third.headers()["ratelimit"], r#""search";r=0;t=30"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// Layers with the same name and key source share buckets. Give each quota
/// its own [`name`](Self::name) (or [`key_prefix`](Self::key_prefix)), as a
/// key shared by two quotas is limited by neither as written.
///
/// When layers are nested, the outer one takes its token first, so a request
/// that an inner layer then denies still spent the outer token.
///
/// [tower]: https://docs.rs/tower/0.5
#[derive(Clone)]
#[must_use]
pub struct RateLimitLayer {
    limiter: Limiter,
    quota: Quota,
    name: String,
    source: KeySource,
    prefix: Option<String>,
    legacy_headers: bool,
    missing_key: MissingKey,
    ipv6_prefix_len: u8,
    request_id_header: HeaderName,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("quota", &self.quota)
            .field("name", &self.name)
            .field("source", &self.source)
            .field("prefix", &self.prefix)
            .field("legacy_headers", &self.legacy_headers)
            .field("missing_key", &self.missing_key)
            .field("ipv6_prefix_len", &self.ipv6_prefix_len)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Limits each peer address to `quota`, in buckets kept by `limiter`,
    /// under the policy name `default`.
    pub fn new(limiter: Limiter, quota: Quota) -> Self {
        Self {
            limiter,
            quota,
            name: "default".to_owned(),
            source: KeySource::PeerIp,
            prefix: None,
            legacy_headers: false,
            missing_key: MissingKey::default(),
            ipv6_prefix_len: 64,
            request_id_header: problem::REQUEST_ID,
        }
    }

    /// Names the policy: in the `RateLimit-Policy` and `RateLimit` fields,
    /// and in the default key prefix `http:<name>:`.
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

    /// Replaces the default key prefix (`http:<name>:<source>:`, see the
    /// [module documentation](super#keys)) with `prefix`, used as written.
    /// The limiter's own prefix (`rl:` by default) still comes first.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Keys each request by the peer's address, from axum's
    /// `ConnectInfo<SocketAddr>` (the default). Behind a proxy every request
    /// has the proxy's address; use [`by_client_ip`](Self::by_client_ip).
    pub fn by_peer_ip(mut self) -> Self {
        self.source = KeySource::PeerIp;
        self
    }

    /// Keys each request by the client's address: the peer's, or, when the
    /// peer is one of `proxies`, the address its forwarding header names.
    /// See [`TrustedProxies`].
    pub fn by_client_ip(mut self, proxies: TrustedProxies) -> Self {
        self.source = KeySource::ClientIp(proxies);
        self
    }

    /// Keys each request by the value of `header`, such as an API key. The
    /// value is used escaped, or as a digest when long; a request without
    /// the header is handled as [`MissingKey`] says.
    pub fn by_header(mut self, header: HeaderName) -> Self {
        self.source = KeySource::Header(header);
        self
    }

    /// Keys each request by its `Authorization: Bearer` token. The key holds
    /// 128 bits of the token's SHA-256, never the token.
    pub fn by_bearer_token(mut self) -> Self {
        self.source = KeySource::BearerToken;
        self
    }

    /// Keys each request by what `key` returns for its head, escaped; `None`
    /// is handled as [`MissingKey`] says.
    ///
    /// ```
    /// use ratelimit::http::RateLimitLayer;
    /// use ratelimit::{Limiter, Quota};
    ///
    /// // Per tenant, from a path such as /tenants/acme/reports:
    /// let layer = RateLimitLayer::new(Limiter::memory(), Quota::per_minute(600)?)
    ///     .name("per-tenant")
    ///     .by_key(|request| {
    ///         let mut segments = request.uri.path().split('/');
    ///         (segments.nth(1) == Some("tenants"))
    ///             .then(|| segments.next().map(str::to_owned))
    ///             .flatten()
    ///     });
    /// # Ok::<(), ratelimit::QuotaError>(())
    /// ```
    pub fn by_key<F>(mut self, key: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.source = KeySource::Custom(Arc::new(key));
        self
    }

    /// One bucket for every request: a limit on the whole service.
    pub fn global(mut self) -> Self {
        self.source = KeySource::Global;
        self
    }

    /// Keys IPv6 clients by their network of `len` bits (default 64; 128 keys
    /// each address on its own). IPv4 addresses are always keyed as they are.
    ///
    /// # Panics
    ///
    /// If `len` is greater than 128.
    pub fn ipv6_prefix_len(mut self, len: u8) -> Self {
        assert!(
            len <= 128,
            "an IPv6 prefix length is at most 128, not {len}"
        );
        self.ipv6_prefix_len = len;
        self
    }

    /// Also sets `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` (seconds) on every response (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.legacy_headers = on;
        self
    }

    /// What to do with requests whose key cannot be determined (default
    /// [`MissingKey::SharedBucket`]).
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// Reads the request id copied into 429 bodies from `header` instead of
    /// `X-Request-Id`.
    pub fn request_id_header(mut self, header: HeaderName) -> Self {
        self.request_id_header = header;
        self
    }

    fn shared(&self) -> Shared {
        let prefix = self.prefix.clone().unwrap_or_else(|| {
            let mut key = KeyBuilder::new();
            key.push_literal("http:");
            key.push_value(self.name.as_str());
            key.push_literal(":");
            self.source.push_tag(&mut key);
            key.finish()
        });
        let window = self.quota.window().unwrap_or(self.quota.replenish_all());
        let window_secs = fields::ceil_secs(window).max(1);
        Shared {
            policy: fields::policy_value(&self.name, self.quota.capacity(), Some(window_secs)),
            window_secs,
            prefix,
            layer: self.clone(),
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            shared: Arc::new(self.shared()),
        }
    }
}

/// What every request of one layer needs, computed once.
#[derive(Debug)]
struct Shared {
    layer: RateLimitLayer,
    prefix: String,
    policy: HeaderValue,
    window_secs: u64,
}

impl Shared {
    /// The request's full key, or `None` when it goes unlimited.
    fn key(&self, parts: &Parts) -> Option<String> {
        let layer = &self.layer;
        let mut key = KeyBuilder::new();
        key.push_literal(&self.prefix);
        match layer.source.value(parts, layer.ipv6_prefix_len) {
            Some(value) => key.push_value(value.as_str()),
            None => match layer.missing_key {
                MissingKey::SharedBucket => key.push_literal("%unknown"),
                MissingKey::Unlimited => return None,
            },
        }
        Some(key.finish())
    }

    fn allowed(&self, response: &mut Response, decision: &Decision) {
        let layer = &self.layer;
        let inner_denial = problem::denial_numbers(response);
        let headers = response.headers_mut();
        if let (true, Some((limit, remaining, retry_after))) = (layer.legacy_headers, inner_denial)
        {
            // A handler under this layer was denied (by `#[rate_limit]`):
            // the legacy fields report that denial, the tightest limit.
            fields::set_legacy(headers, limit, Some(remaining), retry_after);
        }
        headers.append(fields::ratelimit_policy(), self.policy.clone());
        if decision.fallback {
            // The backend failed and the failure policy admitted the request:
            // the remaining quota is unknown, and `r=0` would be false.
            if layer.legacy_headers {
                fields::set_legacy(headers, decision.limit, None, None);
            }
            return;
        }
        let reset = fields::ceil_secs(decision.reset_after);
        headers.append(
            fields::ratelimit(),
            fields::ratelimit_value(&layer.name, decision.remaining, Some(reset)),
        );
        if layer.legacy_headers {
            fields::set_legacy(
                headers,
                decision.limit,
                Some(decision.remaining),
                Some(reset),
            );
        }
    }

    fn denied(&self, denied: RateLimited) -> Response {
        let layer = &self.layer;
        let (limit, remaining) = (denied.limit, denied.remaining);
        let problem = TooManyRequests::new(denied).with_policy(&layer.name, self.window_secs);
        let reset = problem.retry_after_secs();
        let mut response = problem.into_response();
        if layer.legacy_headers {
            fields::set_legacy(response.headers_mut(), limit, Some(remaining), reset);
        }
        response
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("layer", &self.shared.layer)
            .finish()
    }
}

impl<S, B> Service<Request<B>> for RateLimitService<S>
where
    S: Service<Request<B>, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service polled ready is the one to call; leave a fresh clone
        // in its place (tower's documented pattern for cloned services).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let key = shared.key(&parts);
            let request_id = problem::request_id(&parts.headers, &shared.layer.request_id_header);
            let request = Request::from_parts(parts, body);
            let Some(key) = key else {
                return inner.call(request).await;
            };
            let layer = &shared.layer;
            let mut response = match layer.limiter.acquire(&layer.quota, &key, 1).await {
                Ok(decision) => {
                    // A leaky bucket admits a request for later: wait for its turn.
                    if !decision.delay.is_zero() {
                        tokio::time::sleep(decision.delay).await;
                    }
                    let mut response = inner.call(request).await?;
                    shared.allowed(&mut response, &decision);
                    response
                }
                Err(denied) => shared.denied(denied),
            };
            if let Some(id) = request_id {
                problem::attach_request_id(&mut response, &id);
            }
            Ok(response)
        })
    }
}
