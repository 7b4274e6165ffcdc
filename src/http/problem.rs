//! `429 Too Many Requests` and `503 Service Unavailable` problem responses,
//! and the request id in them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};
use tower::{Layer, Service};

use super::fields;
use crate::{DenialCause, RateLimited};

/// The header a request id is read from unless configured otherwise.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id copied into a body; longer ones are left out.
const MAX_REQUEST_ID_LEN: usize = 128;

const PROBLEM_JSON: &str = "application/problem+json";

/// The `Retry-After` value for a wait: whole seconds, rounded up, so a client
/// that waits as told never comes back early.
///
/// ```
/// use std::time::Duration;
/// use ratelimit::http::retry_after_secs;
///
/// assert_eq!(retry_after_secs(Duration::from_millis(480)), 1);
/// assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(1_200)), 2);
/// assert_eq!(retry_after_secs(Duration::ZERO), 0);
/// assert_eq!(retry_after_secs(Duration::MAX), 999_999_999_999_999);
/// ```
pub fn retry_after_secs(retry_after: Duration) -> u64 {
    // Capped as the `RateLimit` fields' `t` is, at the largest integer a
    // structured field holds (some 31 million years).
    fields::ceil_secs(retry_after).min(fields::SF_INTEGER_MAX)
}

/// A [`RateLimited`] denial as an HTTP response: `429 Too Many Requests`
/// (or `503 Service Unavailable` when the rate limiter itself could not
/// decide) with a JSON problem body ([RFC 9457]) and the rate limit header
/// fields.
///
/// `RateLimited` comes from the runtime crate, and `IntoResponse` from axum,
/// so neither can be implemented for the other here; this wrapper is the
/// response. Convert a denial with `TooManyRequests::from(denied)`, or use
/// `TooManyRequests` itself as the error type of a `#[rate_limit]` function
/// (it implements `From<RateLimited>`).
///
/// The response:
///
/// | cause | status | `code` | `Retry-After` and `retryAfter` |
/// |---|---|---|---|
/// | [`DenialCause::Quota`] | 429 | `"rate_limited"` | the wait in whole seconds, rounded up |
/// | [`DenialCause::LocalFallback`] (the backend failed, and the local share of the quota is spent) | 429 | `"rate_limited"` | the wait in whole seconds, rounded up |
/// | [`DenialCause::BackendUnavailable`] (the backend failed and the failure policy is closed) | 503 | `"rate_limiter_unavailable"` | the denial's `retry_after` (the limiter's `closed_retry_after`), rounded up |
/// | [`DenialCause::CostExceedsCapacity`] | 429 | `"cost_exceeds_capacity"` | absent: the request costs more than the quota's capacity, so waiting never helps, and no header invites a retry |
/// | [`DenialCause::DuplicateKey`] (two limits of one check built the same key: the service's mistake) | 500 | `"rate_limit_misconfigured"` | absent: retrying never helps |
///
/// [`RateLimitLayer`](super::RateLimitLayer) answers the same `500` problem,
/// with no denial behind it, when an address limit finds that the server
/// records no peer addresses (see [`Limit::per_peer_ip`](super::Limit::per_peer_ip)).
///
/// A closed policy's denial is a `503`, not a `429`: the client did nothing
/// wrong, and nothing is known of its quota, so no `RateLimit: r=0` says it
/// spent it.
///
/// The body, served as `application/problem+json`, has `type`
/// (`"about:blank"`), `title` (`"Too Many Requests"` or `"Service
/// Unavailable"`), `status`, `code`, `policy` (the name of the limit that
/// denied), `message` (which limit denied and when to retry, also as the RFC
/// 9457 `detail`), `retryAfter` (seconds, as in the header, when retrying
/// can help) and `requestId` (the request's `X-Request-Id`, added by
/// [`RateLimitLayer`](super::RateLimitLayer) or [`ProblemRequestIdLayer`]).
/// The denial's key is never in the response: it can hold what identifies
/// other clients, or how the service builds its keys; it stays in the
/// logs. [`message`](Self::message) replaces the message.
///
/// The response also carries `RateLimit-Policy: "<policy>";q=<limit>` (a
/// [`RateLimitLayer`](super::RateLimitLayer)'s denial advertises its `q` and
/// `w`) and, on a denial by the quota itself ([`DenialCause::Quota`]),
/// `RateLimit: "<policy>";r=0;t=<Retry-After>`: a denial by a failure
/// policy's local share, or of a cost above the capacity, knows nothing true
/// of what the quota has left. The policy name is the denying function's
/// name for a `#[rate_limit]` denial, the limit's name for a layer's,
/// `default` otherwise, or what [`policy_name`](Self::policy_name) sets.
///
/// ```
/// use std::time::Duration;
///
/// use axum::response::IntoResponse;
/// use ratelimit::http::TooManyRequests;
/// use ratelimit::RateLimited;
///
/// let denied = RateLimited::new("user:42", 10, 0, Duration::from_millis(1_200));
/// let response = TooManyRequests::from(denied).into_response();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "2");
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert_eq!(response.headers()["ratelimit"], r#""default";r=0;t=2"#);
/// ```
///
/// In a handler, through the application's error type:
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use ratelimit::http::TooManyRequests;
/// use ratelimit::{rate_limit, RateLimited};
///
/// enum ApiError {
///     Limited(RateLimited),
/// }
///
/// impl From<RateLimited> for ApiError {
///     fn from(denied: RateLimited) -> Self {
///         ApiError::Limited(denied)
///     }
/// }
///
/// impl IntoResponse for ApiError {
///     fn into_response(self) -> Response {
///         match self {
///             ApiError::Limited(denied) => TooManyRequests::from(denied).into_response(),
///         }
///     }
/// }
///
/// #[rate_limit(key = "report:<user_id>", capacity = 1, rate = "1/h")]
/// async fn build_report(user_id: u64) -> Result<String, ApiError> {
///     Ok(format!("report for {user_id}"))
/// }
///
/// async fn report(user_id: u64) -> Result<String, ApiError> {
///     build_report(user_id).await
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// assert!(report(7).await.is_ok());
/// let response = report(7).await.into_response();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["ratelimit-policy"], r#""build_report";q=1;w=3600"#);
/// # });
/// ```
///
/// [RFC 9457]: https://www.rfc-editor.org/rfc/rfc9457
#[derive(Debug, Clone)]
pub struct TooManyRequests {
    denied: RateLimited,
    policy: Option<String>,
    message: Option<String>,
}

impl TooManyRequests {
    /// The response for `denied`.
    pub fn new(denied: RateLimited) -> Self {
        Self {
            denied,
            policy: None,
            message: None,
        }
    }

    /// Names the policy in the `RateLimit-Policy` and `RateLimit` fields and
    /// in the body.
    ///
    /// # Panics
    ///
    /// If `name` is empty or not printable ASCII, which the fields cannot carry.
    #[must_use]
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        fields::check_policy_name(&name);
        self.policy = Some(name);
        self
    }

    /// Replaces the body's `message` and `detail`. Leave keys and other
    /// clients' data out of it: it is sent to the client.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit::http::TooManyRequests;
    /// use ratelimit::RateLimited;
    ///
    /// let denied = RateLimited::new("export:7", 1, 0, Duration::from_secs(60));
    /// let problem = TooManyRequests::from(denied).message("one export a minute; retry after 60s");
    /// # let _ = problem;
    /// ```
    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// The denial.
    pub fn denied(&self) -> &RateLimited {
        &self.denied
    }

    /// The denial, unwrapped.
    pub fn into_inner(self) -> RateLimited {
        self.denied
    }

    /// The response's status: `503 Service Unavailable` when the backend
    /// failed and the failure policy is closed, `500 Internal Server Error`
    /// for a check naming one key twice, `429 Too Many Requests` otherwise.
    pub fn status(&self) -> StatusCode {
        match self.denied.cause {
            DenialCause::BackendUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            DenialCause::DuplicateKey => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The body's `code`: `"rate_limited"`, `"rate_limiter_unavailable"`,
    /// `"cost_exceeds_capacity"` or `"rate_limit_misconfigured"`.
    pub fn code(&self) -> &'static str {
        match self.denied.cause {
            DenialCause::BackendUnavailable { .. } => "rate_limiter_unavailable",
            DenialCause::CostExceedsCapacity { .. } => "cost_exceeds_capacity",
            DenialCause::DuplicateKey => "rate_limit_misconfigured",
            // The local fallback limiter denies by its share of the quota: to
            // the client, a spent quota like any other.
            DenialCause::Quota | DenialCause::LocalFallback => "rate_limited",
            _ => "rate_limited",
        }
    }

    /// The `Retry-After` value, or `None` when retrying never helps.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.denied
            .is_retryable()
            .then(|| retry_after_secs(self.denied.retry_after))
    }

    fn policy(&self) -> &str {
        if let Some(name) = &self.policy {
            return name;
        }
        // A `#[rate_limit]` rule is the function's path; its last segment
        // names the policy without exposing the module layout.
        self.denied
            .rule
            .and_then(|rule| rule.rsplit("::").next())
            .filter(|name| fields::is_valid_policy_name(name))
            .unwrap_or("default")
    }

    /// Which limit denied and when to retry, with no key: the key names the
    /// client's bucket, and can name other clients' (a path, an address, a
    /// tenant) or tell how the service builds its keys.
    fn default_message(&self) -> String {
        let policy = self.policy();
        let retry = self.retry_after_secs().unwrap_or(0);
        match self.denied.cause {
            DenialCause::BackendUnavailable { .. } => format!(
                "rate limit `{policy}` cannot be checked while the rate limiter is unavailable; \
                 retry after {retry}s"
            ),
            DenialCause::CostExceedsCapacity { cost } => format!(
                "the request costs {cost}, more than the {} that rate limit `{policy}` ever \
                 admits at once; send a smaller request, as this one can never be admitted",
                self.denied.limit
            ),
            DenialCause::DuplicateKey => format!(
                "rate limit `{policy}` could not be checked: the service names one key twice in \
                 one check, which retrying does not mend"
            ),
            _ => format!("rate limit `{policy}` exceeded; retry after {retry}s"),
        }
    }
}

impl From<RateLimited> for TooManyRequests {
    fn from(denied: RateLimited) -> Self {
        Self::new(denied)
    }
}

impl fmt::Display for TooManyRequests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // For logs, which may name the key; responses use the message.
        fmt::Display::fmt(&self.denied, f)
    }
}

impl std::error::Error for TooManyRequests {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.denied)
    }
}

/// The problem body of a [`TooManyRequests`] response and the numbers of its
/// denial, kept as a response extension for middleware: a layer that sees
/// the request adds its id, and one with legacy fields reports the denial.
#[derive(Debug, Clone)]
struct Problem {
    body: Map<String, Value>,
    status: StatusCode,
    limit: u64,
    remaining: u64,
    retry_after: Option<u64>,
}

/// The `500` answered when limit `policy` cannot be checked for a reason in
/// the service itself (logged where it is found), in the shape of a
/// denial's problem: code `"rate_limit_misconfigured"`, no `Retry-After`,
/// and nothing of the cause, which is the service's to mend.
pub(crate) fn misconfigured(policy: &str) -> Response {
    let message = format!(
        "rate limit `{policy}` could not be checked: the service is misconfigured, which \
         retrying does not mend"
    );
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "rate_limit_misconfigured",
        policy,
        message,
        (0, 0, None),
    )
}

/// A problem response: its body, `Content-Type`, `Retry-After` when
/// retrying can help, and the [`Problem`] marker for the layers around.
fn problem(
    status: StatusCode,
    code: &str,
    policy: &str,
    message: String,
    (limit, remaining, retry_after): (u64, u64, Option<u64>),
) -> Response {
    let mut body = Map::new();
    body.insert("type".into(), "about:blank".into());
    let title = status.canonical_reason().unwrap_or("Too Many Requests");
    body.insert("title".into(), title.into());
    body.insert("status".into(), status.as_u16().into());
    body.insert("detail".into(), message.clone().into());
    body.insert("code".into(), code.into());
    body.insert("policy".into(), policy.into());
    body.insert("message".into(), message.into());
    if let Some(secs) = retry_after {
        body.insert("retryAfter".into(), secs.into());
    }
    let mut response = Response::new(Body::from(Value::Object(body.clone()).to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    if let Some(secs) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response.extensions_mut().insert(Problem {
        body,
        status,
        limit,
        remaining,
        retry_after,
    });
    response
}

impl IntoResponse for TooManyRequests {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = self.retry_after_secs();
        let message = self
            .message
            .clone()
            .unwrap_or_else(|| self.default_message());
        let policy = self.policy();
        let numbers = (self.denied.limit, self.denied.remaining, retry_after);
        let mut response = problem(status, self.code(), policy, message, numbers);
        let headers = response.headers_mut();
        // A denial from a check names its quota's policy, which has a window.
        let (q, w) = match self.denied.policy {
            Some(policy) => (policy.quota_units(), Some(policy.window_secs())),
            None => (self.denied.limit, None),
        };
        headers.append(
            fields::ratelimit_policy(),
            fields::policy_value(policy, q, w),
        );
        if self.denied.cause == DenialCause::Quota {
            headers.append(
                fields::ratelimit(),
                fields::ratelimit_value(policy, 0, retry_after),
            );
        }
        response
    }
}

/// The request id to copy into problem bodies: the header's value when it is
/// printable and at most 128 bytes long.
pub(crate) fn request_id(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    let id = headers.get(name)?.to_str().ok()?.trim();
    (!id.is_empty() && id.len() <= MAX_REQUEST_ID_LEN).then(|| id.to_owned())
}

/// Adds `requestId` to the body of a [`TooManyRequests`] response that has
/// none yet. Other responses are left alone, as is one changed after it was
/// built: another status, another content type, or a body encoded (by a
/// compression layer, which keeps the parts and so the marker), which the
/// document put back would contradict.
pub(crate) fn attach_request_id(response: &mut Response, id: &str) {
    let status = response.status();
    let headers = response.headers();
    if headers.contains_key(CONTENT_ENCODING)
        || headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes) != Some(PROBLEM_JSON.as_bytes())
    {
        return;
    }
    let Some(Problem { body, .. }) = response
        .extensions_mut()
        .get_mut::<Problem>()
        .filter(|problem| problem.status == status)
    else {
        return;
    };
    if body.contains_key("requestId") {
        return;
    }
    body.insert("requestId".into(), id.into());
    let text = Value::Object(body.clone()).to_string();
    response.headers_mut().remove(CONTENT_LENGTH);
    *response.body_mut() = Body::from(text);
}

/// The limit, remaining tokens and `Retry-After` of the denial a
/// [`TooManyRequests`] response reports, if `response` is one.
///
/// A `503` reports no numbers: nothing is known of the quota then.
pub(crate) fn denial_numbers(response: &Response) -> Option<(u64, u64, Option<u64>)> {
    if response.status() != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    let problem = response
        .extensions()
        .get::<Problem>()
        .filter(|problem| problem.status == StatusCode::TOO_MANY_REQUESTS)?;
    Some((problem.limit, problem.remaining, problem.retry_after))
}

/// Copies the request's `X-Request-Id` into the body of every
/// [`TooManyRequests`] response of the services it wraps, as `requestId`.
///
/// [`RateLimitLayer`](super::RateLimitLayer) already does this for its own
/// denials and for the handlers under it; this layer is for routes with no
/// `RateLimitLayer`, whose handlers call `#[rate_limit]` functions. Put it
/// inside (after) any middleware that assigns request ids.
///
/// ```
/// use axum::{routing::get, Router};
/// use ratelimit::http::ProblemRequestIdLayer;
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(ProblemRequestIdLayer::new());
/// ```
#[derive(Debug, Clone)]
pub struct ProblemRequestIdLayer {
    header: HeaderName,
}

impl ProblemRequestIdLayer {
    /// Reads the id from `X-Request-Id`.
    pub fn new() -> Self {
        Self { header: REQUEST_ID }
    }

    /// Reads the id from `header` instead.
    #[must_use]
    pub fn header(mut self, header: HeaderName) -> Self {
        self.header = header;
        self
    }
}

impl Default for ProblemRequestIdLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for ProblemRequestIdLayer {
    type Service = ProblemRequestIdService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ProblemRequestIdService {
            inner,
            header: self.header.clone(),
        }
    }
}

/// The service of [`ProblemRequestIdLayer`].
#[derive(Debug, Clone)]
pub struct ProblemRequestIdService<S> {
    inner: S,
    header: HeaderName,
}

impl<S, B> Service<Request<B>> for ProblemRequestIdService<S>
where
    S: Service<Request<B>, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let id = request_id(request.headers(), &self.header);
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            if let Some(id) = id {
                attach_request_id(&mut response, &id);
            }
            Ok(response)
        })
    }
}
