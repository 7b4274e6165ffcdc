//! The local deny cache against a real, private Redis, on the real clock, as
//! a user runs it (the cache on, as it is by default): a denial it answers
//! has the figures Redis would give at that instant, and a caller that sleeps
//! its `retry_after` and retries the same cost is admitted.

mod support;

use support::{Decide, Decided};

use std::time::{Duration, Instant};

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
    bucket_at(algorithm, "5/s")
}

fn bucket_at(algorithm: Algorithm, rate: &str) -> Quota {
    Quota::builder(algorithm)
        .capacity(5)
        .rate(rate.parse().unwrap())
        .build()
        .unwrap()
}

fn window(algorithm: Algorithm) -> Quota {
    window_of(algorithm, Duration::from_secs(1))
}

fn window_of(algorithm: Algorithm, length: Duration) -> Quota {
    Quota::builder(algorithm)
        .limit(5)
        .window(length)
        .build()
        .unwrap()
}

/// `cached`, an answer of this process, against `redis`, what Redis answered
/// the same request just after: the same `remaining`, waits no shorter and
/// at most `slack` longer. The cache measures from a reply's arrival (never
/// early, late by at most that reply's round trip), and `inspect` runs a
/// while after it: `slack` is the time from sending the call whose reply
/// the cache holds to `inspect`'s return, which bounds both.
fn assert_as_redis(context: &str, cached: &Decided, redis: &Decision, slack: Duration) {
    // And a millisecond for clocks read at different points of a call.
    let slack = slack + Duration::from_millis(1);
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
            mine >= theirs && mine <= theirs + slack,
            "{context}: {cached:?} vs Redis's {redis:?}, {slack:?} apart at most"
        );
    }
}

/// Denied at one cost after this process's own admissions at another: the
/// answer from the cache is the one Redis gives, and sleeping its
/// `retry_after` is enough. (At 2/s, two tokens are a second away: only a
/// stall that long could refill the bucket before the denial.)
#[tokio::test]
async fn a_bucket_spent_at_mixed_costs_is_denied_as_redis_would() {
    let server = RedisServer::start();
    let limiter = limiter(&server);
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        let quota = bucket_at(algorithm, "2/s");
        let key = format!("mixed:{algorithm}");
        let mut last_sent = Instant::now();
        for cost in [2, 2, 1] {
            last_sent = Instant::now();
            let d = limiter.decide(&quota, &key, cost).await.unwrap();
            assert!(d.allowed, "{algorithm}: {d:?}");
        }
        let hits = limiter.stats().denied_from_cache;
        let cached = limiter.decide(&quota, &key, 2).await.unwrap();
        let redis = limiter.inspect(&quota, &key, 2).await.unwrap();
        let slack = last_sent.elapsed();
        assert_eq!(
            limiter.stats().denied_from_cache,
            hits + 1,
            "{algorithm}: the spent bucket is known in process"
        );
        assert_as_redis(&format!("{algorithm}"), &cached, &redis, slack);
        tokio::time::sleep(cached.retry_after).await;
        let retried = limiter.decide(&quota, &key, 2).await.unwrap();
        assert!(
            retried.allowed,
            "{algorithm}: denied after {cached:?}: {retried:?}"
        );
    }
}

/// A window denied at cost 3, then admitted twice at cost 1: the next denial
/// of cost 3 is Redis's, and sleeping its `retry_after` is enough. (Windows
/// of 3 s: only a stall of seconds could let the first admissions out of
/// the window before the denials.)
#[tokio::test]
async fn a_window_admitted_after_a_denial_is_denied_as_redis_would() {
    let server = RedisServer::start();
    let limiter = limiter(&server);
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let quota = window_of(algorithm, Duration::from_secs(3));
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
        let mut last_sent = Instant::now();
        for _ in 0..2 {
            last_sent = Instant::now();
            limiter.decide(&quota, &key, 1).await.unwrap();
        }
        let answer = limiter.decide(&quota, &key, 3).await.unwrap();
        if answer.allowed {
            assert_eq!(algorithm, Algorithm::FixedWindow, "{answer:?}");
            continue;
        }
        let redis = limiter.inspect(&quota, &key, 3).await.unwrap();
        let slack = last_sent.elapsed();
        assert_as_redis(&format!("{algorithm}"), &answer, &redis, slack);
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

/// A denial cached under a rule stays unanswered from the cache once the
/// rule changes, even when it changes back: meanwhile another instance may
/// have decided the key under the new rule, whose shorter window started a
/// new count. (The rule set to a minute's window for an override and back
/// to the hour's: this instance answered from its cache for the rest of the
/// hour what Redis admitted.)
#[tokio::test]
async fn a_denial_cached_before_a_rule_changed_and_back_is_asked_of_redis_again() {
    let server = RedisServer::start();
    // Half past an hour, on a clock both instances share.
    let hour = 3_600_000_000u64;
    let clock = ratelimit::ManualClock::new(1_760_000_400_000_000 / hour * hour + hour / 2);
    let instance = |cache: usize| {
        Limiter::builder()
            .redis(server.url())
            .clock(clock.clone())
            .timeout(Duration::from_secs(2))
            .deny_cache_max_keys(cache)
            .build()
            .unwrap()
    };
    let (cached, other) = (instance(10_000), instance(0));
    let hourly = Quota::fixed_window(2, Duration::from_secs(3_600)).unwrap();
    let override_ = Quota::fixed_window(2, Duration::from_secs(60)).unwrap();
    cached.rules().set("r", hourly);
    let rule = |limiter: &Limiter| limiter.rules().get("r").unwrap();
    for _ in 0..2 {
        cached
            .check(Request::new(&rule(&cached), "k"))
            .await
            .unwrap();
    }
    assert!(cached
        .check(Request::new(&rule(&cached), "k"))
        .await
        .is_err());
    // The override reaches both instances; the other decides under it.
    // (Within the second a cached denial is answered from.)
    clock.advance(Duration::from_millis(100));
    cached.rules().set("r", override_);
    other.rules().set("r", override_);
    other.check(Request::new(&rule(&other), "k")).await.unwrap();
    // And is removed.
    cached.rules().set("r", hourly);
    clock.advance(Duration::from_millis(100));
    let redis = other.inspect(&hourly, "k", 1).await.unwrap();
    assert!(
        redis.allowed,
        "Redis admits under the hour's rule: {redis:?}"
    );
    let quota = rule(&cached);
    let answered = cached.check(Request::new(&quota, "k")).await;
    assert!(
        answered.is_ok(),
        "answered from the cache what Redis admits: {answered:?}"
    );
}

/// What another writer gives back in Redis reaches this instance within a
/// second: its cached denial of the key is answered from for a second at
/// most, then one caller asks Redis again. The writers: another instance's
/// refund, another instance's reset, and an operator's `FLUSHALL`. Every
/// algorithm, each quota an hour long, so that a cached denial answered
/// until its wait ended would stand for the rest of the hour (`retry_after`
/// 3,600 s for a bucket at 1/h, while Redis admits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_another_writer_gives_back_is_seen_within_a_second() {
    let server = RedisServer::start();
    let (this, other) = (limiter(&server), limiter(&server));
    let hour = Duration::from_secs(3_600);
    let quotas = [
        bucket_at(Algorithm::TokenBucket, "1/h"),
        bucket_at(Algorithm::Gcra, "1/h"),
        bucket_at(Algorithm::LeakyBucket, "1/h"),
        window_of(Algorithm::FixedWindow, hour),
        window_of(Algorithm::SlidingLog, hour),
        window_of(Algorithm::SlidingWindow, hour),
    ];
    let mut redis = server.connection().await;
    for writer in ["refund", "reset", "flushall"] {
        for quota in &quotas {
            let context = format!("{writer}, {:?}", quota.algorithm());
            let key = format!("given-back:{writer}:{}", quota.algorithm());
            let request = || Request::new(quota, &key);
            // The other instance's admission, then this one's until denied.
            let receipt = other.check(request()).await.unwrap();
            while this.check(request()).await.is_ok() {}
            let cached_before = this.stats().denied_from_cache;
            let denied = this.check(request()).await.unwrap_err();
            assert!(
                this.stats().denied_from_cache > cached_before,
                "{context}: the denial was not answered from the cache: {denied:?}"
            );
            match writer {
                "refund" => other.refund(receipt).await.unwrap(),
                "reset" => other.reset(&key).await.unwrap(),
                _ => {
                    let () = redis::cmd("FLUSHALL")
                        .query_async(&mut redis)
                        .await
                        .unwrap();
                }
            }
            // A bucket's refund gives back what it has not refilled since:
            // a whole token a few milliseconds later.
            let writing = Instant::now();
            while !other.inspect(quota, &key, 1).await.unwrap().allowed {
                assert!(
                    writing.elapsed() < Duration::from_secs(1),
                    "{context}: Redis does not admit after the {writer}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let given_back = Instant::now();
            let admitted = loop {
                match this.check(request()).await {
                    Ok(_) => break given_back.elapsed(),
                    Err(denied) if given_back.elapsed() < Duration::from_secs(5) => {
                        let _ = denied;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(denied) => {
                        panic!("{context}: still denied 5 s after Redis admits: {denied:?}")
                    }
                }
            };
            assert!(
                admitted < Duration::from_secs(3),
                "{context}: admitted {admitted:?} after Redis admits"
            );
        }
    }
}
