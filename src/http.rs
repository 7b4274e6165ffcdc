//! Rate limits for HTTP services built on [axum] (and any [tower] stack):
//! a layer that limits whole routers or single routes, `429 Too Many
//! Requests` problem responses, and the IETF `RateLimit` header fields.
//!
//! Enabled by the `axum` feature.
//!
//! ```
//! use std::net::SocketAddr;
//!
//! use axum::{routing::get, Router};
//! use ratelimit::http::RateLimitLayer;
//! use ratelimit::{Limiter, Quota};
//!
//! let limiter = Limiter::memory();
//! let app: Router = Router::new()
//!     // 5 logins a minute per client address, on this route only:
//!     .route("/login", get(|| async { "welcome" }))
//!     .route_layer(RateLimitLayer::new(limiter.clone(), Quota::per_minute(5)?).name("login"))
//!     .route("/", get(|| async { "hello" }))
//!     // 10 requests a second per client address, on every route:
//!     .layer(RateLimitLayer::new(limiter, Quota::per_second(10)?).name("per-ip"));
//!
//! // The default key is the peer address, which axum records when served with
//! // `into_make_service_with_connect_info`:
//! let _service = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok::<(), ratelimit::QuotaError>(())
//! ```
//!
//! # Keys
//!
//! [`RateLimitLayer`] takes one token per request from the bucket of the
//! request's key, the layer's key prefix followed by one value, escaped as
//! [`KeyBuilder::push_value`](crate::KeyBuilder::push_value) escapes it so a
//! hostile value can neither forge another key nor grow it:
//!
//! | source | value | default prefix |
//! |---|---|---|
//! | [`by_peer_ip`](RateLimitLayer::by_peer_ip) (the default) | the peer's address from axum's `ConnectInfo<SocketAddr>` | `http:<name>:ip:` |
//! | [`by_client_ip`](RateLimitLayer::by_client_ip) | the client's address from `X-Forwarded-For` or `Forwarded`, read only when the peer is a [trusted proxy](TrustedProxies) | `http:<name>:ip:` |
//! | [`by_header`](RateLimitLayer::by_header) | a request header's value | `http:<name>:header:<header>:` |
//! | [`by_bearer_token`](RateLimitLayer::by_bearer_token) | a SHA-256 digest of the `Authorization: Bearer` token (never the token) | `http:<name>:token:` |
//! | [`by_key`](RateLimitLayer::by_key) | what a closure returns for the request | `http:<name>:key:` |
//! | [`global`](RateLimitLayer::global) | none: one bucket for every request | `http:<name>:global` |
//!
//! IPv6 clients are keyed by their `/64` network by default, as one host
//! usually owns a whole `/64`; see
//! [`ipv6_prefix_len`](RateLimitLayer::ipv6_prefix_len). A request whose key
//! cannot be determined (no `ConnectInfo`, no such header, the closure
//! returned `None`) takes a token from one bucket shared by all such requests
//! of the layer, so leaving the key out never escapes the limit; see
//! [`MissingKey`].
//!
//! # Responses
//!
//! An admitted request runs the inner service. A denied one never reaches it:
//! the layer answers `429 Too Many Requests` with a JSON problem body, built
//! by [`TooManyRequests`]. Handlers that call `#[rate_limit]` functions
//! answer the same way by converting their [`RateLimited`](crate::RateLimited)
//! into a [`TooManyRequests`].
//!
//! Every response that passed a layer carries the layer's fields of
//! [draft-ietf-httpapi-ratelimit-headers-11] (May 2026; the field syntax is
//! that of every revision since -08), one list member per layer, so a route
//! under two layers lists two policies:
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=10;w=1
//! RateLimit: "per-ip";r=7;t=1
//! ```
//!
//! - `q` is the quota's capacity and `w` the seconds an empty bucket takes to
//!   refill (the window of a window algorithm), rounded up;
//! - `r` is the tokens left after this request and `t` the seconds until the
//!   key has its whole quota back, rounded up; on a denial `r=0` and `t` is
//!   the `Retry-After` value, as the draft asks that `Retry-After` never
//!   point earlier than the end of the effective window `t`;
//! - when the backend failed and the limiter's
//!   [`FailurePolicy`](crate::FailurePolicy) admitted the request anyway
//!   ([`Decision::fallback`](crate::Decision::fallback)), the remaining quota
//!   under the advertised policy is unknown, and the `RateLimit` field is
//!   left out rather than reporting a false `r=0`.
//!
//! With [`legacy_headers`](RateLimitLayer::legacy_headers) on, a layer also
//! sets the older `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
//! `X-RateLimit-Reset` (seconds from now, as `t`). These take one value, so
//! when several layers set them the most constrained one (fewest remaining)
//! wins, and a 429 that a handler under the layer returned (a
//! `#[rate_limit]` denial) is reported as that denial.
//!
//! # Request ids
//!
//! An [`IntoResponse`](axum::response::IntoResponse) implementation cannot
//! see the request, so a [`TooManyRequests`] response marks itself with a
//! response extension, and middleware that can see the request adds the
//! request's `X-Request-Id` to the marked body as `requestId`:
//! [`RateLimitLayer`] does it for its own denials and for denials returned by
//! the handlers under it, and [`ProblemRequestIdLayer`] does it for any
//! route, for handlers with no [`RateLimitLayer`] above them.
//!
//! [axum]: https://docs.rs/axum/0.8
//! [tower]: https://docs.rs/tower/0.5
//! [draft-ietf-httpapi-ratelimit-headers-11]: https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/11/

mod fields;
mod key;
mod layer;
mod problem;

pub use key::{ForwardedHeader, InvalidProxyRange, TrustedProxies};
pub use layer::{MissingKey, RateLimitLayer, RateLimitService};
pub use problem::{
    retry_after_secs, ProblemRequestIdLayer, ProblemRequestIdService, TooManyRequests,
};
