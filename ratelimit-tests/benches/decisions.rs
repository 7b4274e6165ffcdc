//! Memory-backend benchmarks: the attribute's overhead over a direct
//! `Limiter` call, and decisions per second on one and two threads, beside
//! governor's keyed limiter deciding on the same keys (`governor_keyed`).
//!
//!     cargo bench -p ratelimit-tests --bench decisions

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ratelimit::{rate_limit, Limiter, Quota, RateLimited, Request};

/// Large enough that every call is admitted: the benchmark measures the path,
/// not denials.
const CAPACITY: u64 = 1_000_000_000_000;

fn limiter() -> &'static Limiter {
    static LIMITER: OnceLock<Limiter> = OnceLock::new();
    LIMITER.get_or_init(Limiter::memory)
}

fn quota() -> Quota {
    Quota::new(CAPACITY, "1000000000/s".parse().unwrap()).unwrap()
}

#[rate_limit(key = "order:submit:<user_id>", capacity = 1_000_000_000_000, rate = "1000000000/s", limiter = limiter())]
async fn with_attribute(user_id: u64) -> Result<u64, RateLimited> {
    Ok(user_id)
}

async fn direct_prebuilt_key(quota: &Quota, key: &str) -> Result<u64, RateLimited> {
    limiter()
        .check(Request::new(quota, key))
        .await
        .map(|admitted| admitted.decisions()[0].remaining)
}

async fn direct_formatted_key(quota: &Quota, user_id: u64) -> Result<u64, RateLimited> {
    let key = format!("order:submit:{user_id}");
    limiter()
        .check(Request::new(quota, &key))
        .await
        .map(|_| user_id)
}

fn macro_overhead(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let quota = quota();
    let mut group = c.benchmark_group("macro_overhead");
    group.bench_function("direct_acquire_prebuilt_key", |b| {
        b.to_async(&runtime)
            .iter(|| direct_prebuilt_key(&quota, black_box("order:submit:42")))
    });
    group.bench_function("direct_acquire_formatted_key", |b| {
        b.to_async(&runtime)
            .iter(|| direct_formatted_key(&quota, black_box(42)))
    });
    group.bench_function("rate_limit_attribute", |b| {
        b.to_async(&runtime).iter(|| with_attribute(black_box(42)))
    });
    group.finish();
}

/// Runs `decide` `iters` times split over `threads` threads, each on a
/// Tokio current-thread runtime, on 10,000 keys; returns the wall time.
fn on_threads<'k, F: std::future::Future>(
    iters: u64,
    threads: usize,
    keys: &'k [String],
    decide: impl Fn(&'k String) -> F + Sync,
) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let decide = &decide;
            s.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    for i in 0..per_thread {
                        let key = &keys[(i as usize * 7 + t * 5_003) % keys.len()];
                        black_box(decide(key).await);
                    }
                });
            });
        }
    });
    // Criterion divides by iters; threads ran in parallel.
    start.elapsed()
}

/// Decisions per second with `threads` threads deciding on 10,000 keys, on
/// the memory backend and on governor's keyed limiter with the same quota.
fn throughput(c: &mut Criterion) {
    let quota = quota();
    let keys: Vec<String> = (0..10_000).map(|i| format!("user:{i}")).collect();
    let mut group = c.benchmark_group("memory_decisions");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    let governor = governor::RateLimiter::keyed(governor::Quota::per_second(
        std::num::NonZeroU32::new(1_000_000_000).unwrap(),
    ));
    for threads in [1usize, 2] {
        group.bench_with_input(
            BenchmarkId::new("threads", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    on_threads(iters, threads, &keys, |key| async {
                        limiter().check(Request::new(&quota, key)).await.unwrap();
                    })
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("governor_keyed", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| {
                    on_threads(iters, threads, &keys, |key| async {
                        governor.check_key(key).unwrap();
                    })
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, macro_overhead, throughput);
criterion_main!(benches);
