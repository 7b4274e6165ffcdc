//! An HTTP API with its limits in one layer, decided all or nothing: per
//! client address, per API token with the token's tier (each tier a named
//! rule, changed while the server runs), and on the whole service. Under it,
//! a per-user limit by the `#[rate_limit]` attribute on what a handler
//! calls, and a tighter per-address limit on one route.
//!
//! Runs on the embedded memory backend:
//!     cargo run -p ratelimit-tests --example axum_server --features axum
//! on Redis when `REDIS_URL` is set, and on the port in `PORT` (default 3000):
//!     REDIS_URL=redis://127.0.0.1:6379 PORT=8080 cargo run -p ratelimit-tests --example axum_server --features axum
//!
//! Then try, from another terminal:
//!
//!     # Every response lists the layer's three policies and what is left:
//!     curl -i http://127.0.0.1:3000/
//!     #   RateLimit-Policy: "api.ip";q=20;w=2, "api.global";q=100;w=2
//!     #   RateLimit: "api.ip";r=19;t=1, "api.global";r=99;t=1
//!     # (no "api.tier" member: anonymous requests are limited per address only)
//!
//!     # A token's tier: tokens starting with `pro-` are on the pro tier.
//!     curl -i -H 'Authorization: Bearer free-alice' http://127.0.0.1:3000/
//!     #   "api.tier";q=5;w=10   the free tier: 5 at once, 30 a minute
//!     curl -i -H 'Authorization: Bearer pro-bob' http://127.0.0.1:3000/
//!     #   "api.tier";q=50;w=5   the pro tier: 50 at once, 600 a minute
//!
//!     # Spend the free tier: the 6th is a 429 naming `api.tier`, and the
//!     # per-address and global buckets kept the tokens of the denied ones.
//!     for i in $(seq 7); do curl -s -o /dev/null -w '%{http_code}\n' \
//!         -H 'Authorization: Bearer free-alice' http://127.0.0.1:3000/; done
//!
//!     # Change the free tier while the server runs; the next request uses it:
//!     curl -X PUT --data 'capacity=20 rate=120/min' http://127.0.0.1:3000/admin/rules/api.tier.free
//!     curl -i -H 'Authorization: Bearer free-alice' http://127.0.0.1:3000/
//!     #   "api.tier";q=20;w=10   alice's bucket keeps its state: spent under
//!     #   the old rule, it now refills at 2 a second, up to 20
//!
//!     # Per user, by the attribute: 5 at once, then one a second.
//!     for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' \
//!         http://127.0.0.1:3000/users/42/orders; done
//!
//!     # The 4th search within 10 s is a 429 problem with requestId "demo-4":
//!     for i in $(seq 4); do curl -s -H "X-Request-Id: demo-$i" http://127.0.0.1:3000/search; echo; done
//!
//!     # Unknown users are a 404 that costs nothing (`refund_on = err`):
//!     for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' \
//!         http://127.0.0.1:3000/users/0/orders; done
//!
//!     # Health checks are exempt: never limited, counted as `exempt`.
//!     for i in $(seq 30); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/healthz; done
//!
//!     # Quotes, per tenant (an API key looked up after an await): 3 a minute,
//!     # only successful quotes count, and a denial is this API's own JSON.
//!     for i in $(seq 5); do curl -s -H 'X-Api-Key: key-acme' http://127.0.0.1:3000/quotes/10; echo; done
//!     curl -s -H 'X-Api-Key: key-globex' http://127.0.0.1:3000/quotes/0   # a 422: given back

use std::net::SocketAddr;

use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use ratelimit::http::{
    Exemption, Limit, MissingKey, NamedRule, QuotaSource, RateLimitLayer, TooManyRequests,
};
use ratelimit::{rate_limit, FailurePolicy, Limiter, Quota, RateLimited};
use serde_json::{json, Value};

/// The API's errors; a rate limit denial becomes a `429` problem response.
#[derive(Debug)]
enum ApiError {
    Limited(RateLimited),
    NotFound(u64),
}

impl From<RateLimited> for ApiError {
    fn from(denied: RateLimited) -> Self {
        ApiError::Limited(denied)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Limited(denied) => TooManyRequests::from(denied).into_response(),
            ApiError::NotFound(user_id) => (
                axum::http::StatusCode::NOT_FOUND,
                format!("no user {user_id}\n"),
            )
                .into_response(),
        }
    }
}

/// Per user: 5 at once, then one a second, whichever address they come
/// from. A failed call (an unknown user) gives its token back.
#[rate_limit(key = "orders:list:<user_id>", capacity = 5, rate = "1/s", refund_on = err)]
async fn list_orders(user_id: u64) -> Result<Vec<String>, ApiError> {
    if user_id == 0 {
        return Err(ApiError::NotFound(user_id));
    }
    Ok(vec![
        format!("order-{user_id}-1"),
        format!("order-{user_id}-2"),
    ])
}

async fn orders(Path(user_id): Path<u64>) -> Result<Json<Value>, ApiError> {
    let orders = list_orders(user_id).await?;
    Ok(Json(json!({ "user": user_id, "orders": orders })))
}

async fn search() -> Json<Value> {
    Json(json!({ "results": ["a", "b"] }))
}

async fn hello() -> &'static str {
    "hello\n"
}

/// A quote for `amount`: 422 for nothing to quote, which the quotes layer
/// gives back.
async fn quote(Path(amount): Path<u64>) -> Response {
    if amount == 0 {
        return (StatusCode::UNPROCESSABLE_ENTITY, "nothing to quote\n").into_response();
    }
    Json(json!({ "amount": amount, "fee": amount / 100 + 1 })).into_response()
}

/// The tenant of an API key, as a cache or database lookup would answer it,
/// after an await.
async fn tenant_of(api_key: Option<String>) -> Option<String> {
    tokio::task::yield_now().await;
    api_key?.strip_prefix("key-").map(str::to_owned)
}

/// Quotes: per tenant, 3 a minute; only successful quotes count; denials
/// in this API's own error format.
fn quotes_layer(limiter: &Limiter) -> Result<RateLimitLayer, Box<dyn std::error::Error>> {
    let per_tenant = Limit::per_key_async(
        |request: &Parts| {
            let api_key = request
                .headers
                .get("x-api-key")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            tenant_of(api_key)
        },
        Quota::per_minute(3)?,
    )
    .name("tenant");
    Ok(RateLimitLayer::new(limiter.clone(), per_tenant)
        .name("quotes")
        .refund_on(|status| !status.is_success())
        .on_denied(|denial| {
            let body = json!({
                "error": "quota_exhausted",
                "limit": denial.limit(),
                "retry_in_seconds": denial.retry_after_secs(),
            });
            (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response()
        }))
}

/// Sets a named rule from its text form (`capacity=20 rate=120/min`): the
/// next request under it uses the new quota. A real service keeps this
/// behind its admin authentication, or changes rules through
/// `RedisRuleSource`, which every instance follows.
async fn set_rule(
    State(limiter): State<Limiter>,
    Path(name): Path<String>,
    text: String,
) -> (StatusCode, String) {
    match limiter.rules().set_text(name.clone(), text.trim()) {
        Ok(_) => (
            StatusCode::OK,
            format!("rule `{name}` is now {}\n", text.trim()),
        ),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            format!("invalid rule `{name}`: {e}\n"),
        ),
    }
}

/// The tier of a request's token. Here the token says it; a real service
/// reads it from the token's verified claims or its account.
fn tier(free: NamedRule, pro: NamedRule) -> impl Fn(&Parts) -> NamedRule + Send + Sync {
    move |request| {
        let token = request
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match token {
            Some(token) if token.starts_with("pro-") => pro,
            _ => free,
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Shows the limiter's warnings, such as a backend failure.
    tracing_subscriber::fmt().with_target(false).init();

    // Redis at REDIS_URL when set, the memory backend otherwise; the
    // attribute and the layers share it.
    let limiter = Limiter::from_env()?;
    ratelimit::install(limiter.clone())?;

    // The tiers' quotas are named rules: these are the defaults, and
    // `limiter.rules().set(..)` (here through PUT /admin/rules/<name>)
    // changes them for the next request.
    let free = NamedRule::new("api.tier.free", Quota::new(5, "30/min".parse()?)?);
    let pro = NamedRule::new("api.tier.pro", Quota::new(50, "600/min".parse()?)?);

    // One layer, three limits, decided together: a request one of them
    // denies takes no token from the others, so a client flooding the API
    // spends its own buckets, never the global one.
    // Per client address: bursts of 20, 10 a second. Behind a reverse
    // proxy, use `Limit::per_client_ip(TrustedProxies::new([...])?, ..)`, or
    // every client has the proxy's address.
    let api = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_peer_ip(Quota::new(20, "10/s".parse()?)?).name("ip"),
    )
    // Per token (its digest, never the token), at its tier's quota;
    // anonymous requests are limited by address alone.
    .limit(
        Limit::per_bearer_token(QuotaSource::rule_per_request(tier(free, pro)))
            .name("tier")
            .on_missing_key(MissingKey::Unlimited),
    )
    // The whole service: 100 at once and 50 a second, from everyone. If the
    // backend fails, this limit holds in process.
    .limit(
        Limit::global(QuotaSource::rule(
            "api.global",
            Quota::new(100, "50/s".parse()?)?,
        ))
        .name("global")
        .on_error(FailurePolicy::Local),
    )
    .name("api")
    .legacy_headers(true)
    // Health checks pass unlimited (counted as `exempt`); an office range
    // would be `Exemption::peers("office", ["192.0.2.0/24"])?`.
    .exempt(Exemption::when("health", |request| {
        request.uri.path() == "/healthz"
    }));
    // Searching is dearer: 3 per client address every 10 seconds.
    let search_per_ip = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_peer_ip(Quota::new(3, "3/10s".parse()?)?),
    )
    .name("search");

    let app = Router::new()
        .route("/", get(hello))
        .route("/users/{user_id}/orders", get(orders))
        .route("/search", get(search).route_layer(search_per_ip))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/quotes/{amount}",
            get(quote).route_layer(quotes_layer(&limiter)?),
        )
        // The layer also copies `X-Request-Id` into the problem bodies of
        // the handlers under it, such as the per-user denials.
        .layer(api)
        // Not limited, so a spent quota never locks the operator out.
        .route("/admin/rules/{name}", put(set_rule))
        .with_state(limiter.clone());

    let port: u16 = match std::env::var("PORT") {
        Ok(port) => port
            .parse()
            .map_err(|e| format!("PORT={port:?} is not a port number: {e}"))?,
        Err(_) => 3000,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let base = format!("http://{}", listener.local_addr()?);
    println!("listening on {base} (backend: {})", limiter.backend_name());
    println!(
        "try:\n  \
         curl -i {base}/\n  \
         curl -i -H 'Authorization: Bearer pro-bob' {base}/\n  \
         for i in $(seq 7); do curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'Authorization: Bearer free-alice' {base}/; done\n  \
         curl -X PUT --data 'capacity=20 rate=120/min' {base}/admin/rules/api.tier.free\n  \
         for i in $(seq 4); do curl -s -H 'X-Request-Id: demo-'$i {base}/search; echo; done"
    );

    // Records each peer's address, which the per-address limits key on.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
