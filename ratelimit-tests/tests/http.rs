//! `ratelimit::http` end to end: real servers on ephemeral loopback ports,
//! driven by a real HTTP client.
//!
//! Limiters run on a stopped clock (`ManualClock`), so no bucket refills
//! while a test runs and every number asserted is exact.

mod support;

use support::Decide;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::request::Parts;
use axum::http::HeaderName;
use axum::http::StatusCode;
use axum::response::IntoResponse as _;
use axum::routing::get;
use axum::Router;
use futures::future::join_all;
use ratelimit::http::{
    Exemption, ForwardedHeader, Limit, MissingKey, NamedRule, ProblemRequestIdLayer, QuotaSource,
    RateLimitLayer, TooManyRequests, TrustedProxies,
};
use ratelimit::{rate_limit, FailurePolicy, Limiter, ManualClock, Quota, Rate, RateLimited};
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::Value;

/// Serves `app` on 127.0.0.1 at a free port, recording peer addresses as
/// `axum::serve` does in production; returns the base URL.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind an ephemeral loopback port");
    let addr = listener.local_addr().expect("the listener's address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve the test app");
    });
    format!("http://{addr}")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("build the HTTP client")
}

/// A memory limiter whose clock never moves: buckets never refill.
fn stopped_limiter() -> Limiter {
    Limiter::builder()
        .clock(ManualClock::new(1_000_000_000_000))
        .build()
        .expect("a memory limiter")
}

/// A token bucket of `capacity` that refills one token an hour.
fn hourly(capacity: u64) -> Quota {
    Quota::new(capacity, Rate::per_hour(1).unwrap()).unwrap()
}

async fn ok() -> &'static str {
    "ok"
}

struct Reply {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("a printable header"))
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().expect("a printable header"))
            .collect()
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
    }
}

async fn fetch_with(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = client.get(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("send the request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.expect("read the body");
    Reply {
        status,
        headers,
        body,
    }
}

async fn fetch(client: &reqwest::Client, url: &str) -> Reply {
    fetch_with(client, url, &[]).await
}

/// A request with one header of raw bytes, which need not be visible ASCII.
async fn fetch_raw(client: &reqwest::Client, url: &str, name: &str, value: &[u8]) -> Reply {
    let value = HeaderValue::from_bytes(value).expect("a header value of these bytes");
    let response = client
        .get(url)
        .header(name, value)
        .send()
        .await
        .expect("send the request");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.expect("read the body");
    Reply {
        status,
        headers,
        body,
    }
}

/// The tokens `key` has left under `quota`, read without taking any: how
/// the tests see which bucket a request spent, now that responses never
/// show keys.
async fn left(limiter: &Limiter, quota: &Quota, key: &str) -> u64 {
    limiter
        .decide(quota, key, 0)
        .await
        .expect("read a key on the memory backend")
        .remaining
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_clients_get_exactly_the_capacity() {
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(stopped_limiter(), Limit::per_peer_ip(hourly(10))).name("per-ip"),
    );
    let base = serve(app).await;
    let client = client();

    let replies = join_all((0..50).map(|_| fetch(&client, &base))).await;
    let admitted = replies.iter().filter(|r| r.status == 200).count();
    let limited = replies.iter().filter(|r| r.status == 429).count();
    assert_eq!(admitted, 10, "exactly the capacity is admitted");
    assert_eq!(limited, 40, "every other request is a 429");
    for reply in replies.iter().filter(|r| r.status == 200) {
        assert_eq!(reply.body, "ok", "admitted requests reach the handler");
    }
    for reply in replies.iter().filter(|r| r.status == 429) {
        assert_eq!(reply.json()["code"], "rate_limited", "{}", reply.body);
    }
}

#[tokio::test]
async fn retry_after_is_whole_seconds_rounded_up() {
    let limiter = stopped_limiter();
    let every = |millis: u64, name: &str| {
        let rate = Rate::new(1, Duration::from_millis(millis)).unwrap();
        RateLimitLayer::new(
            limiter.clone(),
            Limit::per_peer_ip(Quota::new(1, rate).unwrap()),
        )
        .name(name)
    };
    let app = Router::new()
        .route("/480ms", get(ok).route_layer(every(480, "a")))
        .route("/1s", get(ok).route_layer(every(1_000, "b")))
        .route("/1200ms", get(ok).route_layer(every(1_200, "c")));
    let base = serve(app).await;
    let client = client();

    for (path, expected) in [("480ms", 1), ("1s", 1), ("1200ms", 2)] {
        let url = format!("{base}/{path}");
        assert_eq!(
            fetch(&client, &url).await.status,
            200,
            "{path}: first request"
        );
        let denied = fetch(&client, &url).await;
        assert_eq!(denied.status, 429, "{path}: second request");
        assert_eq!(
            denied.header("retry-after"),
            Some(expected.to_string().as_str()),
            "{path}: a wait of {path} is {expected} s, never earlier"
        );
        assert_eq!(denied.json()["retryAfter"], expected, "{path}: body");
    }
}

#[tokio::test]
async fn a_denial_is_a_problem_document_with_the_request_id() {
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(stopped_limiter(), Limit::per_peer_ip(hourly(1))).name("per-ip"),
    );
    let base = serve(app).await;
    let client = client();

    assert_eq!(fetch(&client, &base).await.status, 200);
    let denied = fetch_with(&client, &base, &[("x-request-id", "req-7f3a")]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    let body = denied.json();
    assert_eq!(body["type"], "about:blank", "{body}");
    assert_eq!(body["title"], "Too Many Requests", "{body}");
    assert_eq!(body["status"], 429, "{body}");
    assert_eq!(body["code"], "rate_limited", "{body}");
    assert_eq!(
        body["message"], "rate limit `per-ip` exceeded; retry after 3600s",
        "which limit, and when to retry: {body}"
    );
    assert_eq!(body["policy"], "per-ip", "{body}");
    assert_eq!(body["detail"], body["message"], "{body}");
    assert_eq!(body["retryAfter"], 3600, "{body}");
    assert_eq!(denied.header("retry-after"), Some("3600"));
    assert_eq!(body["requestId"], "req-7f3a", "{body}");

    let anonymous = fetch(&client, &base).await;
    assert_eq!(anonymous.status, 429);
    assert!(
        anonymous.json().get("requestId").is_none(),
        "no id is invented: {}",
        anonymous.body
    );
    let oversized = "x".repeat(129);
    let oversized = fetch_with(&client, &base, &[("x-request-id", &oversized)]).await;
    assert!(
        oversized.json().get("requestId").is_none(),
        "ids over 128 bytes are not echoed"
    );
}

#[tokio::test]
async fn every_response_carries_the_ietf_fields() {
    // 3 a minute: one token every 20 s, a full bucket in 60 s.
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(
            stopped_limiter(),
            Limit::per_peer_ip(Quota::per_minute(3).unwrap()),
        )
        .name("per-ip"),
    );
    let base = serve(app).await;
    let client = client();

    for (remaining, reset) in [(2, 20), (1, 40), (0, 60)] {
        let reply = fetch(&client, &base).await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.all("ratelimit-policy"),
            [r#""per-ip";q=3;w=60"#],
            "the policy is the same on every response"
        );
        assert_eq!(
            reply.all("ratelimit"),
            [format!(r#""per-ip";r={remaining};t={reset}"#)],
            "r is what is left, t the seconds until the quota is whole again"
        );
        assert!(
            reply.header("x-ratelimit-limit").is_none(),
            "legacy fields are off by default"
        );
    }
    let denied = fetch(&client, &base).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.all("ratelimit-policy"), [r#""per-ip";q=3;w=60"#]);
    assert_eq!(
        denied.all("ratelimit"),
        [r#""per-ip";r=0;t=20"#],
        "on a denial t is the Retry-After"
    );
    assert_eq!(denied.header("retry-after"), Some("20"));
}

#[tokio::test]
async fn legacy_fields_when_enabled() {
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(
            stopped_limiter(),
            Limit::per_peer_ip(Quota::per_minute(3).unwrap()),
        )
        .name("per-ip")
        .legacy_headers(true),
    );
    let base = serve(app).await;
    let client = client();

    for (remaining, reset) in [("2", "20"), ("1", "40"), ("0", "60")] {
        let reply = fetch(&client, &base).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(reply.header("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(reply.header("x-ratelimit-reset"), Some(reset));
    }
    let denied = fetch(&client, &base).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("x-ratelimit-reset"), Some("20"));
}

#[tokio::test]
async fn nested_layers_list_every_policy_and_the_tightest_legacy_limit() {
    let limiter = stopped_limiter();
    // The inner layer is the tighter one, so the outer one must keep the
    // legacy fields it finds.
    let app = Router::new()
        .route("/", get(ok))
        .layer(
            RateLimitLayer::new(limiter.clone(), Limit::global(hourly(2)))
                .name("all")
                .legacy_headers(true),
        )
        .layer(
            RateLimitLayer::new(limiter, Limit::per_peer_ip(hourly(5)))
                .name("per-ip")
                .legacy_headers(true),
        );
    let base = serve(app).await;
    let client = client();

    let reply = fetch(&client, &base).await;
    assert_eq!(reply.status, 200);
    let mut policies = reply.all("ratelimit-policy");
    policies.sort_unstable();
    assert_eq!(policies, [r#""all";q=2;w=7200"#, r#""per-ip";q=5;w=18000"#]);
    let mut limits = reply.all("ratelimit");
    limits.sort_unstable();
    assert_eq!(limits, [r#""all";r=1;t=3600"#, r#""per-ip";r=4;t=3600"#]);
    assert_eq!(
        reply.header("x-ratelimit-limit"),
        Some("2"),
        "the tighter limit"
    );
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("1"));
}

#[tokio::test]
async fn forwarded_for_counts_only_from_a_trusted_proxy() {
    let limiter = stopped_limiter();
    let behind_proxy = |trusted: &[&str], name: &str| {
        RateLimitLayer::new(
            limiter.clone(),
            Limit::per_client_ip(TrustedProxies::new(trusted).unwrap(), hourly(1)),
        )
        .name(name)
    };
    let app = Router::new()
        // The test client (127.0.0.1) plays the trusted proxy:
        .route(
            "/trusted",
            get(ok).route_layer(behind_proxy(&["127.0.0.1"], "trusted")),
        )
        // ... and here a client talking directly:
        .route(
            "/direct",
            get(ok).route_layer(behind_proxy(&["10.0.0.0/8"], "direct")),
        );
    let base = serve(app).await;
    let client = client();
    let trusted = format!("{base}/trusted");
    let direct = format!("{base}/direct");
    let xff = |value| [("x-forwarded-for", value)];
    let quota = hourly(1);

    // Through the trusted proxy each forwarded client has its own bucket.
    assert_eq!(
        fetch_with(&client, &trusted, &xff("203.0.113.7"))
            .await
            .status,
        200
    );
    let denied = fetch_with(&client, &trusted, &xff("203.0.113.7")).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        left(&limiter, &quota, "http:trusted:ip:203.0.113.7").await,
        0,
        "keyed by the forwarded client"
    );
    assert_eq!(left(&limiter, &quota, "http:trusted:ip:127.0.0.1").await, 1);
    assert_eq!(
        fetch_with(&client, &trusted, &xff("203.0.113.8"))
            .await
            .status,
        200
    );
    // A client that prepends a forged address is still keyed by the address
    // the proxy appended.
    let forged = fetch_with(&client, &trusted, &xff("198.51.100.1, 203.0.113.7")).await;
    assert_eq!(forged.status, 429, "a forged hop gives no fresh bucket");
    assert_eq!(
        left(&limiter, &quota, "http:trusted:ip:198.51.100.1").await,
        1
    );

    // From an untrusted peer the header is ignored: new addresses in it buy
    // nothing.
    assert_eq!(
        fetch_with(&client, &direct, &xff("203.0.113.7"))
            .await
            .status,
        200
    );
    let spoofed = fetch_with(&client, &direct, &xff("203.0.113.8")).await;
    assert_eq!(
        spoofed.status, 429,
        "a spoofed header gives no fresh bucket"
    );
    assert_eq!(
        left(&limiter, &quota, "http:direct:ip:127.0.0.1").await,
        0,
        "keyed by the peer"
    );
}

#[tokio::test]
async fn rfc_7239_forwarded_when_the_proxy_sets_it() {
    let limiter = stopped_limiter();
    let layer = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_client_ip(
            TrustedProxies::new(["127.0.0.0/8"])
                .unwrap()
                .header(ForwardedHeader::Forwarded),
            hourly(1),
        ),
    )
    .name("fwd");
    let base = serve(Router::new().route("/", get(ok)).layer(layer)).await;
    let client = client();
    let fwd = |value| [("forwarded", value)];
    let quota = hourly(1);

    let first = fetch_with(
        &client,
        &base,
        &fwd(r#"for="[2001:db8::1]:4711";proto=http"#),
    )
    .await;
    assert_eq!(first.status, 200);
    // Another address of the same /64 is the same client.
    let same_net = fetch_with(&client, &base, &fwd(r#"for="[2001:db8::2]""#)).await;
    assert_eq!(same_net.status, 429);
    assert_eq!(
        left(&limiter, &quota, "http:fwd:ip:2001%3Adb8%3A%3A%2F64").await,
        0,
        "keyed by the /64, escaped"
    );
    assert_eq!(
        fetch_with(&client, &base, &fwd("for=192.0.2.60"))
            .await
            .status,
        200
    );
    // X-Forwarded-For is not read when the proxy sets Forwarded.
    let xff = [("x-forwarded-for", "198.51.100.1")];
    assert_eq!(fetch_with(&client, &base, &xff).await.status, 200);
    let xff = [("x-forwarded-for", "198.51.100.2")];
    let ignored = fetch_with(&client, &base, &xff).await;
    assert_eq!(ignored.status, 429);
    assert_eq!(left(&limiter, &quota, "http:fwd:ip:127.0.0.1").await, 0);
}

#[tokio::test]
async fn each_route_has_its_own_quota() {
    let limiter = stopped_limiter();
    let app = Router::new()
        .route("/search", get(ok))
        // `Router::route_layer` limits the routes added before it: /search.
        .route_layer(
            RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(hourly(3))).name("search"),
        )
        // A method router's own layer limits that route alone.
        .route(
            "/login",
            get(ok).route_layer(
                RateLimitLayer::new(limiter, Limit::per_peer_ip(hourly(1))).name("login"),
            ),
        )
        .route("/health", get(ok));
    let base = serve(app).await;
    let client = client();
    let (login, search, health) = (
        format!("{base}/login"),
        format!("{base}/search"),
        format!("{base}/health"),
    );

    assert_eq!(fetch(&client, &login).await.status, 200);
    assert_eq!(fetch(&client, &login).await.status, 429, "login allows 1");
    for n in 1..=2 {
        let reply = fetch(&client, &search).await;
        assert_eq!(reply.status, 200, "search request {n}");
        assert_eq!(reply.all("ratelimit-policy"), [r#""search";q=3;w=10800"#]);
    }
    assert_eq!(fetch(&client, &search).await.status, 200, "search allows 3");
    assert_eq!(fetch(&client, &search).await.status, 429);
    for _ in 0..5 {
        let reply = fetch(&client, &health).await;
        assert_eq!(reply.status, 200, "unlimited route");
        assert!(reply.header("ratelimit").is_none(), "no layer, no fields");
    }
}

/// A per-user limit in what a handler calls, keyed by the user id in the path.
#[rate_limit(key = "report:<user_id>", capacity = 2, rate = "1/h", limiter = limiter)]
async fn build_report(limiter: &Limiter, user_id: u64) -> Result<String, TooManyRequests> {
    Ok(format!("report for {user_id}"))
}

/// Exports cost one token per row.
#[rate_limit(
    key = "export:<user_id>",
    capacity = 5,
    rate = "1/h",
    cost = rows,
    limiter = limiter
)]
async fn export(limiter: &Limiter, user_id: u64, rows: u64) -> Result<String, TooManyRequests> {
    Ok(format!("{rows} rows for {user_id}"))
}

async fn report(
    State(limiter): State<Limiter>,
    Path(user_id): Path<u64>,
) -> Result<String, TooManyRequests> {
    build_report(&limiter, user_id).await
}

async fn export_rows(
    State(limiter): State<Limiter>,
    Path((user_id, rows)): Path<(u64, u64)>,
) -> Result<String, TooManyRequests> {
    export(&limiter, user_id, rows).await
}

fn attribute_app() -> Router {
    Router::new()
        .route("/users/{user_id}/report", get(report))
        .route("/users/{user_id}/export/{rows}", get(export_rows))
        .layer(ProblemRequestIdLayer::new())
        .with_state(stopped_limiter())
}

#[tokio::test]
async fn the_attributes_denial_becomes_a_429() {
    let base = serve(attribute_app()).await;
    let client = client();
    let url = format!("{base}/users/7/report");

    for _ in 0..2 {
        let reply = fetch(&client, &url).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "report for 7");
    }
    let denied = fetch_with(&client, &url, &[("x-request-id", "abc-123")]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("3600"));
    assert_eq!(
        denied.all("ratelimit-policy"),
        [r#""build_report";q=2;w=7200"#],
        "the policy is named after the function, with its window"
    );
    assert_eq!(denied.all("ratelimit"), [r#""build_report";r=0;t=3600"#]);
    let body = denied.json();
    assert_eq!(body["code"], "rate_limited", "{body}");
    assert_eq!(
        body["message"], "rate limit `build_report` exceeded; retry after 3600s",
        "the function names the limit, and the key stays out: {body}"
    );
    assert_eq!(body["retryAfter"], 3600, "{body}");
    assert_eq!(
        body["requestId"], "abc-123",
        "ProblemRequestIdLayer adds the id: {body}"
    );
    assert_eq!(
        fetch(&client, &format!("{base}/users/8/report"))
            .await
            .status,
        200,
        "another user has a bucket of their own"
    );
}

/// What a compression layer does to a response: a new body, marked with its
/// encoding, and the parts (so the extensions) kept. Here the encoding
/// reverses the bytes.
async fn encoded(response: axum::response::Response) -> axum::response::Response {
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .expect("read the body");
    let reversed: Vec<u8> = bytes.iter().rev().copied().collect();
    parts
        .headers
        .insert("content-encoding", HeaderValue::from_static("x-reversed"));
    parts.headers.remove("content-length");
    axum::response::Response::from_parts(parts, axum::body::Body::from(reversed))
}

#[tokio::test]
async fn a_body_encoded_inside_the_layers_is_left_as_it_was_encoded() {
    let limited = Router::new()
        .route("/users/{user_id}/report", get(report))
        .layer(axum::middleware::map_response(encoded))
        .with_state(stopped_limiter());
    // The two apps share the handler's limiter: a user each.
    for (user, name, app) in [
        (
            7,
            "ProblemRequestIdLayer",
            limited.clone().layer(ProblemRequestIdLayer::new()),
        ),
        (
            8,
            "RateLimitLayer",
            limited.layer(
                RateLimitLayer::new(stopped_limiter(), Limit::per_peer_ip(hourly(100)))
                    .name("outer"),
            ),
        ),
    ] {
        let base = serve(app).await;
        let client = client();
        let url = format!("{base}/users/{user}/report");
        for _ in 0..2 {
            assert_eq!(fetch(&client, &url).await.status, 200, "{name}");
        }
        let denied = fetch_with(&client, &url, &[("x-request-id", "abc-123")]).await;
        assert_eq!(denied.status, 429, "{name}");
        assert_eq!(denied.header("content-encoding"), Some("x-reversed"));
        let decoded: String = denied.body.chars().rev().collect();
        let body: Value = serde_json::from_str(&decoded).unwrap_or_else(|e| {
            panic!(
                "{name}: the body is no longer what was encoded ({e}): {}",
                denied.body
            )
        });
        assert_eq!(body["code"], "rate_limited", "{name}: {body}");
    }
}

#[tokio::test]
async fn a_cost_above_the_capacity_is_never_worth_retrying() {
    let base = serve(attribute_app()).await;
    let client = client();

    let denied = fetch(&client, &format!("{base}/users/7/export/6")).await;
    assert_eq!(denied.status, 429);
    assert!(
        denied.header("retry-after").is_none(),
        "no Retry-After invites a retry that can never succeed"
    );
    assert!(
        denied.header("ratelimit").is_none(),
        "the quota was not read, so no r=0 is claimed: {:?}",
        denied.headers
    );
    let body = denied.json();
    assert_eq!(body["code"], "cost_exceeds_capacity", "{body}");
    assert!(body.get("retryAfter").is_none(), "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("can never be admitted"),
        "{body}"
    );
    assert_eq!(
        fetch(&client, &format!("{base}/users/7/export/5"))
            .await
            .status,
        200,
        "a cost equal to the capacity is admitted"
    );
}

#[tokio::test]
async fn a_layer_above_a_handler_reports_the_handlers_denial() {
    let limiter = stopped_limiter();
    let app = Router::new()
        .route("/users/{user_id}/report", get(report))
        .layer(
            RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(hourly(10)))
                .name("per-ip")
                .legacy_headers(true),
        )
        .with_state(limiter);
    let base = serve(app).await;
    let client = client();
    let url = format!("{base}/users/7/report");

    for _ in 0..2 {
        assert_eq!(fetch(&client, &url).await.status, 200);
    }
    let denied = fetch_with(&client, &url, &[("x-request-id", "from-layer")]).await;
    assert_eq!(denied.status, 429);
    let mut limits = denied.all("ratelimit");
    limits.sort_unstable();
    assert_eq!(
        limits,
        [r#""build_report";r=0;t=3600"#, r#""per-ip";r=7;t=10800"#],
        "the handler's denial and the layer's own state"
    );
    assert_eq!(
        denied.header("x-ratelimit-limit"),
        Some("2"),
        "the denial's limit"
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("x-ratelimit-reset"), Some("3600"));
    assert_eq!(
        denied.json()["requestId"],
        "from-layer",
        "the layer adds the id to the handler's problem: {}",
        denied.body
    );
}

/// A limiter whose Redis refuses connections (nothing listens on port 1).
fn unreachable_redis(policy: FailurePolicy) -> Limiter {
    Limiter::builder()
        .redis("redis://127.0.0.1:1")
        .timeout(Duration::from_millis(250))
        .failure_policy(policy)
        .closed_retry_after(Duration::from_millis(1_500))
        .build()
        .expect("a Redis limiter is built lazily")
}

#[tokio::test]
async fn a_closed_outage_is_a_503_with_retry_after_and_an_open_one_admits() {
    let closed = unreachable_redis(FailurePolicy::Closed);
    let open = unreachable_redis(FailurePolicy::Open);
    let app = Router::new()
        .route(
            "/closed",
            get(ok).route_layer(
                RateLimitLayer::new(closed, Limit::per_peer_ip(hourly(5)))
                    .name("c")
                    .legacy_headers(true),
            ),
        )
        .route(
            "/open",
            get(ok).route_layer(
                RateLimitLayer::new(open, Limit::per_peer_ip(hourly(5)))
                    .name("o")
                    .legacy_headers(true),
            ),
        );
    let base = serve(app).await;
    let client = client();

    let denied = fetch_with(
        &client,
        &format!("{base}/closed"),
        &[("x-request-id", "outage-1")],
    )
    .await;
    assert_eq!(
        denied.status, 503,
        "the client spent nothing: the limiter could not decide"
    );
    assert_eq!(denied.header("retry-after"), Some("2"), "1.5 s rounds up");
    assert!(
        denied.header("ratelimit").is_none(),
        "no r=0 claims the quota is spent: {:?}",
        denied.headers
    );
    assert!(denied.header("x-ratelimit-remaining").is_none());
    assert_eq!(denied.all("ratelimit-policy"), [r#""c";q=5;w=18000"#]);
    let body = denied.json();
    assert_eq!(body["status"], 503, "{body}");
    assert_eq!(body["title"], "Service Unavailable", "{body}");
    assert_eq!(body["code"], "rate_limiter_unavailable", "{body}");
    assert_eq!(body["retryAfter"], 2, "{body}");
    assert_eq!(body["requestId"], "outage-1", "{body}");
    assert_eq!(
        body["message"],
        "rate limit `c` cannot be checked while the rate limiter is unavailable; retry after 2s",
        "{body}"
    );

    let admitted = fetch(&client, &format!("{base}/open")).await;
    assert_eq!(admitted.status, 200, "failing open admits");
    assert_eq!(admitted.all("ratelimit-policy"), [r#""o";q=5;w=18000"#]);
    assert!(
        admitted.header("ratelimit").is_none(),
        "the remaining quota is unknown, so no r=0 is claimed"
    );
    assert_eq!(admitted.header("x-ratelimit-limit"), Some("5"));
    assert!(admitted.header("x-ratelimit-remaining").is_none());
}

/// A denial by the local fallback's share of the quota is a 429, but says
/// nothing of what the quota has left: no `RateLimit` member and no
/// `X-RateLimit-Remaining`, as for any limit a failure policy decided.
#[tokio::test]
async fn a_local_fallbacks_denial_claims_nothing_of_the_quota() {
    let local = unreachable_redis(FailurePolicy::Local);
    let app = Router::new().route(
        "/local",
        get(ok).route_layer(
            RateLimitLayer::new(local, Limit::per_peer_ip(hourly(2)))
                .name("l")
                .legacy_headers(true),
        ),
    );
    let base = serve(app).await;
    let client = client();
    for _ in 0..2 {
        assert_eq!(fetch(&client, &format!("{base}/local")).await.status, 200);
    }
    let denied = fetch(&client, &format!("{base}/local")).await;
    assert_eq!(denied.status, 429, "{}", denied.body);
    assert_eq!(denied.json()["code"], "rate_limited", "{}", denied.body);
    assert!(denied.header("retry-after").is_some());
    assert!(
        denied.header("ratelimit").is_none(),
        "the local share's r=0 is not the quota's: {:?}",
        denied.headers
    );
    assert!(denied.header("x-ratelimit-remaining").is_none());
}

/// A request a leaky bucket admits for later gives its turn back when its
/// client leaves before the turn comes, as a `#[rate_limit]` call does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_leaves_before_its_turn_gives_the_turn_back() {
    let limiter = Limiter::memory();
    // A queue of 3, one a minute: the second request waits a minute.
    let quota = Quota::leaky_bucket(3, Rate::per_minute(1).unwrap()).unwrap();
    let app = Router::new().route(
        "/paced",
        get(ok).route_layer(
            RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(quota)).name("paced"),
        ),
    );
    let base = serve(app).await;
    assert_eq!(fetch(&client(), &format!("{base}/paced")).await.status, 200);
    let key = "http:paced:ip:127.0.0.1";
    assert_eq!(left(&limiter, &quota, key).await, 2);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let gone = impatient.get(format!("{base}/paced")).send().await;
    assert!(gone.is_err(), "the second request was served at once");
    let mut given_back = false;
    for _ in 0..100 {
        if left(&limiter, &quota, key).await == 2 {
            given_back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        given_back,
        "the turn of a request whose client left stayed taken"
    );
}

/// A check naming one key twice is the service's mistake: a 500 that no
/// retry mends, with no `Retry-After` and no `RateLimit` member.
#[test]
fn a_key_named_twice_is_a_500_that_no_retry_mends() {
    let mut denied = RateLimited::new("k", 5, 0, Duration::MAX);
    denied.cause = ratelimit::DenialCause::DuplicateKey;
    let response = TooManyRequests::from(denied).into_response();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(response.headers().get("retry-after").is_none());
    assert!(response.headers().get("ratelimit").is_none());
}

#[tokio::test]
async fn each_limit_keeps_its_own_failure_policy() {
    // The limiter fails open; one limit of the layer fails closed.
    let limiter = unreachable_redis(FailurePolicy::Open);
    let limits = |global: FailurePolicy| {
        RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(hourly(5)).name("ip"))
            .limit(Limit::global(hourly(50)).name("global").on_error(global))
    };
    let app = Router::new()
        .route(
            "/strict",
            get(ok).route_layer(limits(FailurePolicy::Closed).name("strict")),
        )
        .route(
            "/lenient",
            get(ok).route_layer(limits(FailurePolicy::Open).name("lenient")),
        );
    let base = serve(app).await;
    let client = client();

    let denied = fetch(&client, &format!("{base}/strict")).await;
    assert_eq!(denied.status, 503, "the closed limit denies the request");
    assert_eq!(denied.json()["policy"], "strict.global", "{}", denied.body);
    let mut policies = denied.all("ratelimit-policy");
    policies.sort_unstable();
    assert_eq!(
        policies,
        [
            r#""strict.global";q=50;w=180000"#,
            r#""strict.ip";q=5;w=18000"#
        ]
    );
    let admitted = fetch(&client, &format!("{base}/lenient")).await;
    assert_eq!(admitted.status, 200, "every limit fails open");
    assert!(admitted.header("ratelimit").is_none());
}

#[tokio::test]
async fn header_values_have_buckets_of_their_own_and_share_one_when_missing() {
    let limiter = stopped_limiter();
    let api_key = HeaderName::from_static("x-api-key");
    let app = Router::new()
        .route(
            "/shared",
            get(ok).route_layer(
                RateLimitLayer::new(
                    limiter.clone(),
                    Limit::per_header(api_key.clone(), hourly(1)),
                )
                .name("k"),
            ),
        )
        .route(
            "/optional",
            get(ok).route_layer(
                RateLimitLayer::new(
                    limiter.clone(),
                    Limit::per_header(api_key, hourly(1)).on_missing_key(MissingKey::Unlimited),
                )
                .name("opt"),
            ),
        );
    let base = serve(app).await;
    let client = client();
    let shared = format!("{base}/shared");
    let key = |value| [("x-api-key", value)];

    assert_eq!(
        fetch_with(&client, &shared, &key("alice")).await.status,
        200
    );
    assert_eq!(
        fetch_with(&client, &shared, &key("alice")).await.status,
        429
    );
    assert_eq!(fetch_with(&client, &shared, &key("bob")).await.status, 200);
    // A value that looks like another key's suffix has a bucket of its own.
    let hostile = fetch_with(&client, &shared, &key("alice:{x}")).await;
    assert_eq!(hostile.status, 200, "a bucket of its own");
    let again = fetch_with(&client, &shared, &key("alice:{x}")).await;
    assert_eq!(again.status, 429, "which the same value shares");

    assert_eq!(fetch(&client, &shared).await.status, 200);
    let unknown = fetch(&client, &shared).await;
    assert_eq!(
        unknown.status, 429,
        "requests without a key share one bucket"
    );
    assert_eq!(
        left(&limiter, &hourly(1), "http:k:header:x-api-key:%unknown").await,
        0
    );

    for _ in 0..3 {
        let reply = fetch(&client, &format!("{base}/optional")).await;
        assert_eq!(reply.status, 200, "MissingKey::Unlimited lets them through");
        assert!(reply.header("ratelimit").is_none());
    }
}

#[tokio::test]
async fn bearer_tokens_are_keys_but_never_shown() {
    let layer =
        RateLimitLayer::new(stopped_limiter(), Limit::per_bearer_token(hourly(1))).name("tok");
    let base = serve(Router::new().route("/", get(ok)).layer(layer)).await;
    let client = client();
    let bearer = |token| [("authorization", token)];

    assert_eq!(
        fetch_with(&client, &base, &bearer("Bearer alpha-secret"))
            .await
            .status,
        200
    );
    let denied = fetch_with(&client, &base, &bearer("bearer alpha-secret")).await;
    assert_eq!(denied.status, 429, "the scheme is case-insensitive");
    assert!(
        !denied.body.contains("alpha-secret"),
        "the token is never echoed: {}",
        denied.body
    );
    assert_eq!(
        fetch_with(&client, &base, &bearer("Bearer beta-secret"))
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_closure_chooses_the_key_and_a_global_limit_spans_clients() {
    let limiter = stopped_limiter();
    let per_tenant = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_key(
            |request| {
                let tenant = request.uri.path().strip_prefix("/tenants/")?;
                Some(tenant.to_owned())
            },
            hourly(1),
        ),
    )
    .name("tenant");
    let per_client = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_client_ip(TrustedProxies::new(["127.0.0.1"]).unwrap(), hourly(5)),
    )
    .name("per-ip");
    let everyone = RateLimitLayer::new(limiter.clone(), Limit::global(hourly(3))).name("all");
    let app = Router::new()
        .route("/tenants/{tenant}", get(ok))
        .route_layer(per_tenant)
        .route("/", get(ok))
        .layer(per_client)
        .layer(everyone);
    let base = serve(app).await;
    let client = client();

    assert_eq!(
        fetch(&client, &format!("{base}/tenants/acme")).await.status,
        200
    );
    let denied = fetch(&client, &format!("{base}/tenants/acme")).await;
    assert_eq!(denied.status, 429);
    assert_eq!(left(&limiter, &hourly(1), "http:tenant:key:acme").await, 0);
    assert!(!denied.body.contains("acme"), "{}", denied.body);

    // Two requests so far; the global limit of 3 admits one more, whichever
    // client sends it, although each client has tokens left.
    let xff = |value| [("x-forwarded-for", value)];
    assert_eq!(
        fetch_with(&client, &base, &xff("192.0.2.1")).await.status,
        200
    );
    let denied = fetch_with(&client, &base, &xff("192.0.2.2")).await;
    assert_eq!(denied.status, 429, "the global limit spans clients");
    assert_eq!(denied.json()["policy"], "all", "{}", denied.body);
    assert_eq!(left(&limiter, &hourly(3), "http:all:global").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_on_redis_get_exactly_the_capacity() {
    let redis = support::RedisServer::start();
    // 20 first calls at once, one of which loads the function library:
    // each must get Redis's answer, not the failure policy's.
    let limiter = Limiter::builder()
        .redis(redis.url())
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a Redis limiter");
    let app = Router::new()
        .route("/", get(ok))
        .layer(RateLimitLayer::new(limiter, Limit::per_peer_ip(hourly(5))).name("per-ip"));
    let base = serve(app).await;
    let client = client();

    let replies = join_all((0..20).map(|_| fetch(&client, &base))).await;
    let mut admitted: Vec<&Reply> = replies.iter().filter(|r| r.status == 200).collect();
    assert_eq!(
        admitted.len(),
        5,
        "exactly the capacity, across connections"
    );
    assert_eq!(replies.iter().filter(|r| r.status == 429).count(), 15);
    // Each admitted request saw a different number of tokens left.
    admitted.sort_by_key(|r| r.header("ratelimit").map(str::to_owned));
    let remaining: Vec<&str> = admitted
        .iter()
        .map(|r| r.header("ratelimit").expect("the RateLimit field"))
        .map(|v| v.split(';').nth(1).expect("an r parameter"))
        .collect();
    assert_eq!(
        remaining,
        ["r=0", "r=1", "r=2", "r=3", "r=4"],
        "{remaining:?}"
    );
}

/// One layer of a per-client and a global limit, behind the test client
/// playing a trusted proxy, so requests can come from any address.
fn per_client_and_global(limiter: &Limiter, per_client: u64, global: u64) -> RateLimitLayer {
    RateLimitLayer::new(
        limiter.clone(),
        Limit::per_client_ip(
            TrustedProxies::new(["127.0.0.1"]).unwrap(),
            hourly(per_client),
        )
        .name("ip"),
    )
    .limit(Limit::global(hourly(global)).name("global"))
    .name("api")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_address_leaves_the_global_bucket_untouched() {
    let limiter = stopped_limiter();
    let app = Router::new()
        .route("/", get(ok))
        .layer(per_client_and_global(&limiter, 2, 100));
    let base = serve(app).await;
    let client = client();
    let from = |ip| [("x-forwarded-for", ip)];

    let flooder = from("203.0.113.7");
    let flood = join_all((0..20).map(|_| fetch_with(&client, &base, &flooder))).await;
    assert_eq!(flood.iter().filter(|r| r.status == 200).count(), 2);
    assert_eq!(flood.iter().filter(|r| r.status == 429).count(), 18);
    assert_eq!(
        left(&limiter, &hourly(100), "http:api.global:global").await,
        98,
        "denied requests took no global token: all or nothing"
    );
    let denied = flood.iter().find(|r| r.status == 429).unwrap();
    assert_eq!(denied.json()["policy"], "api.ip", "{}", denied.body);
    let mut policies = denied.all("ratelimit-policy");
    policies.sort_unstable();
    assert_eq!(
        policies,
        [r#""api.global";q=100;w=360000"#, r#""api.ip";q=2;w=7200"#]
    );
    assert_eq!(
        denied.all("ratelimit"),
        [r#""api.ip";r=0;t=3600"#],
        "the global limit was not read, so it has no RateLimit member"
    );

    let other = fetch_with(&client, &base, &from("203.0.113.8")).await;
    assert_eq!(other.status, 200, "another client is not held back");
    let mut limits = other.all("ratelimit");
    limits.sort_unstable();
    assert_eq!(
        limits,
        [r#""api.global";r=97;t=10800"#, r#""api.ip";r=1;t=3600"#],
        "one member per limit"
    );
}

#[tokio::test]
async fn a_tier_closure_picks_the_quota_per_request() {
    let limiter = stopped_limiter();
    let tier = |request: &Parts| match request.headers.get("x-plan") {
        Some(plan) if plan == "pro" => hourly(3),
        _ => hourly(1),
    };
    let layer = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_header(
            HeaderName::from_static("x-api-key"),
            QuotaSource::per_request(tier),
        )
        .name("tier"),
    )
    .name("api");
    let base = serve(Router::new().route("/", get(ok)).layer(layer)).await;
    let client = client();

    let free = [("x-api-key", "alice")];
    let first = fetch_with(&client, &base, &free).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.all("ratelimit-policy"), [r#""api.tier";q=1;w=3600"#]);
    assert_eq!(fetch_with(&client, &base, &free).await.status, 429);

    let pro = [("x-api-key", "bob"), ("x-plan", "pro")];
    for n in 1..=3 {
        let reply = fetch_with(&client, &base, &pro).await;
        assert_eq!(reply.status, 200, "pro request {n} of 3");
        assert_eq!(reply.all("ratelimit-policy"), [r#""api.tier";q=3;w=10800"#]);
    }
    assert_eq!(fetch_with(&client, &base, &pro).await.status, 429);
}

#[tokio::test]
async fn a_named_rule_change_takes_effect_on_the_next_request() {
    let limiter = stopped_limiter();
    let free = NamedRule::new("http-test.tier.free", hourly(1));
    let pro = NamedRule::new("http-test.tier.pro", hourly(10));
    let tier = move |request: &Parts| match request.headers.get("x-plan") {
        Some(plan) if plan == "pro" => pro,
        _ => free,
    };
    let layer = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_header(
            HeaderName::from_static("x-api-key"),
            QuotaSource::rule_per_request(tier),
        )
        .name("tier"),
    )
    .limit(Limit::global(QuotaSource::rule("http-test.global", hourly(100))).name("global"))
    .name("api");
    let base = serve(Router::new().route("/", get(ok)).layer(layer)).await;
    let client = client();
    let alice = [("x-api-key", "alice")];

    assert_eq!(fetch_with(&client, &base, &alice).await.status, 200);
    assert_eq!(
        fetch_with(&client, &base, &alice).await.status,
        429,
        "the free tier's default: 1"
    );
    limiter.rules().set("http-test.tier.free", hourly(3));
    let reply = fetch_with(&client, &base, &alice).await;
    assert_eq!(reply.status, 200, "the raised rule admits the next request");
    assert!(
        reply
            .all("ratelimit-policy")
            .contains(&r#""api.tier";q=3;w=10800"#),
        "{:?}",
        reply.all("ratelimit-policy")
    );
    assert!(reply.all("ratelimit").contains(&r#""api.tier";r=1;t=7200"#));

    limiter.rules().set("http-test.global", hourly(2));
    let bob = [("x-api-key", "bob"), ("x-plan", "pro")];
    let denied = fetch_with(&client, &base, &bob).await;
    assert_eq!(
        denied.status, 429,
        "the global rule, lowered to 2 after 2 requests, denies anyone"
    );
    assert_eq!(denied.json()["policy"], "api.global", "{}", denied.body);
    limiter.rules().remove("http-test.global");
    assert_eq!(
        fetch_with(&client, &base, &bob).await.status,
        200,
        "removed: the default of 100 again"
    );
}

#[tokio::test]
async fn shadow_mode_passes_would_be_denials_with_their_fields() {
    let limiter = stopped_limiter();
    let one = RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(hourly(1)))
        .name("one")
        .shadow(true);
    let several = per_client_and_global(&limiter, 1, 10)
        .name("several")
        .shadow(true);
    let app = Router::new()
        .route("/one", get(ok).route_layer(one))
        .route("/several", get(ok).route_layer(several));
    let base = serve(app).await;
    let client = client();

    for n in 1..=3 {
        let reply = fetch(&client, &format!("{base}/one")).await;
        assert_eq!(reply.status, 200, "request {n}: shadow mode never denies");
        assert_eq!(reply.body, "ok", "the handler ran");
        // The first took the only token; the others would be denied.
        assert_eq!(reply.all("ratelimit"), [r#""one";r=0;t=3600"#]);
        assert_eq!(reply.all("ratelimit-policy"), [r#""one";q=1;w=3600"#]);
    }
    assert_eq!(
        limiter.stats().shadow_denied,
        2,
        "would-be denials are counted as such"
    );

    let url = format!("{base}/several");
    let from = [("x-forwarded-for", "203.0.113.7")];
    for n in 1..=3 {
        let reply = fetch_with(&client, &url, &from).await;
        assert_eq!(reply.status, 200, "request {n}: shadow mode never denies");
        let mut limits = reply.all("ratelimit");
        limits.sort_unstable();
        if n == 1 {
            assert_eq!(
                limits,
                [
                    r#""several.global";r=9;t=3600"#,
                    r#""several.ip";r=0;t=3600"#
                ]
            );
        } else {
            assert_eq!(
                limits,
                [r#""several.ip";r=0;t=3600"#],
                "the would-be denial's fields"
            );
        }
    }
    assert_eq!(
        left(&limiter, &hourly(10), "http:several.global:global").await,
        9,
        "would-be denials take nothing, as denials would not"
    );
    let stats = limiter.stats();
    assert_eq!(
        (stats.shadow_denied, stats.denied),
        (4, 0),
        "a layer of several limits counts would-be denials as such too"
    );

    let closed = RateLimitLayer::new(
        unreachable_redis(FailurePolicy::Closed),
        Limit::per_peer_ip(hourly(5)),
    )
    .name("closed")
    .shadow(true);
    let base = serve(Router::new().route("/", get(ok)).layer(closed)).await;
    let reply = fetch(&client, &base).await;
    assert_eq!(reply.status, 200, "a would-be 503 passes too");
    assert_eq!(reply.all("ratelimit-policy"), [r#""closed";q=5;w=18000"#]);
    assert!(
        reply.header("ratelimit").is_none(),
        "nothing known, nothing claimed"
    );

    let down = unreachable_redis(FailurePolicy::Closed);
    let several = per_client_and_global(&down, 1, 10)
        .name("down")
        .shadow(true);
    let base = serve(Router::new().route("/", get(ok)).layer(several)).await;
    let reply = fetch_with(&client, &base, &from).await;
    assert_eq!(reply.status, 200, "a would-be 503 of several limits passes");
    assert!(reply.header("ratelimit").is_none());
    let stats = down.stats();
    assert_eq!(
        (stats.shadow_denied, stats.fallback_denied),
        (1, 0),
        "counted as a would-be denial, not as a denial by the failure policy"
    );
}

#[tokio::test]
async fn fast_quotas_advertise_their_sustained_rate() {
    let limiter = stopped_limiter();
    let layer = |capacity, rate: &str, name: &str| {
        RateLimitLayer::new(
            limiter.clone(),
            Limit::per_peer_ip(Quota::new(capacity, rate.parse().unwrap()).unwrap()),
        )
        .name(name)
    };
    let app = Router::new()
        .route("/fast", get(ok).route_layer(layer(10, "100/s", "fast")))
        .route("/burst", get(ok).route_layer(layer(20, "10/s", "burst")))
        .route("/slow", get(ok).route_layer(layer(5, "5/min", "slow")));
    let base = serve(app).await;
    let client = client();

    for (path, policy) in [
        // 100 a second can be kept up, 10 at once: not `q=10;w=1`.
        ("fast", r#""fast";q=100;w=1"#),
        ("burst", r#""burst";q=20;w=2"#),
        ("slow", r#""slow";q=5;w=60"#),
    ] {
        let reply = fetch(&client, &format!("{base}/{path}")).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.all("ratelimit-policy"), [policy], "{path}");
    }
}

#[tokio::test]
async fn problem_bodies_name_the_limit_and_never_the_key() {
    let limiter = stopped_limiter();
    let app = Router::new().route(
        "/tenants/{tenant}",
        get(ok).route_layer(
            RateLimitLayer::new(
                limiter,
                Limit::per_key(|request| Some(request.uri.path().to_owned()), hourly(1)),
            )
            .name("tenant"),
        ),
    );
    let base = serve(app).await;
    let client = client();
    let url = format!("{base}/tenants/acme-secret-project");

    assert_eq!(fetch(&client, &url).await.status, 200);
    let denied = fetch(&client, &url).await;
    assert_eq!(denied.status, 429);
    let body = denied.json();
    assert_eq!(
        body["message"], "rate limit `tenant` exceeded; retry after 3600s",
        "{body}"
    );
    assert_eq!(body["detail"], body["message"], "{body}");
    for leak in ["acme-secret-project", "http:", "tenants"] {
        assert!(
            !denied.body.contains(leak),
            "the body shows no key ({leak}): {}",
            denied.body
        );
    }
}

#[tokio::test]
async fn an_unreadable_forwarded_hop_never_lands_in_the_proxys_bucket() {
    let limiter = stopped_limiter();
    // The test client (127.0.0.1) plays the trusted proxy.
    let layer = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_client_ip(TrustedProxies::new(["127.0.0.1"]).unwrap(), hourly(1)),
    )
    .name("xff");
    let base = serve(Router::new().route("/", get(ok)).layer(layer)).await;
    let client = client();
    let quota = hourly(1);
    let proxy_key = "http:xff:ip:127.0.0.1";

    // The client sent bytes outside visible ASCII; the proxy appended the
    // address it saw, on the same line.
    let first = fetch_raw(&client, &base, "x-forwarded-for", b"\xff\xfe, 203.0.113.7").await;
    assert_eq!(first.status, 200);
    assert_eq!(
        left(&limiter, &quota, "http:xff:ip:203.0.113.7").await,
        0,
        "keyed by the address the proxy appended"
    );
    let again = fetch_raw(&client, &base, "x-forwarded-for", b"\xfd, 203.0.113.7").await;
    assert_eq!(again.status, 429, "other bytes buy no fresh bucket");

    // Reached by the walk, such a hop is a client of its own, keyed by its
    // bytes, never the proxy.
    let opaque = fetch_raw(&client, &base, "x-forwarded-for", b"\xc3\xa9t\xe9").await;
    assert_eq!(opaque.status, 200);
    assert_eq!(left(&limiter, &quota, "http:xff:ip:%C3%A9t%E9").await, 0);
    let same = fetch_raw(&client, &base, "x-forwarded-for", b"\xc3\xa9t\xe9").await;
    assert_eq!(same.status, 429, "the same bytes, the same bucket");

    assert_eq!(
        left(&limiter, &quota, proxy_key).await,
        1,
        "nothing reached the proxy's own bucket"
    );
    assert_eq!(
        fetch(&client, &base).await.status,
        200,
        "the proxy's own requests still have their token"
    );
}

#[tokio::test]
async fn distinct_non_utf8_header_values_have_buckets_of_their_own() {
    let limiter = stopped_limiter();
    let layer = RateLimitLayer::new(
        limiter.clone(),
        Limit::per_header(HeaderName::from_static("x-api-key"), hourly(1)),
    )
    .name("raw");
    let base = serve(Router::new().route("/", get(ok)).layer(layer)).await;
    let client = client();

    for value in [&b"\xff"[..], b"\xfe", b"k\xe9y", b"k\xc3\xa9y"] {
        let reply = fetch_raw(&client, &base, "x-api-key", value).await;
        assert_eq!(reply.status, 200, "{value:?} has a bucket of its own");
    }
    let reply = fetch_raw(&client, &base, "x-api-key", b"\xff").await;
    assert_eq!(reply.status, 429, "and the same value shares it");
}

/// A header keyed on is most often a credential: its value never appears
/// in a key (in Redis, in logs), nor in a denial; the key holds its digest.
#[tokio::test]
async fn a_header_value_never_appears_in_its_key() {
    let server = support::RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(
        limiter,
        Limit::per_header(HeaderName::from_static("x-api-key"), hourly(1)),
    )
    .name("api");
    let base = serve(Router::new().route("/", get(ok)).layer(layer)).await;
    let client = client();
    let secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc";
    let (first, denied) = (
        fetch_with(&client, &base, &[("x-api-key", secret)]).await,
        fetch_with(&client, &base, &[("x-api-key", secret)]).await,
    );
    assert_eq!((first.status, denied.status), (200, 429));
    assert!(!denied.body.contains(secret), "{}", denied.body);
    let mut redis = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert!(
        keys[0].starts_with("rl:http:api:header:x-api-key:") && !keys[0].contains("sk_live"),
        "{keys:?}"
    );
}

#[test]
#[should_panic(expected = "give each a name of its own with `Limit::name`")]
fn two_unnamed_limits_in_one_layer_are_refused() {
    let layer = RateLimitLayer::new(Limiter::memory(), Limit::per_peer_ip(hourly(1)))
        .limit(Limit::global(hourly(5)));
    let _app: Router = Router::new().route("/", get(ok)).layer(layer);
}

/// A custom prefix that begins another limit's, where a value could spell
/// the rest: a client sending `x-tenant: all` had the key of the global
/// limit, and got a 500 (the check named one key twice) at every request,
/// each logged as an error.
#[test]
#[should_panic(
    expected = "the key prefix `tenant:` of the limit `api.tenant` begins the key prefix \
                `tenant:all` of `api.all`"
)]
fn prefixes_whose_keys_could_meet_are_refused() {
    let layer = RateLimitLayer::new(
        Limiter::memory(),
        Limit::per_key(
            |request: &Parts| {
                let tenant = request.headers.get("x-tenant")?;
                Some(tenant.to_str().ok()?.to_owned())
            },
            hourly(100),
        )
        .name("tenant")
        .key_prefix("tenant:"),
    )
    .limit(
        Limit::global(hourly(1_000))
            .name("all")
            .key_prefix("tenant:all"),
    )
    .name("api");
    let _app: Router = Router::new().route("/", get(ok)).layer(layer);
}

/// Prefixes one begins where a value cannot spell the rest (a separator
/// follows), and equal ones, which share buckets.
#[test]
fn prefixes_apart_by_a_separator_are_kept_and_equal_ones_refused() {
    let layer = |prefixes: [&str; 2]| {
        RateLimitLayer::new(
            Limiter::memory(),
            Limit::per_peer_ip(hourly(1))
                .name("a")
                .key_prefix(prefixes[0]),
        )
        .limit(Limit::global(hourly(5)).name("b").key_prefix(prefixes[1]))
    };
    let _app: Router = Router::new()
        .route("/", get(ok))
        .layer(layer(["tenant:", "tenant:all:global"]));
    let equal = std::panic::catch_unwind(|| {
        let _app: Router = Router::new()
            .route("/", get(ok))
            .layer(layer(["same:", "same:"]));
    });
    assert!(equal.is_err(), "equal prefixes share buckets");
}

/// Tenants by API key, as a cache or a database would answer them: after an
/// await.
async fn tenant_of(api_key: Option<String>) -> Option<String> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    match api_key?.as_str() {
        "k-acme-1" | "k-acme-2" => Some("acme".to_owned()),
        "k-globex" => Some("globex".to_owned()),
        _ => None,
    }
}

#[tokio::test]
async fn an_async_key_source_limits_per_awaited_key() {
    let limiter = stopped_limiter();
    let per_tenant = Limit::per_key_async(
        |request: &Parts| {
            let api_key = request
                .headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            tenant_of(api_key)
        },
        hourly(2),
    )
    .name("tenant");
    let app = Router::new()
        .route("/", get(ok))
        .layer(RateLimitLayer::new(limiter.clone(), per_tenant).name("api"));
    let base = serve(app).await;
    let client = client();
    let with_key = |key: &'static str| [("x-api-key", key)];

    // Two keys of one tenant share its bucket.
    assert_eq!(
        fetch_with(&client, &base, &with_key("k-acme-1"))
            .await
            .status,
        200
    );
    assert_eq!(
        fetch_with(&client, &base, &with_key("k-acme-2"))
            .await
            .status,
        200
    );
    let denied = fetch_with(&client, &base, &with_key("k-acme-1")).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.json()["policy"], "api.tenant", "{}", denied.body);
    // Another tenant has a bucket of its own.
    assert_eq!(
        fetch_with(&client, &base, &with_key("k-globex"))
            .await
            .status,
        200
    );
    // Unknown keys share one bucket: leaving the key out escapes nothing.
    assert_eq!(
        fetch_with(&client, &base, &with_key("k-nobody"))
            .await
            .status,
        200
    );
    assert_eq!(fetch(&client, &base).await.status, 200);
    assert_eq!(fetch(&client, &base).await.status, 429);
    assert_eq!(
        left(&limiter, &hourly(2), "http:api.tenant:key:acme").await,
        0
    );
    assert_eq!(
        left(&limiter, &hourly(2), "http:api.tenant:key:globex").await,
        1
    );
}

#[tokio::test]
async fn a_denial_hook_shapes_the_response_and_the_layer_keeps_its_fields() {
    let layer = RateLimitLayer::new(stopped_limiter(), Limit::per_peer_ip(hourly(1)).name("ip"))
        .limit(Limit::global(hourly(100)).name("global"))
        .name("api")
        .on_denied(|denial| {
            let body = serde_json::json!({
                "error": "slow_down",
                "limit": denial.limit(),
                "path": denial.request().uri.path(),
                "q": denial.policy().quota_units(),
                "w": denial.policy().window_secs(),
                "retry": denial.retry_after_secs(),
                "cause": format!("{:?}", denial.denied().cause),
            });
            (StatusCode::SERVICE_UNAVAILABLE, body.to_string()).into_response()
        });
    let app = Router::new().route("/search", get(ok)).layer(layer);
    let base = serve(app).await;
    let client = client();
    let url = format!("{base}/search");

    assert_eq!(fetch(&client, &url).await.status, 200);
    let denied = fetch(&client, &url).await;
    assert_eq!(denied.status, 503, "the hook's status");
    let body = denied.json();
    assert_eq!(body["error"], "slow_down", "{body}");
    assert_eq!(body["limit"], "api.ip", "{body}");
    assert_eq!(body["path"], "/search", "{body}");
    assert_eq!(
        (body["q"].as_u64(), body["w"].as_u64()),
        (Some(1), Some(3600)),
        "{body}"
    );
    assert_eq!(body["retry"], 3600, "{body}");
    assert_eq!(body["cause"], "Quota", "{body}");
    assert_eq!(
        denied.header("retry-after"),
        Some("3600"),
        "added by the layer"
    );
    assert_eq!(
        denied.all("ratelimit-policy"),
        [r#""api.ip";q=1;w=3600"#, r#""api.global";q=100;w=360000"#]
    );
    assert_eq!(denied.all("ratelimit"), [r#""api.ip";r=0;t=3600"#]);

    // A hook that sends the default problem gets each field once.
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(stopped_limiter(), Limit::per_peer_ip(hourly(1)))
            .name("api")
            .on_denied(|denial| denial.problem().message("slow down").into_response()),
    );
    let base = serve(app).await;
    assert_eq!(fetch(&client, &base).await.status, 200);
    let denied = fetch(&client, &base).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.json()["message"], "slow down", "{}", denied.body);
    assert_eq!(denied.all("ratelimit-policy"), [r#""api";q=1;w=3600"#]);
    assert_eq!(denied.all("ratelimit"), [r#""api";r=0;t=3600"#]);
}

/// A hook that logs the denial it is given (`{denial:?}`) writes no
/// credential of the request: no header value, no query.
#[tokio::test]
async fn a_denials_debug_shows_no_header_value_or_query() {
    let logged = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = logged.clone();
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(stopped_limiter(), Limit::per_peer_ip(hourly(1)))
            .name("api")
            .on_denied(move |denial| {
                log.lock().unwrap().push(format!("{denial:?}"));
                denial.problem().into_response()
            }),
    );
    let base = serve(app).await;
    let client = client();
    let url = format!("{base}/?api_key=QUERYSECRET");
    let secrets = [
        ("authorization", "Bearer sk_live_TOKENSECRET"),
        ("cookie", "session=COOKIESECRET"),
    ];
    assert_eq!(fetch_with(&client, &url, &secrets).await.status, 200);
    assert_eq!(fetch_with(&client, &url, &secrets).await.status, 429);
    let logged = logged.lock().unwrap();
    let [line] = &logged[..] else {
        panic!("one denial logged: {logged:?}");
    };
    for secret in ["QUERYSECRET", "TOKENSECRET", "COOKIESECRET"] {
        assert!(!line.contains(secret), "{secret} in {line}");
    }
    for shown in [
        "\"api\"",
        "GET",
        "path: \"/\"",
        "\"authorization\"",
        "\"cookie\"",
    ] {
        assert!(line.contains(shown), "{shown} not in {line}");
    }
}

#[tokio::test]
async fn exemptions_pass_unasked_and_are_counted() {
    let limiter = stopped_limiter();
    let quota = hourly(1);
    // The test client connects from 127.0.0.1.
    let office = Exemption::peers("office", ["127.0.0.0/8"]).unwrap();
    // A layer of its own name per route, so each has buckets of its own.
    let layer = |name: &str, exemption: Exemption| {
        RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(quota))
            .name(name)
            .exempt(exemption)
    };
    let app = Router::new()
        .route("/office", get(ok))
        .route_layer(layer("office", office))
        .route(
            "/health",
            get(ok).layer(layer(
                "health",
                Exemption::when("health", |request| {
                    request.headers.contains_key("x-health-check")
                }),
            )),
        )
        .route(
            "/monitor",
            get(ok).layer(layer(
                "monitor",
                Exemption::clients(
                    "monitoring",
                    TrustedProxies::new(["127.0.0.1"]).unwrap(),
                    ["198.51.100.7"],
                )
                .unwrap(),
            )),
        );
    let base = serve(app).await;
    let client = client();

    for _ in 0..5 {
        let reply = fetch(&client, &format!("{base}/office")).await;
        assert_eq!(reply.status, 200);
        assert!(
            reply.header("ratelimit").is_none(),
            "an exempt request is not limited"
        );
    }
    for _ in 0..3 {
        let health = [("x-health-check", "1")];
        assert_eq!(
            fetch_with(&client, &format!("{base}/health"), &health)
                .await
                .status,
            200
        );
    }
    for _ in 0..3 {
        let monitor = [("x-forwarded-for", "198.51.100.7")];
        assert_eq!(
            fetch_with(&client, &format!("{base}/monitor"), &monitor)
                .await
                .status,
            200
        );
    }
    // Not covered: limited as usual (by the peer's address here).
    let other = [("x-forwarded-for", "198.51.100.8")];
    assert_eq!(
        fetch_with(&client, &format!("{base}/monitor"), &other)
            .await
            .status,
        200
    );
    assert_eq!(
        fetch_with(&client, &format!("{base}/monitor"), &other)
            .await
            .status,
        429
    );
    assert_eq!(fetch(&client, &format!("{base}/health")).await.status, 200);
    assert_eq!(fetch(&client, &format!("{base}/health")).await.status, 429);
    assert_eq!(limiter.stats().exempt, 11);
    assert_eq!(limiter.stats().allowed, 2);
}

async fn flaky(Path(code): Path<u16>) -> StatusCode {
    StatusCode::from_u16(code).expect("a status code")
}

#[tokio::test]
async fn responses_the_layer_refunds_do_not_spend_the_quota() {
    let limiter = stopped_limiter();
    // Count only successes: failed requests give their token back.
    let successes = RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(hourly(2)))
        .name("ok-only")
        .refund_on(|status| !status.is_success());
    // Count only server errors: a client retrying a failing call is limited.
    let failures = RateLimitLayer::new(limiter.clone(), Limit::per_peer_ip(hourly(2)))
        .name("errors-only")
        .refund_on(|status| !status.is_server_error());
    let app = Router::new()
        .route("/ok/{code}", get(flaky).layer(successes))
        .route("/errors/{code}", get(flaky).layer(failures));
    let base = serve(app).await;
    let client = client();

    for _ in 0..5 {
        assert_eq!(fetch(&client, &format!("{base}/ok/500")).await.status, 500);
        assert_eq!(fetch(&client, &format!("{base}/ok/404")).await.status, 404);
    }
    assert_eq!(fetch(&client, &format!("{base}/ok/200")).await.status, 200);
    assert_eq!(fetch(&client, &format!("{base}/ok/200")).await.status, 200);
    assert_eq!(fetch(&client, &format!("{base}/ok/200")).await.status, 429);

    for _ in 0..5 {
        assert_eq!(
            fetch(&client, &format!("{base}/errors/200")).await.status,
            200
        );
    }
    assert_eq!(
        fetch(&client, &format!("{base}/errors/503")).await.status,
        503
    );
    assert_eq!(
        fetch(&client, &format!("{base}/errors/502")).await.status,
        502
    );
    assert_eq!(
        fetch(&client, &format!("{base}/errors/200")).await.status,
        429
    );
    assert_eq!(limiter.stats().refunded, 15);
}

/// A service that fails (an `Err`, which has no status: a server's 500 once
/// an outer layer or the server answers it) is refunded as a 500.
#[tokio::test]
async fn a_service_error_is_refunded_as_a_server_error() {
    use tower::{Layer as _, ServiceExt as _};
    let limiter = stopped_limiter();
    let service = tower::service_fn(
        |request: axum::http::Request<axum::body::Body>| async move {
            match request.uri().path() {
                "/fail" => Err("the database is down"),
                _ => Ok(StatusCode::OK.into_response()),
            }
        },
    );
    let call = |layer: &RateLimitLayer, path: &'static str| {
        let service = layer.layer(service);
        async move {
            let request = axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap();
            service.oneshot(request).await.map(|r| r.status())
        }
    };
    // Counting successes only: failures give their token back.
    let successes = RateLimitLayer::new(limiter.clone(), Limit::global(hourly(2)))
        .name("ok-only")
        .refund_on(|status| !status.is_success());
    for _ in 0..5 {
        assert_eq!(call(&successes, "/fail").await, Err("the database is down"));
    }
    assert_eq!(call(&successes, "/").await, Ok(StatusCode::OK));
    assert_eq!(call(&successes, "/").await, Ok(StatusCode::OK));
    assert_eq!(
        call(&successes, "/").await,
        Ok(StatusCode::TOO_MANY_REQUESTS)
    );
    // Counting server errors only: a failure is one.
    let failures = RateLimitLayer::new(limiter.clone(), Limit::global(hourly(2)))
        .name("errors-only")
        .refund_on(|status| !status.is_server_error());
    for _ in 0..5 {
        assert_eq!(call(&failures, "/").await, Ok(StatusCode::OK));
    }
    assert_eq!(call(&failures, "/fail").await, Err("the database is down"));
    assert_eq!(call(&failures, "/fail").await, Err("the database is down"));
    assert_eq!(
        call(&failures, "/").await,
        Ok(StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(limiter.stats().refunded, 10);
}

/// A per-user lookup where only found users count: a miss gives its token
/// back (`refund_on = err`).
#[rate_limit(key = "profile:<user_id>", capacity = 2, rate = "1/h", limiter = limiter, refund_on = err)]
async fn load_profile(limiter: &Limiter, user_id: u64) -> Result<String, ProfileError> {
    if user_id == 0 {
        return Err(ProfileError::NotFound);
    }
    Ok(format!("profile {user_id}"))
}

enum ProfileError {
    Limited(RateLimited),
    NotFound,
}

impl From<RateLimited> for ProfileError {
    fn from(denied: RateLimited) -> Self {
        ProfileError::Limited(denied)
    }
}

impl axum::response::IntoResponse for ProfileError {
    fn into_response(self) -> axum::response::Response {
        match self {
            ProfileError::Limited(denied) => TooManyRequests::from(denied).into_response(),
            ProfileError::NotFound => StatusCode::NOT_FOUND.into_response(),
        }
    }
}

async fn profile(
    State(limiter): State<Limiter>,
    Path(user_id): Path<u64>,
) -> Result<String, ProfileError> {
    load_profile(&limiter, user_id).await
}

#[tokio::test]
async fn the_attributes_refund_on_lets_failed_calls_cost_nothing() {
    let limiter = stopped_limiter();
    let app = Router::new()
        .route("/profiles/{user_id}", get(profile))
        .with_state(limiter.clone());
    let base = serve(app).await;
    let client = client();

    for _ in 0..5 {
        assert_eq!(
            fetch(&client, &format!("{base}/profiles/0")).await.status,
            404
        );
    }
    assert_eq!(
        fetch(&client, &format!("{base}/profiles/0")).await.status,
        404,
        "misses never spend"
    );
    let url = format!("{base}/profiles/7");
    assert_eq!(fetch(&client, &url).await.status, 200);
    assert_eq!(fetch(&client, &url).await.status, 200);
    let denied = fetch(&client, &url).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.all("ratelimit-policy"),
        [r#""load_profile";q=2;w=7200"#]
    );
    assert_eq!(limiter.stats().refunded, 6);
}

/// A router served without `into_make_service_with_connect_info`, as
/// `axum::serve(listener, app)` does: no request has a peer address. A limit
/// per client address is then the server's mistake, answered `500` with the
/// misconfigured problem and logged at error level with the call that mends
/// it, never one bucket shared by every client (which would answer six
/// clients behind a proxy at two requests an hour each 200, 200, then 429
/// for the other four).
#[tokio::test]
async fn a_server_that_records_no_peer_address_is_named_not_given_one_bucket() {
    let proxies = TrustedProxies::new(["10.0.0.0/8", "127.0.0.0/8"]).unwrap();
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(
            stopped_limiter(),
            Limit::per_client_ip(proxies, hourly(2)).name("ip"),
        )
        .name("api"),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client();
    let (replies, log) = support::logged(async {
        let mut replies = Vec::new();
        for client_ip in 1..=6 {
            let forwarded = format!("192.0.2.{client_ip}");
            replies.push(fetch_with(&client, &url, &[("x-forwarded-for", &forwarded)]).await);
        }
        replies
    })
    .await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [500; 6], "log: {log}");
    let body: Value = serde_json::from_str(&replies[0].body).unwrap();
    assert_eq!(body["code"], "rate_limit_misconfigured", "{body}");
    assert_eq!(body["policy"], "api.ip", "{body}");
    assert!(
        !replies[0].body.contains("ConnectInfo") && replies[0].headers.get("retry-after").is_none(),
        "the cause is the service's, told in its log, not to the client: {}",
        replies[0].body
    );
    assert!(
        log.contains("ERROR") && log.contains("into_make_service_with_connect_info"),
        "the log names the mistake and its mend: {log}"
    );
}

/// The same server with the layer in shadow mode, which never refuses a
/// request: every request reaches the handler, and the log names the
/// mistake.
#[tokio::test]
async fn a_shadow_layer_with_no_peer_address_refuses_nothing() {
    let app = Router::new().route("/", get(ok)).layer(
        RateLimitLayer::new(stopped_limiter(), Limit::per_peer_ip(hourly(1)).name("ip"))
            .name("api")
            .shadow(true),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client();
    let (statuses, log) = support::logged(async {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(fetch(&client, &url).await.status);
        }
        statuses
    })
    .await;
    assert_eq!(statuses, [200; 3]);
    assert!(
        log.contains("ERROR") && log.contains("into_make_service_with_connect_info"),
        "the log names the mistake and its mend: {log}"
    );
}
