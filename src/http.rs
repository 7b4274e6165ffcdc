//! Rate limits for HTTP services built on [axum] (and any [tower] stack):
//! a layer that limits whole routers or single routes on several limits at
//! once (per client address, per token tier, for the whole service), all or
//! nothing; problem responses for denials; and the IETF `RateLimit` header
//! fields.
//!
//! Enabled by the `axum` feature.
//!
//! ```
//! use std::net::SocketAddr;
//!
//! use axum::{routing::get, Router};
//! use ratelimit::http::{Limit, RateLimitLayer};
//! use ratelimit::{Limiter, Quota};
//!
//! let limiter = Limiter::memory();
//! let app: Router = Router::new()
//!     // 5 logins a minute per client address, on this route only:
//!     .route("/login", get(|| async { "welcome" }))
//!     .route_layer(
//!         RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(Quota::per_minute(5)?))
//!             .name("login"),
//!     )
//!     .route("/", get(|| async { "hello" }))
//!     // 10 requests a second per client address and 1,000 from everyone,
//!     // on every route, decided together:
//!     .layer(
//!         RateLimitLayer::new(limiter, Limit::per_peer_ip(Quota::per_second(10)?).name("ip"))
//!             .limit(Limit::global(Quota::per_second(1_000)?).name("global"))
//!             .name("api"),
//!     );
//!
//! // The default key is the peer address, which axum records when served with
//! // `into_make_service_with_connect_info`:
//! let _service = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok::<(), ratelimit::QuotaError>(())
//! ```
//!
//! # Limits and keys
//!
//! A [`RateLimitLayer`] holds one or more [`Limit`]s and decides them in one
//! [`Limiter::check`](crate::Limiter::check): a request is admitted
//! when every limit admits it, and takes one token from each; a request one
//! limit denies takes none from the others. Each limit has
//!
//! - a key: the limit's key prefix followed by one value, escaped as
//!   [`KeyBuilder::push_value`](crate::KeyBuilder::push_value) escapes it
//!   so a hostile value can neither forge another key nor grow it (see the
//!   table);
//! - a quota ([`QuotaSource`]): fixed, a [`NamedRule`] of the limiter's
//!   [`Rules`](crate::Rules) looked up at each request (so a
//!   `limiter.rules().set(..)` takes effect on the next request), or chosen
//!   for each request by a closure, such as a tier read from a token;
//! - a name (`<layer>.<limit>`): its policy in the header fields, its `rule`
//!   label in metrics;
//! - a failure policy ([`Limit::on_error`]), for when the backend fails.
//!
//! | source | value | default prefix |
//! |---|---|---|
//! | [`per_peer_ip`](Limit::per_peer_ip) | the peer's address from axum's `ConnectInfo<SocketAddr>` | `http:<name>:ip:` |
//! | [`per_client_ip`](Limit::per_client_ip) | the client's address from `X-Forwarded-For` or `Forwarded`, read only when the peer is a [trusted proxy](TrustedProxies) | `http:<name>:ip:` |
//! | [`per_header`](Limit::per_header) | a SHA-256 digest of a request header's raw bytes (never the value) | `http:<name>:header:<header>:` |
//! | [`per_bearer_token`](Limit::per_bearer_token) | a SHA-256 digest of the `Authorization: Bearer` token (never the token) | `http:<name>:token:` |
//! | [`per_key`](Limit::per_key) | what a closure returns for the request | `http:<name>:key:` |
//! | [`per_key_async`](Limit::per_key_async) | what a closure's future gives for the request | `http:<name>:key:` |
//! | [`global`](Limit::global) | none: one bucket for every request | `http:<name>:global` |
//!
//! A digest keeps a random secret (a bearer token, an API key) out of the
//! keys Redis holds and denials log, but not a value that can be guessed:
//! anyone who reads the keys can test a guessed `Authorization: Basic`
//! password against its digest. Key such requests by the user your
//! authentication finds, with [`per_key_async`](Limit::per_key_async).
//!
//! IPv6 clients are keyed by their `/64` network by default, as one host
//! usually owns a whole `/64`; see
//! [`ipv6_prefix_len`](Limit::ipv6_prefix_len). A request whose key cannot
//! be determined (no `ConnectInfo`, no such header, the closure returned
//! `None`) takes a token from one bucket shared by all such requests of the
//! limit, so leaving the key out never escapes the limit; see
//! [`MissingKey`]. A forwarding header's hop that holds bytes outside
//! visible ASCII is a client of its own, keyed by those bytes, never the
//! proxy: see [`TrustedProxies::client`].
//!
//! Beyond keys from the request's head, [`Limit::per_key_async`] takes a
//! key that needs an await (a verified token's subject, a tenant looked up
//! in a cache).
//!
//! # Allowlists and refunds
//!
//! [`RateLimitLayer::exempt`] lets the requests an [`Exemption`] covers (by
//! peer address or range, by client address behind trusted proxies, or by
//! a predicate) through without asking the limits, counted as `exempt`.
//! [`RateLimitLayer::refund_on`] gives a request's tokens back when the
//! service's response status says so: count only successes, or only
//! server errors.
//!
//! # Responses
//!
//! An admitted request runs the inner service. A denied one never reaches it:
//! the layer answers `429 Too Many Requests` with a JSON problem body, built
//! by [`TooManyRequests`], or `503 Service Unavailable` when the backend
//! failed and the denying limit's failure policy is closed, or what the
//! layer's [`on_denied`](RateLimitLayer::on_denied) hook makes of the
//! [`Denial`]. Handlers that
//! call `#[rate_limit]` functions answer the same way by converting their
//! [`RateLimited`](crate::RateLimited) into a [`TooManyRequests`]. The body
//! names the limit that denied and when to retry, never the key. In
//! [shadow mode](RateLimitLayer::shadow), a would-be denial reaches the
//! service with the fields of that denial.
//!
//! Every response that passed a layer carries the fields of
//! [draft-ietf-httpapi-ratelimit-headers-11] (May 2026; the field syntax is
//! that of every revision since -08), one list member per limit, so a route
//! under a layer of two limits lists two policies:
//!
//! ```text
//! RateLimit-Policy: "api.ip";q=10;w=1, "api.global";q=1000;w=1
//! RateLimit: "api.ip";r=7;t=1, "api.global";r=993;t=1
//! ```
//!
//! - `q` units in `w` seconds is what a client can spend again and again:
//!   `q / w` is the quota's sustained rate and `q` is at least its burst,
//!   so a bucket of 10 at 100/s is `q=100;w=1` and a bucket of 20 at 10/s
//!   is `q=20;w=2`; `w` is the smallest whole number of seconds, at least
//!   the time an empty quota takes to fill, that makes `q` whole (the
//!   window, for a window algorithm of whole seconds);
//! - `r` is the tokens left after this request, what can be spent right
//!   now, and `t` the seconds until the key has its whole quota back,
//!   rounded up; on a denial `r=0` and `t` is the `Retry-After` value, as
//!   the draft asks that `Retry-After` never point earlier than the end of
//!   the effective window `t`; the limits a denial left untouched have no
//!   `RateLimit` member, as they were not read;
//! - when the backend failed and a failure policy admitted the request
//!   anyway ([`Decision::fallback`](crate::Decision::fallback)), or denied
//!   it with a `503`, the remaining quota under the advertised policy is
//!   unknown, and the `RateLimit` member is left out rather than reporting a
//!   false `r=0`.
//!
//! With [`legacy_headers`](RateLimitLayer::legacy_headers) on, a layer also
//! sets the older `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
//! `X-RateLimit-Reset` (seconds from now, as `t`). These take one value, so
//! when several limits set them the most constrained one (fewest remaining)
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

mod denial;
mod exempt;
mod fields;
mod key;
mod layer;
mod limit;
mod problem;
mod service;

pub use denial::Denial;
pub use exempt::Exemption;
pub use key::{ClientAddr, ForwardedHeader, InvalidAddressRange, TrustedProxies};
pub use layer::RateLimitLayer;
pub use limit::{Limit, MissingKey, NamedRule, QuotaSource};
pub use problem::{
    retry_after_secs, ProblemRequestIdLayer, ProblemRequestIdService, TooManyRequests,
};
pub use service::RateLimitService;
