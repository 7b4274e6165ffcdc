//! Added latency per call while Redis is frozen (SIGSTOP): before the circuit
//! breaker opens every call waits out the timeout; once it is open, calls are
//! answered by the local fallback limiter without touching the network.
//! Measured side by side with a healthy Redis.
//!
//!     cargo bench -p ratelimit-tests --bench frozen_redis

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use ratelimit::{BreakerConfig, FailurePolicy, Limiter, Quota, Request};
use support::RedisServer;

/// Short, so the benchmark of the timeout path stays short; the figure to
/// read is the ratio to the timeout.
const TIMEOUT: Duration = Duration::from_millis(10);

fn limiter(server: &RedisServer, failures_to_open: u32) -> Limiter {
    let mut breaker = BreakerConfig::default();
    breaker.failures_to_open = failures_to_open;
    // Keep an open breaker open for the whole measurement.
    breaker.initial_backoff = Duration::from_secs(3600);
    breaker.max_backoff = Duration::from_secs(3600);
    Limiter::builder()
        .redis(server.url())
        .timeout(TIMEOUT)
        .failure_policy(FailurePolicy::Local)
        .breaker(breaker)
        .build()
        .unwrap()
}

fn frozen(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let quota = Quota::new(1_000_000_000, "1000000000/s".parse().unwrap()).unwrap();
    let healthy = limiter(&server, 3);
    let no_breaker = limiter(&server, 0);
    let breaker = limiter(&server, 3);
    runtime.block_on(async {
        for l in [&healthy, &no_breaker, &breaker] {
            l.check(Request::new(&quota, "warm-up")).await.unwrap();
        }
    });

    let mut group = c.benchmark_group("frozen_redis");
    group.bench_function("healthy_redis", |b| {
        b.to_async(&runtime)
            .iter(|| healthy.check(Request::new(&quota, "k")))
    });
    server.freeze();
    runtime.block_on(async {
        for _ in 0..5 {
            let _ = breaker.check(Request::new(&quota, "k")).await;
        }
    });
    assert_ne!(breaker.circuit_state(), ratelimit::CircuitState::Closed);
    group.bench_function("breaker_open_local_fallback", |b| {
        b.to_async(&runtime)
            .iter(|| breaker.check(Request::new(&quota, "k")))
    });
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("before_breaker_opens_timeout", |b| {
        b.to_async(&runtime)
            .iter(|| no_breaker.check(Request::new(&quota, "k")))
    });
    group.finish();
    server.thaw();
}

criterion_group!(benches, frozen);
criterion_main!(benches);
