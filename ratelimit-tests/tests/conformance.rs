//! One conformance suite, run against both backends: each algorithm's
//! defining property, stated over the whole event log, and the exactness of
//! `retry_after` and `reset_after`.

mod support;

use support::{Decide, Decided};

use std::time::Duration;

use ratelimit::{Algorithm, Limiter, ManualClock, Quota, Rate};
use support::RedisServer;
use tokio::runtime::Runtime;

const START: u64 = 1_700_000_000_000_000;

/// The backends under test, each driven by its own manual clock (the Redis
/// one through the caller's clock).
struct Backends {
    runtime: Runtime,
    _server: RedisServer,
    limiters: Vec<(&'static str, Limiter, ManualClock)>,
}

impl Backends {
    fn start() -> Self {
        let runtime = Runtime::new().unwrap();
        let server = RedisServer::start();
        let memory_clock = ManualClock::new(START);
        let redis_clock = ManualClock::new(START);
        let cached_clock = ManualClock::new(START);
        let memory = Limiter::builder()
            .memory()
            .clock(memory_clock.clone())
            .build()
            .unwrap();
        let (redis, cached) = runtime.block_on(async {
            // The algorithm itself: no deny cache in front of it.
            let redis = Limiter::builder()
                .redis(server.url())
                .timeout(Duration::from_secs(2))
                .clock(redis_clock.clone())
                .deny_cache_max_keys(0)
                .build()
                .unwrap();
            // The same, answered from the deny cache (on by default) where it
            // can be, on keys of its own.
            let cached = Limiter::builder()
                .redis(server.url())
                .prefix("cached")
                .timeout(Duration::from_secs(2))
                .clock(cached_clock.clone())
                .build()
                .unwrap();
            (redis, cached)
        });
        Backends {
            runtime,
            _server: server,
            limiters: vec![
                ("memory", memory, memory_clock),
                ("redis", redis, redis_clock),
                ("redis with the deny cache", cached, cached_clock),
            ],
        }
    }

    /// Runs `events` of (time step in µs, cost) on `key` from `START`;
    /// returns (instant, cost, decision) for each.
    fn run(
        &self,
        limiter: &Limiter,
        clock: &ManualClock,
        quota: &Quota,
        key: &str,
        events: &[(u64, u64)],
    ) -> Vec<(u64, u64, Decided)> {
        clock.set(START);
        events
            .iter()
            .map(|&(step, cost)| {
                clock.advance(Duration::from_micros(step));
                let d = self
                    .runtime
                    .block_on(limiter.decide(quota, key, cost))
                    .unwrap_or_else(|e| panic!("{quota:?}: {e}"));
                (START + elapsed(clock), cost, d)
            })
            .collect()
    }
}

fn elapsed(clock: &ManualClock) -> u64 {
    use ratelimit::Clock;
    clock.now_micros() - START
}

/// A deterministic event stream: steps up to `max_step` µs, costs 1..=max_cost.
fn events(seed: u64, count: usize, max_step: u64, max_cost: u64) -> Vec<(u64, u64)> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..count)
        .map(|_| (next() % (max_step + 1), 1 + next() % max_cost))
        .collect()
}

fn admitted(log: &[(u64, u64, Decided)]) -> Vec<(u64, u64)> {
    log.iter()
        .filter(|(_, _, d)| d.allowed)
        .map(|&(t, c, _)| (t, c))
        .collect()
}

fn windowed(algorithm: Algorithm, limit: u64, window: &str) -> Quota {
    Quota::builder(algorithm)
        .limit(limit)
        .window(Quota::parse_window(window).unwrap())
        .build()
        .unwrap()
}

fn bucket(algorithm: Algorithm, capacity: u64, rate: &str) -> Quota {
    Quota::builder(algorithm)
        .capacity(capacity)
        .rate(rate.parse().unwrap())
        .build()
        .unwrap()
}

#[test]
fn sliding_log_never_exceeds_its_limit_in_any_window() {
    let b = Backends::start();
    let quota = windowed(Algorithm::SlidingLog, 10, "1s");
    let w = 1_000_000;
    for (name, limiter, clock) in &b.limiters {
        for seed in 1..=4 {
            let log = b.run(
                limiter,
                clock,
                &quota,
                &format!("log:{seed}"),
                &events(seed, 400, 60_000, 3),
            );
            let admitted = admitted(&log);
            assert!(admitted.len() > 40, "{name}: the load must saturate");
            for &(t, _) in &admitted {
                let in_window: u64 = admitted
                    .iter()
                    .filter(|&&(u, _)| u >= t && u < t + w)
                    .map(|&(_, c)| c)
                    .sum();
                assert!(
                    in_window <= 10,
                    "{name}: {in_window} admitted in the window from {t}"
                );
            }
        }
    }
}

#[test]
fn fixed_window_allows_the_boundary_double_burst_and_nothing_more() {
    let b = Backends::start();
    let quota = windowed(Algorithm::FixedWindow, 10, "1s");
    let w = 1_000_000;
    for (name, limiter, clock) in &b.limiters {
        // The double burst: the limit 300 ms before the end of one window and
        // again at the start of the next. (Redis expires the window's key on
        // its own clock: the gap keeps that expiry after the test's steps.)
        let to_burst = w - START % w - 300_000;
        let burst: Vec<(u64, u64)> = [(to_burst, 10), (0, 1), (300_000, 10), (0, 1)].to_vec();
        let log = b.run(limiter, clock, &quota, "fixed:burst", &burst);
        let allowed: Vec<bool> = log.iter().map(|(_, _, d)| d.allowed).collect();
        assert_eq!(allowed, [true, false, true, false], "{name}");

        for seed in 1..=4 {
            let log = b.run(
                limiter,
                clock,
                &quota,
                &format!("fixed:{seed}"),
                &events(seed, 400, 60_000, 3),
            );
            let admitted = admitted(&log);
            for &(t, _) in &admitted {
                let aligned: u64 = admitted
                    .iter()
                    .filter(|&&(u, _)| u / w == t / w)
                    .map(|&(_, c)| c)
                    .sum();
                assert!(
                    aligned <= 10,
                    "{name}: {aligned} in the aligned window of {t}"
                );
                let sliding: u64 = admitted
                    .iter()
                    .filter(|&&(u, _)| u >= t && u < t + w)
                    .map(|&(_, c)| c)
                    .sum();
                assert!(
                    sliding <= 20,
                    "{name}: {sliding} in the sliding window from {t}"
                );
            }
        }
    }
}

#[test]
fn sliding_window_stays_within_its_documented_error() {
    let b = Backends::start();
    let limit = 10;
    let quota = windowed(Algorithm::SlidingWindow, limit, "1s");
    let (w, w_ms) = (1_000_000u64, 1_000u64);
    for (name, limiter, clock) in &b.limiters {
        for seed in 1..=4 {
            let log = b.run(
                limiter,
                clock,
                &quota,
                &format!("sw:{seed}"),
                &events(seed, 400, 60_000, 3),
            );
            let admitted = admitted(&log);
            let in_aligned = |index: u64| -> u64 {
                admitted
                    .iter()
                    .filter(|&&(u, _)| u / w == index)
                    .map(|&(_, c)| c)
                    .sum()
            };
            for &(t, _) in &admitted {
                assert!(
                    in_aligned(t / w) <= limit,
                    "{name}: aligned window of {t} over the limit"
                );
                // Documented bound: in the window of length w ending at t, at most
                // limit + previous window's count x the share of this window elapsed.
                let elapsed_ms = (t % w) / 1_000;
                let bound = limit + in_aligned(t / w - 1) * elapsed_ms / w_ms;
                let sliding: u64 = admitted
                    .iter()
                    .filter(|&&(u, _)| u + w > t && u <= t)
                    .map(|&(_, c)| c)
                    .sum();
                assert!(
                    sliding <= bound,
                    "{name}: {sliding} admitted in the window ending at {t}, bound {bound}"
                );
            }
        }
    }
}

#[test]
fn gcra_and_token_bucket_admit_the_same_sequences_within_the_bucket_bound() {
    let b = Backends::start();
    for rate in ["3/s", "7/min", "50/s"] {
        let token_bucket = bucket(Algorithm::TokenBucket, 5, rate);
        let gcra = bucket(Algorithm::Gcra, 5, rate);
        let r: Rate = rate.parse().unwrap();
        let step = 3 * r.interval().as_micros() as u64 / 2;
        for (name, limiter, clock) in &b.limiters {
            for seed in 1..=3 {
                let events = events(seed, 300, step, 3);
                let tb = b.run(
                    limiter,
                    clock,
                    &token_bucket,
                    &format!("tb:{rate}:{seed}"),
                    &events,
                );
                let g = b.run(
                    limiter,
                    clock,
                    &gcra,
                    &format!("gcra:{rate}:{seed}"),
                    &events,
                );
                let decisions = |log: &[(u64, u64, Decided)]| {
                    log.iter().map(|(_, _, d)| *d).collect::<Vec<_>>()
                };
                assert_eq!(decisions(&tb), decisions(&g), "{name} {rate} seed {seed}");
                let admitted = admitted(&g);
                assert!(admitted.len() > 20, "{name}: the load must saturate");
                for (i, &(first, _)) in admitted.iter().enumerate() {
                    let mut taken = 0;
                    for &(t, c) in &admitted[i..] {
                        taken += c;
                        let refilled = (t - first) * r.tokens() / (r.period().as_micros() as u64);
                        assert!(
                            taken <= 5 + refilled,
                            "{name} {rate}: {taken} taken in [{first}, {t}]"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn leaky_bucket_spaces_the_starts_of_admitted_calls_by_its_interval() {
    let b = Backends::start();
    for rate in ["4/s", "3/s"] {
        let quota = bucket(Algorithm::LeakyBucket, 5, rate);
        let r: Rate = rate.parse().unwrap();
        let interval = r.period().as_micros() as f64 / r.tokens() as f64;
        for (name, limiter, clock) in &b.limiters {
            let log = b.run(
                limiter,
                clock,
                &quota,
                &format!("leaky:{rate}"),
                &events(7, 300, interval as u64, 1),
            );
            let mut starts: Vec<(u64, bool)> = log
                .iter()
                .filter(|(_, _, d)| d.allowed)
                .map(|(t, _, d)| (t + d.delay.as_micros() as u64, !d.delay.is_zero()))
                .collect();
            assert!(
                starts.len() > 50 && log.iter().any(|(_, _, d)| !d.allowed),
                "{name}: the queue must fill"
            );
            starts.sort();
            for pair in starts.windows(2) {
                let gap = (pair[1].0 - pair[0].0) as f64;
                assert!(
                    gap >= interval.floor(),
                    "{name} {rate}: starts {gap} µs apart"
                );
                if pair[1].1 {
                    // A call that waited started as soon as its turn came.
                    assert!(
                        gap <= interval.ceil(),
                        "{name} {rate}: a queued call started {gap} µs after the previous"
                    );
                }
            }
        }
    }
}

fn every_algorithm() -> Vec<Quota> {
    vec![
        bucket(Algorithm::TokenBucket, 5, "3/s"),
        bucket(Algorithm::Gcra, 5, "7/min"),
        bucket(Algorithm::LeakyBucket, 4, "2.5/s"),
        windowed(Algorithm::FixedWindow, 6, "1s"),
        windowed(Algorithm::SlidingLog, 6, "1s"),
        windowed(Algorithm::SlidingWindow, 6, "1s"),
    ]
}

/// For one key with no other traffic: a request at now + retry_after is
/// admitted and one a microsecond earlier is not; after reset_after the whole
/// capacity is there and a microsecond earlier it is not. Probing never
/// changes the outcome, as denials write nothing.
#[test]
fn retry_after_and_reset_after_are_exact_for_every_algorithm() {
    let b = Backends::start();
    for quota in every_algorithm() {
        for (name, limiter, clock) in &b.limiters {
            let key = format!("exact:{}", quota.algorithm());
            clock.set(START);
            let decide = |cost: u64| {
                b.runtime
                    .block_on(limiter.decide(&quota, &key, cost))
                    .unwrap()
            };
            let mut probes = 0;
            for (step, cost) in events(11, 200, 150_000, 2) {
                clock.advance(Duration::from_micros(step));
                let d = decide(cost);
                if d.allowed {
                    continue;
                }
                let retry = d.retry_after.as_micros() as u64;
                clock.advance(Duration::from_micros(retry - 1));
                assert!(
                    !decide(cost).allowed,
                    "{name} {quota:?}: admitted 1 µs before retry_after {retry}"
                );
                clock.advance(Duration::from_micros(1));
                assert!(
                    decide(cost).allowed,
                    "{name} {quota:?}: denied at retry_after {retry}"
                );
                probes += 1;
            }
            assert!(
                probes > 10,
                "{name} {quota:?}: only {probes} denials to probe"
            );

            let reset = decide(0).reset_after.as_micros() as u64;
            assert!(reset > 0, "{name} {quota:?}: the last call left state");
            clock.advance(Duration::from_micros(reset - 1));
            assert!(
                !decide(quota.capacity()).allowed,
                "{name} {quota:?}: full before reset_after"
            );
            clock.advance(Duration::from_micros(1));
            assert!(
                decide(quota.capacity()).allowed,
                "{name} {quota:?}: not full at reset_after"
            );
        }
    }
}

/// Every backend answers the same events alike, decision for decision, at
/// mixed costs on one key, whether Redis answers or the deny cache in front
/// of it; and the deny cache answers a good share of them.
#[test]
fn the_deny_cache_answers_every_algorithm_as_redis_would() {
    let b = Backends::start();
    for quota in every_algorithm() {
        let key = format!("alike:{}", quota.algorithm());
        let events = events(23, 300, 120_000, quota.capacity());
        let logs: Vec<_> = b
            .limiters
            .iter()
            .map(|(name, limiter, clock)| (name, b.run(limiter, clock, &quota, &key, &events)))
            .collect();
        let (reference, expected) = &logs[0];
        for (name, log) in &logs[1..] {
            for ((t, cost, d), (_, _, want)) in log.iter().zip(expected) {
                assert_eq!(
                    d,
                    want,
                    "{name} against {reference}, {quota:?} at {} cost {cost}",
                    t - START
                );
            }
        }
    }
    let (_, cached, _) = &b.limiters[2];
    let hits = cached.stats().denied_from_cache;
    assert!(hits > 100, "the deny cache answered only {hits} denials");
}
