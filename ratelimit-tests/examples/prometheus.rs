//! The limiter's metrics in Prometheus text format, through the `metrics`
//! facade: install any exporter and the counters appear.
//!
//!     cargo run -p ratelimit-tests --example prometheus
//!
//! A service would serve `handle.render()` at `/metrics` (or let the
//! exporter's own HTTP listener do it).

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use ratelimit::{rate_limit, FailurePolicy, Limiter, RateLimited, Request};

#[rate_limit(key = "search:<user>", capacity = 3, rate = "1/min")]
async fn search(user: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "export:<user>", capacity = 1, rate = "1/h", mode = shadow)]
async fn export(user: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    ratelimit::install(Limiter::memory())?;

    for _ in 0..5 {
        let _ = search(1).await; // 3 allowed, 2 denied
        let _ = export(1).await; // 1 allowed, 4 shadow-denied
    }

    // A Redis nobody listens on: every call is a fallback, allowed by the
    // open policy, and the circuit breaker opens.
    let unreachable = Limiter::builder()
        .redis("redis://127.0.0.1:1")
        .timeout(Duration::from_millis(50))
        .failure_policy(FailurePolicy::Open)
        .build()?;
    let quota = ratelimit::Quota::per_second(10)?;
    for _ in 0..5 {
        let _ = unreachable.check(Request::new(&quota, "k")).await;
    }

    println!("{}", handle.render());
    Ok(())
}
