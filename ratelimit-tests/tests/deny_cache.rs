//! The local deny cache against a real, private Redis, on the real clock, as
//! a user runs it (the cache on, as it is by default): a denial it answers
//! has the figures Redis would give at that instant, and a caller that sleeps
//! its `retry_after` and retries the same cost is admitted.

mod support;

use support::{Decide, Decided};

use std::time::Duration;

use ratelimit::{Algorithm, Decision, Limiter, Quota, Request};
use support::RedisServer;

fn limiter(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("build a Redis limiter")
}

fn bucket(algorithm: Algorithm) -> Quota {
    Quota::builder(algorithm)
        .capacity(5)
        .rate("5/s".parse().unwrap())
        .build()
        .unwrap()
}

fn window(algorithm: Algorithm) -> Quota {
    Quota::builder(algorithm)
        .limit(5)
        .window(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// How far a cached answer may stand from Redis's own a moment later: the
/// cache measures from a reply's arrival (never early, late by at most that
/// reply's round trip), and `inspect` runs a round trip after it.
const SLACK: Duration = Duration::from_millis(60);

/// `cached`, an answer of this process, against `redis`, what Redis answered
/// the same request just after: the same `remaining`, waits no shorter and
/// at most `SLACK` longer.
fn assert_as_redis(context: &str, cached: &Decided, redis: &Decision) {
    assert!(
        !cached.allowed && !redis.allowed,
        "{context}: {cached:?} vs {redis:?}"
    );
    assert_eq!(
        cached.remaining, redis.remaining,
        "{context}: {cached:?} vs {redis:?}"
    );
    for (mine, theirs) in [
        (cached.retry_after, redis.retry_after),
        (cached.reset_after, redis.reset_after),
    ] {
        assert!(
            mine >= theirs && mine <= theirs + SLACK,
            "{context}: {cached:?} vs Redis's {redis:?}"
        );
    }
}

/// Denied at one cost after this process's own admissions at another: the
/// answer from the cache is the one Redis gives, and sleeping its
/// `retry_after` is enough.
#[tokio::test]
async fn a_bucket_spent_at_mixed_costs_is_denied_as_redis_would() {
    let server = RedisServer::start();
    let limiter = limiter(&server);
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        let quota = bucket(algorithm);
        let key = format!("mixed:{algorithm}");
        for cost in [2, 2, 1] {
            let d = limiter.decide(&quota, &key, cost).await.unwrap();
            assert!(d.allowed, "{algorithm}: {d:?}");
        }
        let hits = limiter.stats().denied_from_cache;
        let cached = limiter.decide(&quota, &key, 2).await.unwrap();
        let redis = limiter.inspect(&quota, &key, 2).await.unwrap();
        assert_eq!(
            limiter.stats().denied_from_cache,
            hits + 1,
            "{algorithm}: the spent bucket is known in process"
        );
        assert_as_redis(&format!("{algorithm}"), &cached, &redis);
        tokio::time::sleep(cached.retry_after).await;
        let retried = limiter.decide(&quota, &key, 2).await.unwrap();
        assert!(
            retried.allowed,
            "{algorithm}: denied after {cached:?}: {retried:?}"
        );
    }
}

/// A window denied at cost 3, then admitted twice at cost 1: the next denial
/// of cost 3 is Redis's, and sleeping its `retry_after` is enough.
#[tokio::test]
async fn a_window_admitted_after_a_denial_is_denied_as_redis_would() {
    let server = RedisServer::start();
    let limiter = limiter(&server);
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let quota = window(algorithm);
        let key = format!("window:{algorithm}");
        for _ in 0..3 {
            assert!(limiter.decide(&quota, &key, 1).await.unwrap().allowed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let first = limiter.decide(&quota, &key, 3).await.unwrap();
        if first.allowed {
            // A fixed window that ended mid-sequence: nothing to see here.
            assert_eq!(algorithm, Algorithm::FixedWindow);
            continue;
        }
        for _ in 0..2 {
            limiter.decide(&quota, &key, 1).await.unwrap();
        }
        let answer = limiter.decide(&quota, &key, 3).await.unwrap();
        if answer.allowed {
            assert_eq!(algorithm, Algorithm::FixedWindow, "{answer:?}");
            continue;
        }
        let redis = limiter.inspect(&quota, &key, 3).await.unwrap();
        assert_as_redis(&format!("{algorithm}"), &answer, &redis);
        tokio::time::sleep(answer.retry_after).await;
        let retried = limiter.decide(&quota, &key, 3).await.unwrap();
        assert!(
            retried.allowed,
            "{algorithm}: denied after {answer:?}: {retried:?}"
        );
    }
}

/// One caller per algorithm, each on a key of its own, for about three
/// seconds: random costs and pauses; every denial is followed by a sleep of
/// exactly its `retry_after` and a retry of the same cost, which must be
/// admitted, whether the denial came from the cache or from Redis. With
/// leases (where an algorithm takes them) and without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_sleep_retry_after_and_retry_is_admitted_for_every_algorithm() {
    let server = RedisServer::start();
    let limiter = limiter(&server);
    let quotas = [
        bucket(Algorithm::TokenBucket),
        bucket(Algorithm::Gcra),
        bucket(Algorithm::LeakyBucket),
        window(Algorithm::FixedWindow),
        window(Algorithm::SlidingLog),
        window(Algorithm::SlidingWindow),
    ];
    let mut callers = Vec::new();
    for (i, quota) in quotas.into_iter().enumerate() {
        for lease in [0, 3] {
            let limiter = limiter.clone();
            callers.push(tokio::spawn(async move {
                let key = format!("retry:{}:{lease}", quota.algorithm());
                let request = |cost| {
                    Request::new(&quota, &key)
                        .cost(cost)
                        .rule("retry")
                        .lease(lease)
                };
                let mut seed = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) + lease;
                let mut next = move |n: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % n
                };
                let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
                let (mut denials, mut denied_again) = (0, Vec::new());
                while tokio::time::Instant::now() < deadline {
                    let cost = 1 + next(3);
                    let Err(denied) = limiter.check(request(cost)).await else {
                        tokio::time::sleep(Duration::from_millis(next(20))).await;
                        continue;
                    };
                    denials += 1;
                    tokio::time::sleep(denied.retry_after).await;
                    if let Err(again) = limiter.check(request(cost)).await {
                        denied_again.push((cost, denied.retry_after, again.retry_after));
                    }
                }
                (quota, lease, denials, denied_again)
            }));
        }
    }
    for caller in callers {
        let (quota, lease, denials, denied_again) = caller.await.unwrap();
        assert!(
            denials >= 2,
            "{quota:?} lease {lease}: only {denials} denials"
        );
        assert!(
            denied_again.is_empty(),
            "{quota:?} lease {lease}: {} of {denials} retries denied again \
             (cost, retry_after, then retry_after): {denied_again:?}",
            denied_again.len()
        );
    }
    assert!(
        limiter.stats().denied_from_cache > 0,
        "the deny cache never answered"
    );
}
