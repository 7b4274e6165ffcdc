//! What a layer's denial-response hook is given.

use axum::http::request::Parts;

use super::problem::TooManyRequests;
use crate::{QuotaPolicy, RateLimited};

/// A request a [`RateLimitLayer`](super::RateLimitLayer) denies, as its
/// [`on_denied`](super::RateLimitLayer::on_denied) hook sees it: which
/// limit denied, the denial itself (`retry_after`, the cause), the limit's
/// advertised policy, and the request's head.
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use ratelimit::http::{Denial, RateLimitLayer};
/// use ratelimit::{Limiter, Quota};
///
/// fn slow_down(denial: &Denial<'_>) -> Response {
///     if denial.request().uri.path().starts_with("/api/") {
///         // The default problem document, with a message of our own.
///         return denial.problem().message("slow down, please").into_response();
///     }
///     let wait = denial.retry_after_secs().unwrap_or(60);
///     (axum::http::StatusCode::TOO_MANY_REQUESTS, format!("come back in {wait}s")).into_response()
/// }
///
/// let layer = RateLimitLayer::new(Limiter::memory(), Quota::per_second(10)?).on_denied(slow_down);
/// # let _ = layer;
/// # Ok::<(), ratelimit::QuotaError>(())
/// ```
#[derive(Debug)]
pub struct Denial<'a> {
    pub(super) limit: &'a str,
    pub(super) denied: &'a RateLimited,
    pub(super) policy: QuotaPolicy,
    pub(super) request: &'a Parts,
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
