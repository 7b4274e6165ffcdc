//! An HTTP API with three limits: per user (the `#[rate_limit]` attribute on
//! what a handler calls), per client address (a layer on the whole router,
//! and a tighter one on one route), and on the whole service (a layer with
//! one key for every request).
//!
//! Runs on the embedded memory backend:
//!     cargo run --example axum_server --features axum
//! on Redis when `REDIS_URL` is set, and on the port in `PORT` (default 3000):
//!     REDIS_URL=redis://127.0.0.1:6379 PORT=8080 cargo run --example axum_server --features axum

use std::net::SocketAddr;

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ratelimit::http::{RateLimitLayer, TooManyRequests};
use ratelimit::{rate_limit, Limiter, Quota, RateLimited};
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

/// Per user: 5 at once, then one a second, whichever address they come from.
#[rate_limit(key = "orders:list:<user_id>", capacity = 5, rate = "1/s")]
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Shows the limiter's warnings, such as a backend failure.
    tracing_subscriber::fmt().with_target(false).init();

    // Redis at REDIS_URL when set, the memory backend otherwise; the
    // attribute and the layers share it.
    let limiter = Limiter::from_env()?;
    ratelimit::install(limiter.clone())?;

    // Per client address on every route: bursts of 20, 10 a second. Behind a
    // reverse proxy, key by `.by_client_ip(TrustedProxies::new([...])?)`
    // instead, or every client has the proxy's address.
    let per_ip = RateLimitLayer::new(limiter.clone(), Quota::new(20, "10/s".parse()?)?)
        .name("per-ip")
        .legacy_headers(true);
    // Searching is dearer: 3 per client address every 10 seconds.
    let search_per_ip =
        RateLimitLayer::new(limiter.clone(), Quota::new(3, "3/10s".parse()?)?).name("search");
    // The whole service: at most 100 at once and 50 a second, from everyone.
    let global = RateLimitLayer::new(limiter.clone(), Quota::new(100, "50/s".parse()?)?)
        .name("global")
        .global();

    let app = Router::new()
        .route("/", get(hello))
        .route("/users/{user_id}/orders", get(orders))
        .route("/search", get(search).route_layer(search_per_ip))
        // The per-IP layer also copies `X-Request-Id` into the 429 bodies of
        // the handlers under it, such as the per-user denials.
        .layer(per_ip)
        .layer(global);

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
         curl -i {base}/users/42/orders\n      \
         # per user: 5 at once, then one a second; user 43 has a bucket of its own\n  \
         for i in $(seq 8); do curl -s -o /dev/null -w '%{{http_code}}\\n' {base}/users/42/orders; done\n  \
         for i in $(seq 4); do curl -s -i -H 'X-Request-Id: demo-'$i {base}/search | head -n 12; done\n      \
         # the 4th is a 429 problem with requestId \"demo-4\", Retry-After and RateLimit fields"
    );

    // Records each peer's address, which the per-IP layers key on.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
