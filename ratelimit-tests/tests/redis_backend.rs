//! The Redis backend against real, private redis-server processes.

mod support;

use support::{fault, Decide};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use ratelimit::{
    Algorithm, DenialCause, Error, ErrorKind, FailurePolicy, Limiter, ManualClock, Quota, Rate,
    Request,
};
use redis::AsyncCommands;
use support::{logged, window, RedisServer};

fn redis_limiter(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("build a Redis limiter")
}

fn limiters_with_clock(server: &RedisServer, clock: &ManualClock) -> (Limiter, Limiter) {
    // The scripts themselves are under test: no deny cache in front of them.
    let redis = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .clock(clock.clone())
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let memory = Limiter::builder()
        .memory()
        .clock(clock.clone())
        .build()
        .unwrap();
    (redis, memory)
}

/// Eight service instances, each with its own connection, 64 tasks each, one
/// key, for about three seconds (windows: from just after one boundary to
/// the middle of the third window): the admitted count never exceeds what
/// the algorithm allows, and with what is left at the end reaches at least
/// 99% of what it allows callers that never pause.
async fn eight_instances_on_one_key(quota: Quota) {
    // One run at a time: each keeps 512 callers busy, and the lower bound
    // below (the run fills what the algorithm allows) holds only while the
    // callers get the machine's time, which five such runs at once on two
    // cores do not give them.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start();
    let instances: Vec<Limiter> = (0..8).map(|_| redis_limiter(&server)).collect();
    // Open every connection and load the script before the clock starts.
    for (i, limiter) in instances.iter().enumerate() {
        limiter
            .decide(&quota, &format!("warm-up:{i}"), 1)
            .await
            .unwrap();
    }
    let wall_micros = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    // Buckets: three seconds from now. Windows: start just after a window
    // boundary (within the first quarter of the window, else at the next
    // one) and stop at a fixed instant, the middle of the third window, so
    // a late wake-up cannot stretch the run into a window it leaves unfilled.
    let mut deadline = wall_micros() + 3_000_000;
    if let Some(window) = quota.window() {
        let w = window.as_micros() as u64;
        for _ in 0..5 {
            let next = (wall_micros() / w + 1) * w + 1_000;
            tokio::time::sleep(Duration::from_micros(next.saturating_sub(wall_micros()))).await;
            if wall_micros() % w < w / 4 {
                break;
            }
        }
        deadline = (wall_micros() / w + 2) * w + w / 2;
    }

    let admitted = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start_wall = wall_micros();
    let mut tasks = Vec::new();
    for limiter in &instances {
        for _ in 0..64 {
            let (limiter, admitted, errors) = (limiter.clone(), admitted.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                while wall_micros() < deadline {
                    match limiter.decide(&quota, "hot", 1).await {
                        Ok(d) if d.allowed => {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let end_wall = wall_micros();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    // What the run left untaken: a wait the deny cache answers ends up to a
    // round trip late (never early), so under load the last round trip's
    // tokens (or a window's last admissions) may still be there. Taken or
    // left, nothing may be lost.
    let before = wall_micros();
    let left = instances[0].inspect(&quota, "hot", 0).await.unwrap();
    let left = left.remaining as f64;
    // A window's room read after the window the run ended in says nothing
    // about the run: then only what it admitted counts, up to its deadline.
    let (left, counted_until) = match quota.window() {
        Some(window)
            if before / window.as_micros() as u64 != deadline / window.as_micros() as u64 =>
        {
            (0.0, deadline)
        }
        _ => (left, before),
    };
    // The sliding window counter's admissions and room at `to` when callers
    // take whatever it allows from `start_wall` on: each window to its last
    // millisecond (where the previous window still weighs 1/window_ms), the
    // last to `to`. Greedy is the most it can admit: a window's admissions
    // leave the next one less room than they took.
    let sliding_window_greedy = |to: u64| -> f64 {
        let (limit, w) = (quota.capacity(), quota.window().unwrap().as_micros() as u64);
        let window_ms = w / 1_000;
        let (mut total, mut previous) = (0, 0);
        for window in start_wall / w..=to / w {
            let elapsed_ms = if window == to / w {
                (to - window * w) / 1_000
            } else {
                window_ms - 1
            };
            let weight = window_ms - elapsed_ms;
            let current =
                ((limit * window_ms).saturating_sub(previous * weight) / window_ms).min(limit);
            total += current;
            previous = current;
        }
        total as f64
    };
    // What the algorithm allows from `start_wall` to `to`, at most.
    let allowed_until = |to: u64| -> f64 {
        match quota.window() {
            None => {
                quota.capacity() as f64
                    + quota.rate().per_second_f64() * (to - start_wall) as f64 / 1e6
            }
            Some(window) => {
                let w = window.as_micros() as u64;
                let windows = match quota.algorithm() {
                    // A burst every window length from the first admission.
                    Algorithm::SlidingLog => (to - start_wall) / w + 1,
                    Algorithm::SlidingWindow => return sliding_window_greedy(to),
                    // Every aligned window touched.
                    _ => to / w - start_wall / w + 1,
                };
                (quota.capacity() * windows) as f64
            }
        }
    };
    // Anything admitted by Redis happened before the last response; calls
    // were made without pause until the deadline.
    let most = allowed_until(end_wall) + 1.0;
    let least = 0.99 * allowed_until(counted_until);
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "no call may fail\n{}",
        server.log()
    );
    assert!(
        admitted <= most,
        "{quota:?}: admitted {admitted} exceeds the bound {most:.1}"
    );
    assert!(
        admitted + left >= least,
        "{quota:?}: admitted {admitted}, and {left} left, under 99% of what the run allows ({least:.1})"
    );
}

/// A second's worth of burst: a bucket full while every caller stalls loses
/// what flows in meanwhile, which a loaded machine's stall of a tenth of a
/// second did to a capacity of 100.
fn bucket(algorithm: Algorithm) -> Quota {
    Quota::builder(algorithm)
        .capacity(1_000)
        .rate(Rate::per_second(1_000).unwrap())
        .build()
        .unwrap()
}

fn windowed(algorithm: Algorithm) -> Quota {
    Quota::builder(algorithm)
        .limit(400)
        .window(Duration::from_secs(1))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_admit_exactly_the_token_bucket_bound() {
    eight_instances_on_one_key(bucket(Algorithm::TokenBucket)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_admit_exactly_the_gcra_bound() {
    eight_instances_on_one_key(bucket(Algorithm::Gcra)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_admit_exactly_the_leaky_bucket_bound() {
    eight_instances_on_one_key(bucket(Algorithm::LeakyBucket)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_admit_exactly_the_fixed_window_bound() {
    eight_instances_on_one_key(windowed(Algorithm::FixedWindow)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_admit_exactly_the_sliding_log_bound() {
    eight_instances_on_one_key(windowed(Algorithm::SlidingLog)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_instances_stay_within_the_sliding_window_bound() {
    eight_instances_on_one_key(windowed(Algorithm::SlidingWindow)).await;
}

fn any_quota() -> impl Strategy<Value = Quota> {
    let buckets = (
        prop::sample::select(vec![
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
        ]),
        1u64..20,
        prop::sample::select(vec!["3/s", "1/s", "7/min", "1000/s", "2.5/s", "1/250ms"]),
    )
        .prop_map(|(algorithm, capacity, rate)| {
            Quota::builder(algorithm)
                .capacity(capacity)
                .rate(rate.parse().unwrap())
                .build()
                .unwrap()
        });
    let windows = (
        prop::sample::select(vec![
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
        ]),
        1u64..20,
        prop::sample::select(vec!["100ms", "1s", "3s", "1m"]),
    )
        .prop_map(|(algorithm, limit, window)| {
            Quota::builder(algorithm)
                .limit(limit)
                .window(Quota::parse_window(window).unwrap())
                .build()
                .unwrap()
        });
    prop_oneof![buckets, windows]
}

/// Every algorithm's script and its Rust twin decide alike on random sequences
/// of (time step, cost), with the caller's clock.
#[test]
fn redis_script_and_memory_backend_make_the_same_decisions() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let case = AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 256,
        ..ProptestConfig::default()
    };
    proptest!(config, |(
        quota in any_quota(),
        events in proptest::collection::vec((0u64..1_500_000, 0u64..25), 1..60),
    )| {
        let capacity = quota.capacity();
        let clock = ManualClock::new(1_700_000_000_000_000);
        let (redis, memory) = runtime.block_on(async { limiters_with_clock(&server, &clock) });
        let key = format!("diff:{}", case.fetch_add(1, Ordering::Relaxed));
        for (step, cost) in events {
            clock.advance(Duration::from_micros(step));
            let (from_redis, from_memory) = runtime.block_on(async {
                (redis.decide(&quota, &key, cost).await, memory.decide(&quota, &key, cost).await)
            });
            match (from_redis, from_memory) {
                (Ok(r), Ok(m)) => prop_assert_eq!(r, m, "quota {:?}, cost {}", quota, cost),
                (Err(r), Err(m))
                    if matches!(r.cause, DenialCause::CostExceedsCapacity { .. }) && r == m =>
                {
                    prop_assert!(cost > capacity)
                }
                (r, m) => prop_assert!(false, "redis {:?} vs memory {:?}", r, m),
            }
        }
    });
}

#[tokio::test]
async fn time_going_backwards_mints_no_tokens_in_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000);
    let (limiter, _) = limiters_with_clock(&server, &clock);
    let quota = Quota::new(3, Rate::per_second(1).unwrap()).unwrap();
    for _ in 0..3 {
        assert!(limiter.decide(&quota, "k", 1).await.unwrap().allowed);
    }
    for back in [1u64, 1_000, 2_000_000, 60_000_000] {
        clock.set(1_700_000_000_000_000 - back);
        let d = limiter.decide(&quota, "k", 1).await.unwrap();
        assert!(!d.allowed, "{back} µs back admitted: {d:?}");
        assert_eq!(d.remaining, 0);
    }
}

#[tokio::test]
async fn a_cost_above_capacity_is_never_not_now() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let quota = Quota::new(10, Rate::per_second(1).unwrap()).unwrap();
    let seen = limiter.inspect(&quota, "big", 11).await.unwrap();
    assert!(
        !seen.allowed && seen.retry_after == Duration::MAX,
        "{seen:?}"
    );
    let denied = limiter
        .check(Request::new(&quota, "big").cost(11))
        .await
        .unwrap_err();
    assert_eq!(denied.cause, DenialCause::CostExceedsCapacity { cost: 11 });
    assert!(!denied.is_retryable());
    // The bucket was not touched: the full capacity is still there.
    let d = limiter.decide(&quota, "big", 10).await.unwrap();
    assert!(d.allowed && d.remaining == 0, "{d:?}");
}

#[tokio::test]
async fn state_expires_once_the_bucket_is_full_again_and_denials_write_nothing() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let mut redis = server.connection().await;
    // Two tokens, refilled at 10/s: empty, the bucket is full after 200 ms.
    let quota = Quota::new(2, Rate::per_second(10).unwrap()).unwrap();
    assert!(limiter.decide(&quota, "exp", 2).await.unwrap().allowed);
    let pttl: i64 = redis.pttl("rl:exp").await.unwrap();
    assert!(
        (150..=200).contains(&pttl),
        "PTTL {pttl} ms, expected just under 200"
    );
    let before: String = redis.get("rl:exp").await.unwrap();
    let denied = limiter.decide(&quota, "exp", 1).await.unwrap();
    assert!(!denied.allowed);
    let after: String = redis.get("rl:exp").await.unwrap();
    assert_eq!(before, after, "a denial must not write");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let exists: bool = redis.exists("rl:exp").await.unwrap();
    assert!(
        !exists,
        "the key must be gone once the bucket is full again"
    );
    let d = limiter.decide(&quota, "exp", 2).await.unwrap();
    assert!(d.allowed, "a full bucket after expiry: {d:?}");
}

#[tokio::test]
async fn a_value_another_writer_left_is_an_error_never_a_decision() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let mut redis = server.connection().await;
    // Values no algorithm of this crate writes, then another algorithm's state.
    let sliding_window = Quota::sliding_window(5, Duration::from_secs(1)).unwrap();
    limiter.decide(&sliding_window, "sw", 1).await.unwrap();
    let foreign: Vec<(&str, String)> = vec![
        ("text", "hello".into()),
        ("float", "1.5".into()),
        ("negative", "-3".into()),
        ("sw", redis.get("rl:sw").await.unwrap()),
    ];
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        let quota = Quota::builder(algorithm)
            .capacity(5)
            .rate(Rate::per_second(1).unwrap())
            .build()
            .unwrap();
        for (name, value) in &foreign {
            let key = format!("{algorithm}:{name}");
            let _: () = redis.set(format!("rl:{key}"), value).await.unwrap();
            // A fresh limiter each time: errors in a row would open its breaker.
            match redis_limiter(&server).inspect(&quota, &key, 1).await {
                Err(error @ Error::ForeignValue { .. }) => {
                    assert!(error.to_string().contains("another writer"), "{error}")
                }
                other => panic!("{algorithm} read {value:?} as {other:?}"),
            }
            let kept: String = redis.get(format!("rl:{key}")).await.unwrap();
            assert_eq!(&kept, value, "{algorithm} overwrote {value:?}");
        }
    }
}

#[tokio::test]
async fn script_and_function_flushes_between_calls_are_invisible_to_the_caller() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let mut redis = server.connection().await;
    let quota = Quota::new(6, Rate::per_minute(6).unwrap()).unwrap();
    for i in 0..6u64 {
        let d = limiter.decide(&quota, "flush", 1).await.unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 5 - i);
        // The library goes with FUNCTION FLUSH, the script with SCRIPT FLUSH.
        let what = if i % 2 == 0 { "FUNCTION" } else { "SCRIPT" };
        let _: () = redis::cmd(what)
            .arg("FLUSH")
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let d = limiter.decide(&quota, "flush", 1).await.unwrap();
    assert!(!d.allowed, "state survived the flushes: {d:?}");
    assert_eq!(
        server.command_calls(&["evalsha"]).await,
        0,
        "every decision ran as a function"
    );
    assert_eq!(
        server.command_calls(&["function|load"]).await,
        4,
        "the library was loaded first, and again after each FUNCTION FLUSH"
    );
}

/// After a `FUNCTION FLUSH`, every call in flight meets the missing
/// function: one of them loads the library, and the others call again,
/// rather than each compiling it anew (on every master of a cluster, sent
/// to every replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_meet_a_flushed_library_load_it_once() {
    let server = RedisServer::start();
    // 400 calls at once, and a library load among them: the timeout leaves
    // every one Redis's own answer on a loaded machine.
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(5))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    assert!(limiter.decide(&quota, "warm", 1).await.unwrap().allowed);
    let before = server.command_calls(&["function|load"]).await;
    let mut redis = server.connection().await;
    for round in 0..3 {
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut redis)
            .await
            .unwrap();
        let calls = (0..400).map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let key = format!("flushed:{round}:{i}");
                limiter.decide(&quota, &key, 1).await
            })
        });
        for decided in futures::future::join_all(calls).await {
            assert!(decided.unwrap().unwrap().allowed);
        }
    }
    assert_eq!(
        server.command_calls(&["function|load"]).await - before,
        3,
        "one load a flush"
    );
}

/// The ways Redis takes no writes while it still runs reads, each set and
/// cleared with `CONFIG SET` on a server started with [`NoWrites::ARGS`].
#[derive(Clone, Copy, Debug)]
enum NoWrites {
    /// Over `maxmemory` (`OOM`).
    OutOfMemory,
    /// Fewer replicas than `min-replicas-to-write` (`NOREPLICAS`).
    TooFewReplicas,
    /// A save that failed, with `stop-writes-on-bgsave-error` (`MISCONF`).
    FailedSave,
}

impl NoWrites {
    const ALL: [NoWrites; 3] = [
        NoWrites::OutOfMemory,
        NoWrites::TooFewReplicas,
        NoWrites::FailedSave,
    ];
    /// Saves configured (so that a failed one stops writes), and `dir`
    /// settable.
    const ARGS: [&'static str; 4] = ["--save", "3600 1", "--enable-protected-configs", "yes"];

    /// The error code Redis refuses writes with.
    fn code(self) -> &'static str {
        match self {
            NoWrites::OutOfMemory => "OOM",
            NoWrites::TooFewReplicas => "NOREPLICAS",
            NoWrites::FailedSave => "MISCONF",
        }
    }

    /// Servers that refuse writes this way, without and with the module.
    fn servers() -> [(RedisServer, &'static str); 2] {
        let module = support::native_module();
        let mut with_module = NoWrites::ARGS.to_vec();
        with_module.extend(["--loadmodule", module.to_str().unwrap()]);
        [
            (RedisServer::start_with(&NoWrites::ARGS), "function"),
            (RedisServer::start_with(&with_module), "module"),
        ]
    }

    async fn set(self, redis: &mut redis::aio::MultiplexedConnection) {
        match self {
            NoWrites::OutOfMemory => {
                support::config_set(redis, "maxmemory-policy", "noeviction").await;
                support::config_set(redis, "maxmemory", "1").await;
            }
            NoWrites::TooFewReplicas => {
                support::config_set(redis, "min-replicas-to-write", "1").await;
            }
            NoWrites::FailedSave => {
                support::config_set(redis, "stop-writes-on-bgsave-error", "yes").await;
                // No file can be made there, even by root.
                support::config_set(redis, "dir", "/proc").await;
                let _: String = redis::cmd("BGSAVE").query_async(redis).await.unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let info: String = redis::cmd("INFO")
                        .arg("persistence")
                        .query_async(redis)
                        .await
                        .unwrap();
                    if info.contains("rdb_last_bgsave_status:err") {
                        break;
                    }
                    assert!(Instant::now() < deadline, "the save did not fail: {info}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    async fn clear(self, redis: &mut redis::aio::MultiplexedConnection) {
        match self {
            NoWrites::OutOfMemory => support::config_set(redis, "maxmemory", "0").await,
            NoWrites::TooFewReplicas => {
                support::config_set(redis, "min-replicas-to-write", "0").await;
            }
            NoWrites::FailedSave => {
                support::config_set(redis, "stop-writes-on-bgsave-error", "no").await;
            }
        }
    }
}

/// Spends `key` of `quota` through another limiter instance, so that no
/// deny cache or lease of the limiter under test answers for Redis.
async fn spent_by_another_instance(server: &RedisServer, quota: &Quota, key: &str) {
    let other = redis_limiter(server);
    for _ in 0..quota.capacity() {
        assert!(other.decide(quota, key, 1).await.unwrap().allowed);
    }
}

/// A Redis that takes no writes for now (out of memory, short of replicas,
/// after a failed save) still runs reads: a denial, which writes nothing,
/// is still answered, on the function and on the module, with the library
/// loaded or not, and admissions refused one after another never open the
/// breaker over those denials.
#[tokio::test]
async fn a_redis_that_takes_no_writes_still_answers_denials() {
    for no_writes in NoWrites::ALL {
        for (server, path) in NoWrites::servers() {
            let context = format!("{no_writes:?}, {path}");
            let mut redis = server.connection().await;
            let quota = Quota::new(2, Rate::per_minute(2).unwrap()).unwrap();
            spent_by_another_instance(&server, &quota, "full").await;
            let limiter = redis_limiter(&server);
            no_writes.set(&mut redis).await;
            // A denial writes nothing, so such a Redis still gives it; an
            // admission must write, and its refusal is an error for the
            // failure policy.
            let denied = limiter.decide(&quota, "full", 1).await;
            let (admitted, log) = logged(limiter.decide(&quota, "full:fresh", 1)).await;
            // Admissions refused one after another do not open the breaker:
            // Redis answers, and its denials go on being its own.
            for i in 0..5 {
                let refused = limiter.decide(&quota, &format!("full:fresh:{i}"), 1).await;
                let error = refused.expect_err("an admission needs a write");
                assert_eq!(
                    fault(&error),
                    Some(ErrorKind::Unavailable),
                    "{context}: {error}"
                );
            }
            let denied_after = limiter.decide(&quota, "full", 1).await;
            // The same with the library gone (a flush is a write), which
            // such a Redis will not load.
            no_writes.clear(&mut redis).await;
            let _: () = redis::cmd("FUNCTION")
                .arg("FLUSH")
                .query_async(&mut redis)
                .await
                .unwrap();
            no_writes.set(&mut redis).await;
            let denied_unloaded = redis_limiter(&server).decide(&quota, "full", 1).await;
            no_writes.clear(&mut redis).await;
            let denied =
                denied.unwrap_or_else(|e| panic!("{context}: a denial needs no write: {e}"));
            assert!(!denied.allowed, "{context}: {denied:?}");
            let denied_after = denied_after
                .unwrap_or_else(|e| panic!("{context}: a denial after refused admissions: {e}"));
            assert!(!denied_after.allowed, "{context}: {denied_after:?}");
            let error = admitted.expect_err("an admission needs a write");
            assert_eq!(
                fault(&error),
                Some(ErrorKind::Unavailable),
                "{context}: {error}"
            );
            assert!(
                log.contains(no_writes.code()),
                "{context}: the log names Redis's refusal: {log}"
            );
            let denied = denied_unloaded
                .unwrap_or_else(|e| panic!("{context}: no library loaded either: {e}"));
            assert!(!denied.allowed, "{context}: {denied:?}");
        }
    }
}

/// A denial that shares a script call with an admission is still a denial
/// when Redis takes no writes: the call is refused at the admission's
/// write, before anything was written, and the failure policy must not
/// answer the denial.
#[tokio::test]
async fn a_redis_that_takes_no_writes_answers_a_denial_batched_with_an_admission() {
    for no_writes in NoWrites::ALL {
        for (server, path) in NoWrites::servers() {
            let context = format!("{no_writes:?}, {path}");
            let mut redis = server.connection().await;
            let quota = Quota::new(2, Rate::per_minute(2).unwrap()).unwrap();
            spent_by_another_instance(&server, &quota, "full").await;
            let limiter = redis_limiter(&server);
            assert!(limiter.decide(&quota, "warm", 1).await.unwrap().allowed);
            no_writes.set(&mut redis).await;
            let check = [
                Request::new(&quota, "full"),
                Request::new(&quota, "full:other"),
            ];
            // Queued together on this thread, so one script call carries
            // them all.
            let (denied, admitted, checked) = tokio::join!(
                limiter.decide(&quota, "full", 1),
                limiter.decide(&quota, "full:fresh", 1),
                limiter.decide_all(&check),
            );
            no_writes.clear(&mut redis).await;
            let denied = denied.unwrap_or_else(|e| {
                panic!("{context}: a denial needs no write, whatever shares its call: {e}")
            });
            assert!(!denied.allowed, "{context}: {denied:?}");
            let error = admitted.expect_err("an admission needs a write");
            assert_eq!(
                fault(&error),
                Some(ErrorKind::Unavailable),
                "{context}: {error}"
            );
            let denied = checked.expect_err("a check denied on one of its keys");
            assert_eq!(
                denied.cause,
                DenialCause::Quota,
                "{context}: the check is denied by its spent key, not failed: {denied}"
            );
        }
    }
}

/// While Redis takes no writes, the calls that it refuses before they run
/// (the module's command, FCALL, and `FUNCTION LOAD` of a library it lost)
/// are not sent again with every call: each would cost a round trip, and
/// the load sends the whole library, to a server already in trouble. The
/// script decides for a while, and the refused ways are tried again after.
#[tokio::test]
async fn a_redis_that_takes_no_writes_is_not_sent_what_it_refuses_at_every_call() {
    const CALLS: u64 = 30;
    let refused = ["ratelimit.decide", "fcall", "function|load"];
    for no_writes in NoWrites::ALL {
        for (server, path) in NoWrites::servers() {
            let context = format!("{no_writes:?}, {path}");
            let mut redis = server.connection().await;
            let quota = Quota::new(2, Rate::per_minute(2).unwrap()).unwrap();
            spent_by_another_instance(&server, &quota, "full").await;
            let _: () = redis::cmd("FUNCTION")
                .arg("FLUSH")
                .query_async(&mut redis)
                .await
                .unwrap();
            // No cached denial answers for Redis.
            let limiter = Limiter::builder()
                .redis(server.url())
                .timeout(Duration::from_secs(2))
                .deny_cache_max_keys(0)
                .build()
                .unwrap();
            no_writes.set(&mut redis).await;
            let before = server.commands_sent(&refused).await;
            for _ in 0..CALLS {
                let denied = limiter.decide(&quota, "full", 1).await;
                let denied = denied.unwrap_or_else(|e| panic!("{context}: {e}"));
                assert!(!denied.allowed, "{context}: {denied:?}");
            }
            let sent = server.commands_sent(&refused).await - before;
            let scripts = server.command_calls(&["evalsha"]).await;
            no_writes.clear(&mut redis).await;
            assert!(
                sent <= 6,
                "{context}: {sent} calls refused before they ran, for {CALLS} decisions"
            );
            assert!(scripts >= CALLS, "{context}: {scripts} by EVALSHA");
        }
    }
}

/// A master demoted to a replica behind the address the limiter was given
/// (a DNS name or a proxy that now leads to the new master): its
/// connections stay open, and every call on them is refused `READONLY`, so
/// the limiter connects to the address again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_demoted_behind_its_address_is_left_for_the_one_it_leads_to() {
    let (old, new) = (RedisServer::start(), RedisServer::start());
    let relay = support::Relay::start(old.port()).await;
    let limiter = Limiter::builder()
        .redis(relay.url())
        .timeout(Duration::from_secs(1))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    // One admission a key, each on a key of its own: no lease answers for
    // Redis.
    let quota = Quota::new(1, Rate::per_hour(1).unwrap()).unwrap();
    // Batches take turns on the limiter's connections: each is made.
    for i in 0..4 {
        let key = format!("before:{i}");
        assert!(limiter.decide(&quota, &key, 1).await.unwrap().allowed);
    }
    // The old master follows the new one, and the address leads there.
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new.port())
        .query_async(&mut old.connection().await)
        .await
        .unwrap();
    relay.lead_to(new.port());
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut refused = 0;
    let key = loop {
        let key = format!("user:{}", refused + 1);
        match limiter.decide(&quota, &key, 1).await {
            Ok(decision) => {
                assert!(decision.allowed, "{decision:?}");
                break key;
            }
            // Refused by the replica, or by the breaker after that.
            Err(denied) => {
                assert!(
                    matches!(
                        fault(&denied),
                        Some(ErrorKind::WrongServer | ErrorKind::CircuitOpen)
                    ),
                    "{denied}"
                );
                refused += 1;
            }
        }
        assert!(
            Instant::now() < deadline,
            "still on the demoted master after {refused} refusals"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut connection = new.connection().await;
    let held: bool = connection.exists(format!("rl:{key}")).await.unwrap();
    assert!(held, "{key} decided on the new master");
}

/// A command the library uses, renamed away (as hardening guides advise):
/// a call that fails on it inside the function, after it wrote, is that
/// call's error, sent once. It is never taken for a missing function,
/// reloaded and run again, which would apply its writes again (Valkey says
/// "Unknown command called from script", which reads like FCALL's own
/// "unknown command").
#[tokio::test]
async fn a_command_renamed_away_fails_its_call_once() {
    let server = RedisServer::start_with(&["--rename-command", "PEXPIRE", ""]);
    let limiter = redis_limiter(&server);
    let log = Quota::sliding_log(10, Duration::from_secs(60)).unwrap();
    let error = limiter
        .decide(&log, "renamed", 1)
        .await
        .expect_err("the log's expiry cannot be set");
    let mut redis = server.connection().await;
    let members: u64 = redis.zcard("rl:renamed").await.unwrap();
    assert_eq!(members, 1, "the call ran once: {error}");
    assert_eq!(
        server.command_calls(&["function|load"]).await,
        1,
        "loaded once, when it was missing"
    );
}

/// A library load refused for a while (here too few replicas to write) is
/// tried again once the server takes writes: calls go back to the function
/// rather than by EVALSHA for the rest of the process.
#[tokio::test]
async fn a_library_load_refused_for_a_while_is_tried_again() {
    let server = RedisServer::start_with(&["--min-replicas-to-write", "1"]);
    let limiter = redis_limiter(&server);
    let quota = Quota::new(1, Rate::per_hour(1).unwrap()).unwrap();
    // Spent beforehand, so that the call below only denies, which a server
    // short of replicas still answers by EVALSHA.
    let mut redis = server.connection().await;
    support::config_set(&mut redis, "min-replicas-to-write", "0").await;
    assert!(
        redis_limiter(&server)
            .decide(&quota, "spent", 1)
            .await
            .unwrap()
            .allowed
    );
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut redis)
        .await
        .unwrap();
    support::config_set(&mut redis, "min-replicas-to-write", "1").await;
    let denied = limiter.decide(&quota, "spent", 1).await.unwrap();
    assert!(!denied.allowed, "{denied:?}");
    let by_evalsha = server.command_calls(&["evalsha"]).await;
    assert!(by_evalsha > 0, "answered by EVALSHA");
    support::config_set(&mut redis, "min-replicas-to-write", "0").await;
    // Past the second in which calls go by EVALSHA alone after a refusal.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(limiter.decide(&quota, "fresh", 1).await.unwrap().allowed);
    assert_eq!(
        server.command_calls(&["evalsha"]).await,
        by_evalsha,
        "once the server takes writes, the function is loaded and called again"
    );
}

/// Current-thread: the batching task that logs runs on this thread.
#[tokio::test]
async fn the_switch_to_evalsha_is_logged_without_the_keys_of_the_call() {
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    let limiter = redis_limiter(&server);
    let quota = Quota::new(3, Rate::per_minute(3).unwrap()).unwrap();
    let (decision, logs) = logged(limiter.decide(&quota, "token:s3cr3t-api-key", 1)).await;
    assert!(decision.unwrap().allowed);
    assert!(logs.contains("calling it by EVALSHA"), "{logs}");
    // Redis's reply to an unknown command quotes its arguments.
    assert!(!logs.contains("s3cr3t"), "a key reached the log: {logs}");
}

#[tokio::test]
async fn a_redis_without_functions_decides_by_evalsha() {
    // As a Redis older than 7.0: FCALL is an unknown command.
    let server = RedisServer::start_with(&["--rename-command", "FCALL", ""]);
    let limiter = redis_limiter(&server);
    let mut redis = server.connection().await;
    let quota = Quota::new(3, Rate::per_minute(3).unwrap()).unwrap();
    for i in 0..3u64 {
        let d = limiter.decide(&quota, "old", 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 2 - i), "{d:?}");
        // Loaded again on NOSCRIPT.
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    assert!(!limiter.decide(&quota, "old", 1).await.unwrap().allowed);
    let check = limiter
        .decide_all(&[
            ratelimit::Request::new(&quota, "old:a"),
            ratelimit::Request::new(&quota, "old:b"),
        ])
        .await
        .unwrap();
    assert!(check.iter().all(|d| d.allowed), "{check:?}");
    let peeked = limiter.inspect(&quota, "old:a", 1).await.unwrap();
    assert_eq!(peeked.remaining, 1, "{peeked:?}");
    // Six calls, and the NOSCRIPT replies answered by loading the script.
    assert!(server.command_calls(&["evalsha"]).await >= 6);
    assert!(server.command_calls(&["script|load"]).await >= 3);
}

#[tokio::test]
async fn a_check_with_a_sliding_log_asks_for_other_types_once() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let log = Quota::builder(Algorithm::SlidingLog)
        .limit(100)
        .window(Duration::from_secs(60))
        .build()
        .unwrap();
    let bucket = Quota::new(100, Rate::per_minute(100).unwrap()).unwrap();
    let check = [
        ratelimit::Request::new(&log, "exists:log"),
        ratelimit::Request::new(&bucket, "exists:bucket"),
    ];
    // The first check finds both keys absent; then both exist, the log as a
    // sorted set, which MGET reads as absent.
    limiter.decide_all(&check).await.unwrap();
    let before = server.command_calls(&["exists"]).await;
    for _ in 0..5 {
        limiter.decide_all(&check).await.unwrap();
    }
    let exists = server.command_calls(&["exists"]).await - before;
    assert_eq!(exists, 5, "one EXISTS a check, not one per key");
}

#[tokio::test]
async fn prefixes_keep_limiters_apart() {
    let server = RedisServer::start();
    let a = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .prefix("a:")
        .build()
        .unwrap();
    let b = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .prefix("b:")
        .build()
        .unwrap();
    let quota = Quota::new(1, Rate::per_minute(1).unwrap()).unwrap();
    assert!(a.decide(&quota, "k", 1).await.unwrap().allowed);
    assert!(b.decide(&quota, "k", 1).await.unwrap().allowed);
    assert!(!a.decide(&quota, "k", 1).await.unwrap().allowed);
    let mut redis = server.connection().await;
    let mut keys: Vec<String> = redis.keys("*").await.unwrap();
    keys.sort();
    assert_eq!(keys, ["a:k", "b:k"]);
}

/// With Redis down, a decision is an error (never a denial), and `acquire`
/// applies the failure policy within the timeout.
#[tokio::test]
async fn redis_down_is_an_error_and_the_failure_policy_decides() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let open = Limiter::builder()
        .redis(server.url())
        .timeout(timeout)
        .build()
        .unwrap();
    let closed = Limiter::builder()
        .redis(server.url())
        .timeout(timeout)
        .failure_policy(FailurePolicy::Closed)
        .closed_retry_after(Duration::from_secs(1))
        .build()
        .unwrap();
    let quota = Quota::per_second(10).unwrap();
    assert!(open.decide(&quota, "k", 1).await.unwrap().allowed);
    assert!(closed.decide(&quota, "k", 1).await.unwrap().allowed);
    server.kill();

    for _ in 0..3 {
        let started = Instant::now();
        let err = open.decide(&quota, "k", 1).await.unwrap_err();
        assert!(fault(&err).is_some(), "{err:?}");
        let admitted = open
            .check(Request::new(&quota, "k"))
            .await
            .expect("fail open allows");
        let d = admitted.decisions()[0];
        assert!(d.allowed && d.fallback, "{d:?}");
        let denied = closed.check(Request::new(&quota, "k")).await.unwrap_err();
        assert!(
            matches!(denied.cause, DenialCause::BackendUnavailable { .. }),
            "{denied:?}"
        );
        assert_eq!(denied.retry_after, Duration::from_secs(1));
        assert!(
            started.elapsed() < 4 * timeout,
            "three calls took {:?} with a {timeout:?} timeout",
            started.elapsed()
        );
    }
}

/// Several dimensions at once, all or nothing, in one script: after the IP
/// dimension denies, the user dimension's remaining is unchanged.
#[tokio::test]
async fn check_all_consumes_every_dimension_or_none() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let per_user = Quota::new(10, Rate::per_minute(10).unwrap()).unwrap();
    let per_ip = Quota::gcra(2, Rate::per_minute(2).unwrap()).unwrap();
    let global = Quota::sliding_log(100, Duration::from_secs(60)).unwrap();
    let dims = |ip: &'static str| {
        [
            Request::new(&per_user, "user:1").rule("user"),
            Request::new(&per_ip, ip).rule("ip"),
            Request::new(&global, "global").rule("global"),
        ]
    };
    limiter.check(dims("ip:a")).await.unwrap();
    limiter.check(dims("ip:a")).await.unwrap();
    let denied = limiter.check(dims("ip:a")).await.unwrap_err();
    assert_eq!((denied.key.as_str(), denied.rule), ("ip:a", Some("ip")));
    assert!(denied.retry_after > Duration::from_secs(29), "{denied:?}");
    let user = limiter.decide(&per_user, "user:1", 0).await.unwrap();
    assert_eq!(
        user.remaining, 8,
        "the denied call took nothing from the user"
    );
    let global_left = limiter.decide(&global, "global", 0).await.unwrap();
    assert_eq!(global_left.remaining, 98);
    // Another IP is admitted, and every dimension consumes.
    let admitted = limiter.check(dims("ip:b")).await.unwrap();
    let remaining: Vec<u64> = admitted.decisions().iter().map(|d| d.remaining).collect();
    assert_eq!(remaining, [7, 1, 97]);
    // A key given twice is a caller's mistake, not a denial by a quota.
    let twice = [Request::new(&per_user, "k"), Request::new(&per_ip, "k")];
    let denied = limiter.check(twice).await.unwrap_err();
    assert_eq!(denied.cause, DenialCause::DuplicateKey, "{denied:?}");
    assert!(!denied.is_retryable());
    // Once enforced and once in shadow mode, too: nothing is taken.
    let mixed = [twice[0], twice[1].shadow(true)];
    let denied = limiter.check(mixed).await.unwrap_err();
    assert_eq!(denied.cause, DenialCause::DuplicateKey, "{denied:?}");
    let k = limiter.decide(&per_user, "k", 0).await.unwrap();
    assert_eq!(
        k.remaining,
        per_user.capacity(),
        "a refused check took from k"
    );
}

/// Many callers at once: their decisions go to Redis in batches, one script
/// call deciding for many keys, and every caller gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_decisions_are_batched_and_each_answered() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let quota = Quota::new(3, Rate::per_minute(3).unwrap()).unwrap();
    limiter.decide(&quota, "warm-up", 1).await.unwrap();
    let mut redis = server.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..400u64)
        .map(|i| {
            let (limiter, quota) = (limiter.clone(), quota);
            tokio::spawn(async move {
                limiter
                    .decide(&quota, &format!("user:{}", i % 100), 1)
                    .await
            })
        })
        .collect();
    let mut admitted = std::collections::HashMap::<u64, u64>::new();
    for (i, task) in tasks.into_iter().enumerate() {
        if task.await.unwrap().unwrap().allowed {
            *admitted.entry(i as u64 % 100).or_default() += 1;
        }
    }
    assert!(
        admitted.values().all(|&n| n == 3),
        "3 per user: {admitted:?}"
    );
    let calls = server.script_calls().await;
    assert!(
        calls > 0 && calls < 400,
        "400 decisions took {calls} script calls"
    );
}

/// A flood on a spent key: the local deny cache answers, so Redis sees about
/// the admitted calls plus one call per `retry_after`, however many callers
/// flood the key (when a denial expires, one of them asks for all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_keeps_a_flood_on_a_spent_key_off_redis() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    // Five at once, then one every 100 ms.
    let quota = Quota::new(5, Rate::per_second(10).unwrap()).unwrap();
    limiter.decide(&quota, "warm-up", 1).await.unwrap();
    let mut redis = server.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis)
        .await
        .unwrap();
    let started = Instant::now();
    let callers = 32;
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let (mut decisions, mut admitted) = (0u64, 0u64);
                while started.elapsed() < Duration::from_secs(1) {
                    decisions += 1;
                    if limiter.decide(&quota, "hot", 1).await.unwrap().allowed {
                        admitted += 1;
                    }
                    tokio::task::yield_now().await;
                }
                (decisions, admitted)
            })
        })
        .collect();
    let (mut decisions, mut admitted) = (0, 0);
    for task in tasks {
        let (d, a) = task.await.unwrap();
        decisions += d;
        admitted += a;
    }
    let periods = started.elapsed().as_millis() as u64 / 100 + 1;
    let script_calls = server.script_calls().await;
    // Cached denials never outlast the true wait: every refill is taken.
    assert!(
        admitted + 4 >= 5 + periods && admitted <= 5 + periods,
        "admitted {admitted} over {periods} refills"
    );
    // The first wave, before anything is cached, may reach Redis from every
    // caller; after that, about one decision per refill, not one per caller
    // (batching would fold those into few script calls, but Redis would
    // still decide each).
    let asked_redis = decisions - limiter.stats().denied_from_cache;
    eprintln!(
        "a flood of {decisions} decisions from {callers} callers: {asked_redis} reached Redis, \
         {admitted} admitted, {script_calls} script calls"
    );
    assert!(
        asked_redis <= admitted + 3 * periods + 2 * callers,
        "{asked_redis} decisions went to Redis for {admitted} admitted over {periods} refills"
    );
    assert!(
        script_calls <= asked_redis,
        "{script_calls} script calls for {asked_redis} decisions"
    );
    assert!(
        decisions > 10 * script_calls,
        "{decisions} decisions took {script_calls} script calls"
    );
    assert!(limiter.stats().denied_from_cache > 0);
}

/// Loops `decide` on a spent key, on a single-threaded runtime, until a task
/// spawned on the same thread has run; returns the calls it took.
async fn calls_until_another_task_runs(limiter: &Limiter, quota: &Quota) -> u64 {
    // Denied once first, so that the Redis limiter's denial is cached and
    // the loop below never waits on Redis.
    assert!(!limiter.decide(quota, "spent", 1).await.unwrap().allowed);
    let ran = Arc::new(AtomicBool::new(false));
    tokio::spawn({
        let ran = ran.clone();
        async move { ran.store(true, Ordering::SeqCst) }
    });
    let mut calls = 0;
    while !ran.load(Ordering::SeqCst) && calls < 1_000_000 {
        assert!(!limiter.decide(quota, "spent", 1).await.unwrap().allowed);
        calls += 1;
    }
    assert!(
        ran.load(Ordering::SeqCst),
        "{calls} denials answered in process never let another task run"
    );
    calls
}

/// Cached denials (and the memory backend) answer at once, yet they take
/// Tokio budget as Tokio's own resources do: a task looping on a denied key
/// yields, so the tasks sharing its thread (those waiting on Redis replies
/// too) are not held up until the denial expires.
#[tokio::test]
async fn a_task_looping_on_a_denied_key_lets_its_thread_run_other_tasks() {
    let server = RedisServer::start();
    let quota = Quota::new(1, Rate::per_hour(1).unwrap()).unwrap();
    for limiter in [redis_limiter(&server), Limiter::memory()] {
        assert!(limiter.decide(&quota, "spent", 1).await.unwrap().allowed);
        let calls = calls_until_another_task_runs(&limiter, &quota).await;
        assert!(calls <= 1_000, "the other task ran after {calls} calls");
    }
}

/// Token leases: four instances each take ten tokens per Redis call and
/// serve them locally. The global bound holds exactly, and Redis sees about
/// one call per ten admissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_tokens_keep_the_global_bound_with_a_tenth_of_the_calls() {
    let server = RedisServer::start();
    let instances: Vec<Limiter> = (0..4)
        .map(|_| {
            Limiter::builder()
                .redis(server.url())
                .timeout(Duration::from_secs(2))
                .lease_ttl(Duration::from_secs(60))
                .build()
                .unwrap()
        })
        .collect();
    let quota = Quota::new(100, Rate::per_hour(1).unwrap()).unwrap();
    let mut redis = server.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut redis)
        .await
        .unwrap();
    let mut admitted = 0u64;
    for round in 0..40 {
        for limiter in &instances {
            if limiter
                .check(Request::new(&quota, "hot").rule("leased").lease(10))
                .await
                .is_ok()
            {
                admitted += 1;
            }
            let _ = round;
        }
    }
    assert_eq!(
        admitted, 100,
        "exactly the capacity, all leased out and used"
    );
    let script_calls = server.script_calls().await;
    // About ten leases (one short lease per instance near the end), then each
    // instance's first denial asks for a lease and for one token; the deny
    // cache answers the rest.
    assert!(
        script_calls <= 10 + 4 + 2 * 4,
        "{script_calls} script calls for 100 admissions"
    );
    let left = instances[0].decide(&quota, "hot", 0).await.unwrap();
    assert_eq!(left.remaining, 0, "every leased token is counted in Redis");
}

/// A rule reload, a tier change or a redeploy changes the quota of keys that
/// hold state: the new quota decides, from what was consumed, never waiting
/// longer than its own longest wait (a bucket's debt: the old quota's), and
/// a lower limit is a denial.
#[tokio::test]
async fn a_changed_quota_decides_keys_that_hold_state_without_errors_or_endless_waits() {
    let server = RedisServer::start();
    let redis = redis_limiter(&server);
    let memory = Limiter::memory();
    // Windows of a day on the real clock: a run straddles a boundary (where
    // a fixed window's count starts again under the calls) only in its
    // last milliseconds, not in every minute's.
    let day = Duration::from_secs(86_400);
    let changes = [
        // (before, calls under it, after)
        (
            Quota::fixed_window(5, day).unwrap(),
            5,
            Quota::fixed_window(5, 2 * day).unwrap(),
        ),
        (
            Quota::sliding_window(5, day).unwrap(),
            5,
            Quota::sliding_window(5, 60 * day).unwrap(),
        ),
        (
            Quota::fixed_window(100, day).unwrap(),
            50,
            Quota::fixed_window(10, day).unwrap(),
        ),
        (
            Quota::sliding_log(100, day).unwrap(),
            50,
            Quota::sliding_log(10, day).unwrap(),
        ),
        (
            Quota::sliding_window(100, day).unwrap(),
            50,
            Quota::sliding_window(10, day).unwrap(),
        ),
        (
            Quota::new(10, "1/h".parse().unwrap()).unwrap(),
            10,
            Quota::new(10, "100/s".parse().unwrap()).unwrap(),
        ),
        (
            Quota::leaky_bucket(10, "1/h".parse().unwrap()).unwrap(),
            10,
            Quota::leaky_bucket(10, "100/s".parse().unwrap()).unwrap(),
        ),
    ];
    for (limiter, name) in [(&redis, "redis"), (&memory, "memory")] {
        for (i, (before, calls, after)) in changes.iter().enumerate() {
            let key = format!("change:{i}");
            for _ in 0..*calls {
                limiter.decide(before, &key, 1).await.unwrap();
            }
            let d = limiter
                .decide(after, &key, 1)
                .await
                .unwrap_or_else(|e| panic!("{name}: {before} then {after}: {e}"));
            // A bucket's old debt is waited out as it is: up to the old
            // quota's longest wait.
            let longest = if before.algorithm().is_windowed() {
                after.longest_wait()
            } else {
                after.longest_wait().max(before.longest_wait())
            };
            assert!(
                d.retry_after <= longest,
                "{name}: {before} then {after}: wait {:?}",
                d.retry_after
            );
            if after.capacity() < *calls {
                assert!(!d.allowed, "{name}: {before} then {after}: {d:?}");
                assert_eq!(d.remaining, 0, "{name}: {before} then {after}");
            }
        }
    }
}

/// A bucket drained under a slow quota, then decided under a faster one
/// whose bucket its debt overflows (a tier change): the debt is waited out
/// as it is, and every denial names the wait that holds, so a caller that
/// waits it is admitted, never denied again with a shorter wait. Also when
/// the denial was an all-or-nothing check's, on the native module, with
/// the deny cache, and in memory. A reset gives the key the new quota at
/// once.
#[tokio::test]
async fn a_debt_deeper_than_a_new_bucket_is_waited_out_and_the_wait_named() {
    use Algorithm::{Gcra, LeakyBucket, TokenBucket};
    let clock = ManualClock::new(1_800_000_000_000_000);
    let plain = RedisServer::start();
    let module = support::native_module();
    let native = RedisServer::start_with(&["--loadmodule", module.to_str().unwrap()]);
    let (function, memory) = limiters_with_clock(&plain, &clock);
    let (on_module, _) = limiters_with_clock(&native, &clock);
    let cached = Limiter::builder()
        .redis(plain.url())
        .timeout(Duration::from_secs(2))
        .prefix("cached:")
        .clock(clock.clone())
        .build()
        .unwrap();
    let ample = Quota::per_second(1_000).unwrap();
    for (limiter, name) in [
        (&function, "function"),
        (&on_module, "module"),
        (&cached, "deny cache"),
        (&memory, "memory"),
    ] {
        for algorithm in [TokenBucket, Gcra, LeakyBucket] {
            for by_check in [false, true] {
                let context = format!("{name}, {algorithm:?}, by a check: {by_check}");
                let key = format!("tier:{algorithm:?}:{by_check}");
                let free = support::bucket(algorithm, 100, "1/min");
                let paid = support::bucket(algorithm, 10, "10/s");
                let check_on = |key: String| {
                    let (paid, ample) = (&paid, &ample);
                    async move {
                        if by_check {
                            let both = [Request::new(paid, &key), Request::new(ample, "other")];
                            limiter.check(both).await.map(|_| ())
                        } else {
                            limiter.check(Request::new(paid, &key)).await.map(|_| ())
                        }
                    }
                };
                let check = || check_on(key.clone());
                assert!(limiter.decide(&free, &key, 100).await.unwrap().allowed);
                // 100 minutes owed, less the second gone, less the one
                // second of debt the new bucket holds, plus its token.
                clock.advance(Duration::from_secs(1));
                let denied = check().await.unwrap_err();
                assert_eq!(denied.key, key, "{context}");
                assert_eq!(denied.remaining, 0, "{context}");
                assert_eq!(
                    denied.retry_after,
                    Duration::from_millis(5_998_100),
                    "{context}"
                );
                assert!(denied.retry_after <= free.longest_wait(), "{context}");
                let mut waited = Duration::ZERO;
                for _ in 0..3 {
                    clock.advance(Duration::from_secs(600));
                    waited += Duration::from_secs(600);
                    let again = check().await.unwrap_err();
                    assert_eq!(
                        again.retry_after + waited,
                        denied.retry_after,
                        "{context}: each denial names what is left of the wait"
                    );
                }
                clock.advance(denied.retry_after - waited);
                assert!(
                    check().await.is_ok(),
                    "{context}: denied after the wait it named"
                );
                // An upgrade at once: reset, then the whole new bucket.
                let upgraded = format!("{key}:upgraded");
                assert!(limiter.decide(&free, &upgraded, 100).await.unwrap().allowed);
                assert!(check_on(upgraded.clone()).await.is_err(), "{context}");
                limiter.reset(&upgraded).await.unwrap();
                for n in 0..10 {
                    assert!(
                        check_on(upgraded.clone()).await.is_ok(),
                        "{context}: token {n} after a reset"
                    );
                }
            }
        }
    }
}

/// A Redis limiter on the caller's `clock` whose leases last 10 s.
fn leasing(server: &RedisServer, clock: &ManualClock) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .clock(clock.clone())
        .lease_ttl(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A lease never serves a token its algorithm could not have admitted when
/// the token was counted: each algorithm keeps its own bound with leases.
#[tokio::test]
async fn leases_keep_each_algorithms_own_bound() {
    let server = RedisServer::start();
    let second = 1_000_000u64;
    let start = 1_800_000_000 * second;
    let clock = ManualClock::new(start);
    let limiter = leasing(&server, &clock);
    let burst = |quota: Quota, key: &'static str, lease: u64| {
        let limiter = limiter.clone();
        async move {
            let mut admitted = 0;
            for _ in 0..30 {
                let request = Request::new(&quota, key).rule("leased").lease(lease);
                if limiter.check(request).await.is_ok() {
                    admitted += 1;
                }
            }
            admitted
        }
    };

    // Fixed window of 10 a second, leased 10 ms before the boundary.
    let window = Quota::fixed_window(10, Duration::from_secs(1)).unwrap();
    clock.set(start + second - 10_000);
    limiter
        .check(Request::new(&window, "fw").rule("leased").lease(10))
        .await
        .unwrap();
    clock.set(start + second);
    let next = burst(window, "fw", 10).await;
    assert!(
        next <= 10,
        "{next} admitted in the next aligned window of 10"
    );

    // A token bucket of 10 at 10/s: leased at t, full again half a second on.
    let bucket = Quota::new(10, "10/s".parse().unwrap()).unwrap();
    clock.set(start + 5 * second);
    limiter
        .check(Request::new(&bucket, "tb").rule("leased").lease(5))
        .await
        .unwrap();
    clock.set(start + 7 * second);
    let later = burst(bucket, "tb", 5).await;
    assert!(later <= 10, "a burst of {later} from a bucket of 10");

    // The sliding log takes no lease: 5 in any second, a lease or not.
    let log = Quota::sliding_log(5, Duration::from_secs(1)).unwrap();
    clock.set(start + 10 * second);
    limiter
        .check(Request::new(&log, "sl").rule("leased").lease(5))
        .await
        .unwrap();
    clock.set(start + 11 * second - 500_000);
    let first = burst(log, "sl", 5).await;
    clock.set(start + 11 * second + 50_000);
    let second_half = burst(log, "sl", 5).await;
    assert!(
        first + second_half <= 5,
        "{first} + {second_half} admitted within one second of 5"
    );
}

/// A lease taken under one quota is not served after the key was decided
/// under another (a rule change between calls): the other quota may have
/// started a new count without the leased tokens.
#[tokio::test]
async fn a_lease_does_not_outlive_a_change_of_its_keys_quota() {
    let server = RedisServer::start();
    let minute = 60_000_000u64;
    // Half a minute into a minute: a one-second window starts a new count.
    let clock = ManualClock::new(29_000_000 * minute + minute / 2);
    let limiter = leasing(&server, &clock);
    let per_minute = Quota::fixed_window(10, Duration::from_secs(60)).unwrap();
    let per_second = Quota::fixed_window(5, Duration::from_secs(1)).unwrap();
    let leased = |cost, lease| {
        Request::new(&per_minute, "k")
            .cost(cost)
            .rule("r")
            .lease(lease)
    };
    // Six tokens leased under 10 a minute, one used.
    limiter.check(leased(1, 6)).await.unwrap();
    // The rule changes and back: the minute's count starts anew at 1, then 7.
    limiter.check(Request::new(&per_second, "k")).await.unwrap();
    limiter
        .check(Request::new(&per_minute, "k").cost(6))
        .await
        .unwrap();
    let fifth = limiter.check(leased(5, 6)).await;
    assert!(
        fifth.is_err(),
        "7 counted in this minute's window of 10, and 5 more were served from an old lease"
    );
}

/// A request of no cost takes nothing, though it asks for a lease; a lease
/// TTL of zero turns leases off, so each request takes its own cost alone.
#[tokio::test]
async fn no_lease_is_taken_for_a_request_of_no_cost_nor_with_a_ttl_of_zero() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_800_000_000_000_000);
    let limiter = leasing(&server, &clock);
    let quota = Quota::per_minute(10).unwrap();
    let free = Request::new(&quota, "free").cost(0).lease(5);
    assert_eq!(
        limiter.check(free).await.unwrap().decisions()[0].remaining,
        10
    );
    let left = limiter.inspect(&quota, "free", 0).await.unwrap();
    assert_eq!(left.remaining, 10, "a request of no cost leased tokens");

    let off = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .clock(clock.clone())
        .lease_ttl(Duration::ZERO)
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..20 {
        let request = Request::new(&quota, "off").lease(5);
        admitted += u64::from(off.check(request).await.is_ok());
    }
    assert_eq!(admitted, 10, "leases that live no time took their tokens");
}

/// Leases are kept for many keys at once whatever the deny cache's size:
/// with the cache off, a key leased after 200 others still serves its
/// lease, rather than taking a lease's worth at every request.
#[tokio::test]
async fn leases_of_many_keys_are_kept_with_the_deny_cache_off() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .deny_cache_max_keys(0)
        .lease_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let quota = Quota::per_minute(10).unwrap();
    for i in 0..200 {
        let key = format!("other:{i}");
        limiter
            .check(Request::new(&quota, &key).lease(5))
            .await
            .unwrap();
    }
    let mut admitted = 0;
    for _ in 0..20 {
        let request = Request::new(&quota, "x").lease(5);
        admitted += u64::from(limiter.check(request).await.is_ok());
    }
    assert_eq!(admitted, 10, "leases not kept took 5 tokens each");
}

/// A refund makes a bucket owe less than a live lease of the key was told
/// it owes: the limiter drops that lease, so what it serves and what the
/// bucket holds stay within the capacity.
#[tokio::test]
async fn a_refund_leaves_no_lease_serving_tokens_the_bucket_holds_again() {
    let server = RedisServer::start();
    let start = 1_800_000_000_000_000;
    let clock = ManualClock::new(start);
    let limiter = leasing(&server, &clock);
    let quota = Quota::new(100, "100/s".parse().unwrap()).unwrap();
    let taken = limiter
        .check(Request::new(&quota, "k").cost(50))
        .await
        .unwrap();
    // 50 leased, one served: the lease holds 49, owed for a second.
    limiter
        .check(Request::new(&quota, "k").lease(50))
        .await
        .unwrap();
    limiter.refund(taken).await.unwrap();
    // The bucket owes the lease's 50 alone: 300 ms on it holds 80, and owes
    // 20 of the lease.
    clock.set(start + 300_000);
    let mut admitted = 0;
    while admitted < 200 {
        let request = Request::new(&quota, "k").lease(50);
        if limiter.check(request).await.is_err() {
            break;
        }
        admitted += 1;
    }
    assert!(
        admitted <= 100,
        "{admitted} admitted at one instant from a bucket of 100"
    );
}

/// A reset that times out may still land once Redis answers again: the
/// key's lease is dropped before the reset is sent, so it never serves
/// tokens beside a quota Redis has made whole.
#[tokio::test]
async fn a_reset_that_times_out_leaves_no_lease_beside_a_whole_quota() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(200))
        .lease_ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    let quota = Quota::per_minute(10).unwrap();
    // Five leased, one served: the lease holds four.
    limiter
        .check(Request::new(&quota, "k").lease(5))
        .await
        .unwrap();
    server.freeze();
    let reset = limiter.reset("k").await;
    server.thaw();
    assert!(
        reset.is_err(),
        "a frozen Redis answered the reset: {reset:?}"
    );
    // The reset was sent before it timed out, and lands now.
    let mut redis = server.connection().await;
    for _ in 0..100 {
        let held: u64 = redis::cmd("DBSIZE").query_async(&mut redis).await.unwrap();
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut admitted = 0;
    for _ in 0..30 {
        let request = Request::new(&quota, "k").lease(5);
        admitted += u64::from(limiter.check(request).await.is_ok());
    }
    assert!(
        admitted <= 10,
        "{admitted} admitted from a quota of 10 made whole"
    );
}

/// A lease the deny cache knows the key cannot give is no denial: the
/// request's own cost is asked for next, and only a denial of that counts,
/// from the cache or not.
#[tokio::test]
async fn a_lease_the_deny_cache_refuses_is_not_counted_as_a_denial() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let quota = Quota::per_minute(10).unwrap();
    limiter
        .check(Request::new(&quota, "k").cost(7))
        .await
        .unwrap();
    // Three left: each asks for five, is refused, and takes one.
    for _ in 0..3 {
        limiter
            .check(Request::new(&quota, "k").lease(5))
            .await
            .unwrap();
    }
    let stats = limiter.stats();
    assert_eq!((stats.denied, stats.denied_from_cache), (0, 0), "{stats:?}");
    assert!(limiter
        .check(Request::new(&quota, "k").lease(5))
        .await
        .is_err());
    let stats = limiter.stats();
    assert_eq!(stats.denied, 1, "{stats:?}");
    assert!(stats.denied_from_cache <= 1, "{stats:?}");
}

/// A reset racing a leased check never leaves a lease of tokens Redis no
/// longer counts: once both have ended, the key admits at most its quota,
/// lease and Redis together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_racing_a_leased_check_leaves_no_lease_behind() {
    let server = RedisServer::start();
    // Every call must be Redis's: one the failure policy answered would be
    // an admission Redis never counted.
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(5))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = window(ratelimit::Algorithm::FixedWindow, 10, "1h");
    let mut worst = 0;
    for round in 0..300 {
        let key = format!("race:{round}");
        let (checker, resetter) = (limiter.clone(), limiter.clone());
        let (checked, reset) = tokio::join!(
            tokio::spawn({
                let (quota, key) = (quota, key.clone());
                async move {
                    checker
                        .check(Request::new(&quota, &key).lease(10))
                        .await
                        .is_ok()
                }
            }),
            tokio::spawn({
                let key = key.clone();
                async move { resetter.reset(&key).await }
            }),
        );
        assert!(
            checked.unwrap(),
            "round {round}: the first check was denied"
        );
        reset.unwrap().unwrap();
        let mut admitted = 0;
        while limiter
            .check(Request::new(&quota, &key).lease(10))
            .await
            .is_ok()
        {
            admitted += 1;
            assert!(admitted <= 30, "round {round}: no end to admissions");
        }
        worst = worst.max(admitted);
    }
    assert!(
        worst <= 10,
        "a key admitted {worst} after a reset, over its 10"
    );
}

/// A reset whose caller is gone before Redis answers (a client that hung
/// up, a `timeout` around the call) may land all the same: what the
/// limiter keeps of the key in process is forgotten all the same. (The
/// cached denial of the key was kept, and denied the key its whole quota
/// until the denial's wait ended, a minute here.)
#[tokio::test]
async fn a_reset_dropped_before_its_answer_forgets_what_the_limiter_keeps_of_the_key() {
    let server = RedisServer::start();
    let relay = support::Relay::start(server.port()).await;
    let limiter = Limiter::builder()
        .redis(relay.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let quota = Quota::per_minute(2).unwrap();
    limiter
        .check(Request::new(&quota, "dropped").cost(2))
        .await
        .unwrap();
    // The denial is cached.
    for _ in 0..2 {
        limiter
            .check(Request::new(&quota, "dropped"))
            .await
            .unwrap_err();
    }
    assert!(
        limiter.stats().denied_from_cache >= 1,
        "{:?}",
        limiter.stats()
    );
    relay.delay_replies(Duration::from_millis(300));
    let gone = tokio::time::timeout(Duration::from_millis(100), limiter.reset("dropped")).await;
    assert!(gone.is_err(), "the reset answered in 100 ms: {gone:?}");
    // The reset reached Redis, whose answer is still on its way.
    let mut redis = server.connection().await;
    let held: u64 = redis::cmd("DBSIZE").query_async(&mut redis).await.unwrap();
    assert_eq!(held, 0, "the reset did not land");
    let after = limiter.check(Request::new(&quota, "dropped")).await;
    assert!(
        after.is_ok(),
        "a key Redis made whole was denied from the cache: {after:?}"
    );
}

/// A reset deletes the key's variants under other algorithms
/// (`key~<algorithm>`, which the attribute and the HTTP layer keep when a
/// rule moves a key to another algorithm than its own) and forgets what the
/// limiter keeps of them, and nothing else.
#[tokio::test]
async fn a_reset_deletes_the_keys_variants_under_other_algorithms() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let window = Quota::fixed_window(1, Duration::from_secs(3600)).unwrap();
    let bucket = Quota::per_hour(1).unwrap();
    for (quota, key) in [
        (&bucket, "v"),
        (&window, "v~fixed_window"),
        (&window, "w~fixed_window"),
    ] {
        assert!(limiter.decide(quota, key, 1).await.unwrap().allowed);
    }
    // Denied, and the denial cached.
    assert!(
        !limiter
            .decide(&window, "v~fixed_window", 1)
            .await
            .unwrap()
            .allowed
    );
    limiter.reset("v").await.unwrap();
    let mut redis = server.connection().await;
    let keys: Vec<String> = redis.keys("*").await.unwrap();
    assert_eq!(keys, ["rl:w~fixed_window"]);
    assert!(
        limiter
            .decide(&window, "v~fixed_window", 1)
            .await
            .unwrap()
            .allowed
    );
    assert!(limiter.decide(&bucket, "v", 1).await.unwrap().allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_closed_while_idle_are_made_again_before_the_next_call() {
    // What Redis does to idle clients under `timeout` in redis.conf, and an
    // operator's `CLIENT KILL`: the connections close while no call is on
    // them. The next calls are decided by Redis, not failed (a healthy
    // server, whose failures would go to the failure policy and count
    // towards the breaker).
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::Closed)
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    // The test's only connection: `CLIENT LIST` shows it and the limiter's.
    let mut admin = server.connection().await;
    for round in 0..3 {
        // Enough at once that every batch connection carries a call.
        let keys: Vec<String> = (0..16).map(|i| format!("warm:{round}:{i}")).collect();
        let warm = futures::future::join_all(
            keys.iter()
                .map(|key| limiter.check(Request::new(&quota, key))),
        )
        .await;
        assert!(warm.iter().all(Result::is_ok), "round {round}: {warm:?}");
        let clients = support::other_clients(&mut admin).await;
        assert!(
            clients > 0,
            "round {round}: the limiter holds no connection"
        );
        let killed = support::kill_other_clients(&mut admin).await;
        assert_eq!(killed, clients, "round {round}");
        // Made again by themselves (give them up to 2 s); with none made,
        // the calls below are the first to learn of the close.
        let deadline = Instant::now() + Duration::from_secs(2);
        support::await_other_clients(&mut admin, clients, deadline).await;
        let failed = support::failed_checks(&limiter, &quota, &format!("after:{round}"), 4).await;
        assert!(
            failed.is_empty(),
            "round {round}: calls on a healthy Redis failed: {failed:#?}"
        );
        limiter
            .inspect(&quota, &format!("after:{round}:0"), 1)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_server_that_refuses_resp3_is_served_over_resp2() {
    // `HELLO` renamed away: the server refuses a connection's `HELLO 3` as
    // one before 6.0 does, and the limiter connects again speaking RESP2.
    let server = RedisServer::start_with(&["--rename-command", "HELLO", ""]);
    let limiter = redis_limiter(&server);
    limiter.ping().await.unwrap();
    let quota = Quota::per_hour(3).unwrap();
    for i in 0..3 {
        let decision = limiter.decide(&quota, "resp2", 1).await.unwrap();
        assert!(decision.allowed, "call {i}: {decision:?}");
    }
    let fourth = limiter.decide(&quota, "resp2", 1).await.unwrap();
    assert!(!fourth.allowed, "{fourth:?}");
    // The ping's peek and the four decisions.
    assert_eq!(server.command_calls(&["fcall"]).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_finds_the_leases_full_takes_its_own_cost_alone() {
    // A flood of distinct leased keys fills the lease table (100,000 keys).
    // A key that leases after it keeps no lease: it must take only its
    // request's cost from Redis, not a lease's worth it then loses.
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(5))
        .lease_ttl(Duration::from_secs(600))
        .build()
        .unwrap();
    let quota = Quota::new(20, Rate::per_hour(1).unwrap()).unwrap();
    let admitted = |key: String| {
        let limiter = limiter.clone();
        async move {
            let mut admitted = 0;
            while admitted < 40
                && limiter
                    .check(Request::new(&quota, &key).lease(10))
                    .await
                    .is_ok()
            {
                admitted += 1;
            }
            admitted
        }
    };
    assert_eq!(admitted("before".to_owned()).await, 20);
    let flood: Vec<_> = (0..32)
        .map(|task| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                for i in (task..110_000).step_by(32) {
                    let key = format!("flood:{i}");
                    limiter
                        .check(Request::new(&quota, &key).lease(10))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in flood {
        task.await.unwrap();
    }
    for victim in 0..5 {
        assert_eq!(
            admitted(format!("after:{victim}")).await,
            20,
            "key {victim} after the flood"
        );
    }
}

/// A server answering as Redis 6.0 does: `HELLO` needs its protocol version
/// there (a bare `HELLO` came with 6.2). The commands past the connection
/// are not served: the limiter must get that far.
async fn a_redis_6_0(listener: tokio::net::TcpListener) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
                // Each whole command in the buffer: *<n>\r\n then n bulk strings.
                while let Some((args, used)) = parse_command(&buffer) {
                    buffer.drain(..used);
                    let reply: &[u8] = match (args[0].to_ascii_uppercase().as_str(), args.len()) {
                        ("HELLO", 1) => b"-ERR wrong number of arguments for 'hello' command\r\n",
                        ("HELLO", _) => {
                            b"%3\r\n$7\r\nversion\r\n$5\r\n6.0.9\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n"
                        }
                        _ => b"-ERR not served here\r\n",
                    };
                    if socket.write_all(reply).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

/// The first whole command in `buffer`, and the bytes it takes.
fn parse_command(buffer: &[u8]) -> Option<(Vec<String>, usize)> {
    let line = |at: usize| -> Option<(String, usize)> {
        let end = buffer[at..].windows(2).position(|w| w == b"\r\n")? + at;
        Some((
            String::from_utf8_lossy(&buffer[at..end]).into_owned(),
            end + 2,
        ))
    };
    let (head, mut at) = line(0)?;
    let count: usize = head.strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        let (length, start) = line(at)?;
        let length: usize = length.strip_prefix('$')?.parse().ok()?;
        let end = start + length;
        if buffer.len() < end + 2 {
            return None;
        }
        args.push(String::from_utf8_lossy(&buffer[start..end]).into_owned());
        at = end + 2;
    }
    Some((args, at))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_hello_needs_its_protocol_version_is_connected_to() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(a_redis_6_0(listener));
    let limiter = Limiter::builder()
        .redis(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // Connected, and told what the server is: the failure is the first
    // command this stand-in does not serve, not the connection.
    let error = limiter.ping().await.unwrap_err();
    assert!(!matches!(error, Error::Connect { .. }), "{error}");
    assert!(error.to_string().contains("not served here"), "{error}");
}
