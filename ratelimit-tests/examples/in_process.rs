//! A loop of in-process decisions on 10,000 keys, each admitted, for
//! `benches/in_process.sh` to count instructions under callgrind:
//!
//!     in_process check <n>       `Limiter::check(..).await` on the memory backend
//!     in_process check-recorded <n>
//!                                the same, with a Prometheus recorder installed
//!     in_process attribute <n>   a `#[rate_limit]` function on the memory backend
//!     in_process governor <n>    governor's keyed limiter, `check_key`
//!
//! Both run on a Tokio current-thread runtime, as the criterion group
//! `memory_decisions` does, with a quota that admits every call.

use std::hint::black_box;

use std::sync::OnceLock;

use ratelimit::{rate_limit, Limiter, Quota, RateLimited, Request};

fn limiter() -> &'static Limiter {
    static LIMITER: OnceLock<Limiter> = OnceLock::new();
    LIMITER.get_or_init(Limiter::memory)
}

#[rate_limit(key = "user:<user_id>", capacity = 1_000_000_000_000, rate = "1000000000/s", limiter = limiter())]
async fn limited(user_id: usize) -> Result<usize, RateLimited> {
    Ok(user_id)
}

/// `n` checks on the memory backend, each admitted.
fn checks(runtime: &tokio::runtime::Runtime, keys: &[String], n: usize) {
    let limiter = limiter();
    let quota = Quota::new(1_000_000_000_000, "1000000000/s".parse().unwrap()).unwrap();
    runtime.block_on(async {
        for i in 0..n {
            let key = &keys[(i * 7) % keys.len()];
            let admitted = limiter.check(Request::new(&quota, key)).await;
            black_box(admitted.is_ok());
        }
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(mode), Some(n)) = (
        args.next(),
        args.next().and_then(|n| n.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: in_process check|check-recorded|attribute|governor <decisions>");
        std::process::exit(2);
    };
    let keys: Vec<String> = (0..10_000).map(|i| format!("user:{i}")).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    match mode.as_str() {
        "check" => checks(&runtime, &keys, n),
        "check-recorded" => {
            // As a service exporting the limiter's metrics runs it.
            let _handle = metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("no recorder installed yet");
            checks(&runtime, &keys, n);
        }
        "attribute" => runtime.block_on(async {
            for i in 0..n {
                black_box(limited(black_box((i * 7) % keys.len())).await.is_ok());
            }
        }),
        "governor" => {
            let governor = governor::RateLimiter::keyed(governor::Quota::per_second(
                std::num::NonZeroU32::new(1_000_000_000).unwrap(),
            ));
            runtime.block_on(async {
                for i in 0..n {
                    let key = &keys[(i * 7) % keys.len()];
                    black_box(governor.check_key(key).is_ok());
                }
            });
        }
        other => {
            eprintln!(
                "in_process: unknown mode {other:?} (check, check-recorded, attribute or governor)"
            );
            std::process::exit(2);
        }
    }
}
