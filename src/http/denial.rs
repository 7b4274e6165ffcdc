//! What a layer's denial-response hook is given.

use std::fmt;

use axum::http::request::Parts;

use super::problem::TooManyRequests;
use crate::{QuotaPolicy, RateLimited};

/// A request a [`RateLimitLayer`](super::RateLimitLayer) denies, as its
/// [`on_denied`](super::RateLimitLayer::on_denied) hook sees it: which
/// limit denied, the denial itself (`retry_after`, the cause), the limit's
/// advertised policy, and the request's head.
///
/// ```
/// use axum::http::StatusCode;
/// use axum::response::{IntoResponse, Response};
/// use ratelimit::http::{Denial, Limit, RateLimitLayer};
/// use ratelimit::{Limiter, Quota};
///
/// fn slow_down(denial: &Denial<'_>) -> Response {
///     // An outage (`503`) or a misused limit (`500`) keeps its own answer:
///     // only a spent quota is the client's to wait out.
///     if denial.problem().status() != StatusCode::TOO_MANY_REQUESTS {
///         return denial.problem().into_response();
///     }
///     if denial.request().uri.path().starts_with("/api/") {
///         // The default problem document, with a message of our own.
///         return denial.problem().message("slow down, please").into_response();
///     }
///     let wait = denial.retry_after_secs().unwrap_or(60);
///     (StatusCode::TOO_MANY_REQUESTS, format!("come back in {wait}s")).into_response()
/// }
///
/// let per_ip = Limit::per_peer_ip(Quota::per_second(10)?);
/// let layer = RateLimitLayer::new(Limiter::memory(), per_ip).on_denied(slow_down);
/// # let _ = layer;
/// # Ok::<(), ratelimit::QuotaError>(())
/// ```
pub struct Denial<'a> {
    pub(super) limit: &'a str,
    pub(super) denied: &'a RateLimited,
    pub(super) policy: QuotaPolicy,
    pub(super) request: &'a Parts,
}

/// The request's method, path and header names only: its query and header
/// values may hold credentials (`Authorization`, cookies, `?api_key=`), and
/// a hook that logs `{denial:?}` must not write them.
impl fmt::Debug for Denial<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<&str> = self
            .request
            .headers
            .keys()
            .map(|name| name.as_str())
            .collect();
        f.debug_struct("Denial")
            .field("limit", &self.limit)
            .field("denied", self.denied)
            .field("policy", &self.policy)
            .field("method", &self.request.method)
            .field("path", &self.request.uri.path())
            .field("headers", &headers)
            .finish()
    }
}

impl<'a> Denial<'a> {
    /// The denying limit's policy name (`<layer>.<limit>`).
    pub fn limit(&self) -> &'a str {
        self.limit
    }

    /// The denial: when to retry, whether the quota or a failing backend
    /// denied ([`RateLimited::cause`]).
    pub fn denied(&self) -> &'a RateLimited {
        self.denied
    }

    /// The denying limit's policy (`q` units in every `w` seconds), as the
    /// `RateLimit-Policy` field advertises it.
    pub fn policy(&self) -> QuotaPolicy {
        self.policy
    }

    /// The `Retry-After` value the default response sends: whole seconds,
    /// rounded up; `None` when retrying cannot help (a cost above the
    /// capacity).
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.problem().retry_after_secs()
    }

    /// The denied request's head.
    pub fn request(&self) -> &'a Parts {
        self.request
    }

    /// The response the layer sends without a hook: a problem document
    /// (`429`, or `503` when a failing backend denied) naming the limit.
    pub fn problem(&self) -> TooManyRequests {
        TooManyRequests::new(self.denied.clone()).policy_name(self.limit)
    }
}
