//! Refunds against real servers: random sequences of checks, refunds of
//! earlier admissions (at once or later) and clock steps, decided on Redis
//! (with the deny cache on, as by default) and on the memory backend at
//! once. After each operation:
//! - Redis and the memory backend decided alike, so the Lua refunds and
//!   their Rust twins agree, whenever the refund is made;
//! - a refund made at the admission's instant leaves the key exactly as if
//!   the check had not been made: a twin limiter that only inspects those
//!   checks decides everything else alike.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use ratelimit::{
    Admitted, Algorithm, Clock, Decision, ErrorKind, Limiter, ManualClock, Quota, RateLimited,
    Request,
};
use support::{bucket, window, RedisServer};

/// Two quotas of each algorithm; a key is decided under one algorithm only.
fn quotas() -> Vec<[Quota; 2]> {
    use Algorithm::*;
    vec![
        [
            bucket(TokenBucket, 5, "2/s"),
            bucket(TokenBucket, 3, "1/min"),
        ],
        [bucket(Gcra, 4, "10/s"), bucket(Gcra, 3, "7/min")],
        [bucket(LeakyBucket, 4, "3/s"), bucket(LeakyBucket, 6, "1/s")],
        [window(FixedWindow, 5, "1s"), window(FixedWindow, 3, "2s")],
        [window(SlidingLog, 4, "1s"), window(SlidingLog, 3, "3s")],
        [
            window(SlidingWindow, 6, "1s"),
            window(SlidingWindow, 3, "3s"),
        ],
    ]
}

/// A limiter on `server` and one in memory, both deciding on `clock`: the
/// twins whose answers the tests compare.
fn on_one_clock(server: &RedisServer, clock: &ManualClock) -> [Limiter; 2] {
    [
        Limiter::builder()
            .redis(server.url())
            .timeout(Duration::from_secs(5))
            .clock(clock.clone())
            .build()
            .unwrap(),
        Limiter::builder()
            .memory()
            .clock(clock.clone())
            .build()
            .unwrap(),
    ]
}

/// Keys: one per algorithm, so that refunds and checks meet.
const KEYS: usize = 6;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

fn cases(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A check of one key: key, quota (modulo 2), cost (0, else from 1 to
    /// the capacity).
    Check(usize, usize, u64),
    /// An all-or-nothing check of distinct keys.
    All(Vec<(usize, usize, u64)>),
    /// Refunds the held admission at this index (modulo).
    Refund(usize),
    Forward(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let dim = (0..KEYS, 0usize..2, 0u64..8);
    prop_oneof![
        6 => dim.clone().prop_map(|(k, q, c)| Op::Check(k, q, c)),
        2 => proptest::collection::vec(dim, 1..4).prop_map(Op::All),
        5 => (0usize..64).prop_map(Op::Refund),
        3 => prop_oneof![0u64..50_000, 0u64..700_000, 0u64..4_000_000].prop_map(Op::Forward),
    ]
}

/// A decision's public figures.
fn figures(d: &Decision) -> (bool, u64, u64, Duration, Duration, Duration) {
    (
        d.allowed,
        d.limit,
        d.remaining,
        d.retry_after,
        d.reset_after,
        d.delay,
    )
}

/// A denial's figures, as a decision would show them.
fn denial_figures(denied: &RateLimited) -> (bool, u64, u64, Duration, Duration, Duration) {
    (
        false,
        denied.limit,
        denied.remaining,
        denied.retry_after,
        denied.reset_after,
        Duration::ZERO,
    )
}

/// An outcome as compared between backends.
fn outcome(result: &Result<Admitted<'_>, RateLimited>) -> String {
    match result {
        Ok(admitted) => format!(
            "{:?}",
            admitted.decisions().iter().map(figures).collect::<Vec<_>>()
        ),
        Err(denied) => format!("{denied:?}"),
    }
}

#[test]
fn refunds_on_redis_and_in_memory_agree_whenever_they_are_made() {
    let runtime = runtime();
    let server = RedisServer::start();
    let quotas = quotas();
    let case = std::sync::atomic::AtomicU64::new(0);
    let refunded = std::sync::atomic::AtomicU64::new(0);
    proptest!(cases(300), |(ops in proptest::collection::vec(op(), 1..80))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = 1_760_000_000_000_000;
        let clock = ManualClock::new(start);
        let [redis, memory] = on_one_clock(&server, &clock);
        let names: Vec<String> = (0..KEYS).map(|k| format!("refund:{case}:{k}")).collect();
        let quota_of = |k: usize, q: usize| &quotas[k][q % 2];
        let request = |k: usize, q: usize, c: u64| {
            let quota = quota_of(k, q);
            let cost = if c == 0 { 0 } else { 1 + (c - 1) % quota.capacity() };
            Request::new(quota, &names[k]).cost(cost)
        };
        let mut held: Vec<(Admitted<'_>, Admitted<'_>)> = Vec::new();
        let mut now = start;
        for (step, op) in ops.iter().enumerate() {
            let context = format!("step {step} {op:?}");
            let requests: Vec<Request<'_>> = match op {
                Op::Forward(d) => {
                    now += d;
                    clock.set(now);
                    continue;
                }
                Op::Refund(i) => {
                    if held.is_empty() {
                        continue;
                    }
                    let (r, m) = held.swap_remove(i % held.len());
                    let (r, m) = runtime.block_on(async { (redis.refund(r).await, memory.refund(m).await) });
                    prop_assert!(r.is_ok() && m.is_ok(), "{}: {:?} {:?}", context, r, m);
                    continue;
                }
                Op::Check(k, q, c) => vec![request(*k, *q, *c)],
                Op::All(dims) => {
                    let mut seen = Vec::new();
                    dims.iter()
                        .filter(|(k, _, _)| {
                            let new = !seen.contains(k);
                            seen.push(*k);
                            new
                        })
                        .map(|&(k, q, c)| request(k, q, c))
                        .collect()
                }
            };
            let (r, m) = runtime.block_on(async {
                (redis.check(&requests[..]).await, memory.check(&requests[..]).await)
            });
            match (&r, &m) {
                // The deny cache denies a check by a limit it knows is spent,
                // without asking about the others: another may deny longer.
                (Err(r), Err(m)) if r.key != m.key => prop_assert!(
                    r.cause == m.cause && r.retry_after <= m.retry_after,
                    "{}: redis {:?} vs memory {:?}", context, r, m
                ),
                _ => prop_assert_eq!(outcome(&r), outcome(&m), "{}", context),
            }
            if let (Ok(r), Ok(m)) = (r, m) {
                held.push((r, m));
            }
        }
        // Refunds that gave something back (a cost, a window not yet over).
        refunded.fetch_add(redis.stats().refunded, std::sync::atomic::Ordering::Relaxed);
        prop_assert_eq!(redis.stats().refunded, memory.stats().refunded);
    });
    assert!(
        refunded.into_inner() > 1_000,
        "too few refunds gave anything back to say anything"
    );
}

#[derive(Debug, Clone)]
enum Step {
    /// A check of one key, refunded at once when the flag is set: key, cost
    /// (modulo capacity + 1). Each key keeps one quota: an admission under
    /// one quota drops state that only another quota would still count.
    Check(usize, u64, bool),
    Forward(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..KEYS, 0u64..8, any::<bool>()).prop_map(|(k, c, r)| Step::Check(k, c, r)),
        2 => prop_oneof![0u64..50_000, 0u64..700_000, 0u64..4_000_000].prop_map(Step::Forward),
    ]
}

#[test]
fn a_refund_at_the_admissions_instant_undoes_it_on_redis_and_in_memory() {
    let runtime = runtime();
    let server = RedisServer::start();
    let quotas = quotas();
    let case = std::sync::atomic::AtomicU64::new(0);
    proptest!(cases(150), |(steps in proptest::collection::vec(step(), 1..60))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = 1_770_000_000_000_000;
        let clock = ManualClock::new(start);
        let limiters = on_one_clock(&server, &clock);
        // Never asked for the checks that are refunded: it inspects them.
        let twin = Limiter::builder().memory().clock(clock.clone()).build().unwrap();
        let names: Vec<String> = (0..KEYS).map(|k| format!("undo:{case}:{k}")).collect();
        let mut now = start;
        for (i, step) in steps.iter().enumerate() {
            let context = format!("step {i} {step:?}");
            let (k, c, undo) = match step {
                Step::Forward(d) => {
                    now += d;
                    clock.set(now);
                    continue;
                }
                Step::Check(k, c, undo) => (*k, *c, *undo),
            };
            let quota = &quotas[k][case as usize % 2];
            let cost = c % (quota.capacity() + 1);
            let request = Request::new(quota, &names[k]).cost(cost);
            let expected = runtime.block_on(async {
                if undo {
                    figures(&twin.inspect(quota, &names[k], cost).await.expect("an inspection"))
                } else {
                    match twin.check(request).await {
                        Ok(admitted) => figures(&admitted.decisions()[0]),
                        Err(denied) => denial_figures(&denied),
                    }
                }
            });
            for limiter in &limiters {
                let got = runtime.block_on(async {
                    match limiter.check(request).await {
                        Ok(admitted) => {
                            let figures = figures(&admitted.decisions()[0]);
                            if undo {
                                limiter.refund(admitted).await.expect("a refund");
                            }
                            figures
                        }
                        Err(denied) => denial_figures(&denied),
                    }
                });
                prop_assert_eq!(
                    &got, &expected,
                    "{} on {}", context, limiter.backend_name()
                );
            }
        }
    });
}

/// A limiter on `server` that decides on Redis's own clock (`TIME`), as in
/// production: a window's refund finds its window from this process's
/// clock, whatever the offset between the two.
fn on_redis_time(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Two a day for each algorithm: no window ends and no token refills
/// while a test runs (a day's boundary aside).
fn daily() -> Vec<Quota> {
    let day = Duration::from_secs(86_400);
    let rate: ratelimit::Rate = "2/d".parse().unwrap();
    let mut quotas: Vec<Quota> = [Algorithm::TokenBucket, Algorithm::Gcra]
        .into_iter()
        .map(|algorithm| {
            Quota::builder(algorithm)
                .capacity(2)
                .rate(rate)
                .build()
                .unwrap()
        })
        .collect();
    quotas.extend([
        Quota::fixed_window(2, day).unwrap(),
        Quota::sliding_window(2, day).unwrap(),
        Quota::sliding_log(2, day).unwrap(),
    ]);
    quotas
}

#[tokio::test]
async fn a_refunded_admission_is_admitted_again_on_redis_time() {
    let server = RedisServer::start();
    let limiter = on_redis_time(&server);
    for quota in daily() {
        let key = format!("again:{}", quota.algorithm());
        let sent = std::time::Instant::now();
        let first = limiter.check(Request::new(&quota, &key)).await.unwrap();
        let first_took = sent.elapsed();
        limiter.check(Request::new(&quota, &key)).await.unwrap();
        let denied = limiter.check(Request::new(&quota, &key)).await.unwrap_err();
        assert_eq!(denied.cause, ratelimit::DenialCause::Quota, "{quota:?}");
        // The denial is cached now; the refund forgets it.
        limiter.refund(first).await.unwrap();
        let mut again = limiter.check(Request::new(&quota, &key)).await;
        if let Err(denied) = &again {
            // A bucket gets back all but what it refilled while the first
            // check was on its way: at most that long a wait (and a
            // millisecond for the clocks' rounding).
            assert!(
                !quota.algorithm().is_windowed()
                    && denied.retry_after <= first_took + Duration::from_millis(1),
                "{quota:?}: {denied:?}, the first check took {first_took:?}"
            );
            tokio::time::sleep(denied.retry_after).await;
            again = limiter.check(Request::new(&quota, &key)).await;
        }
        assert!(again.is_ok(), "{quota:?}: {again:?}");
        assert!(
            limiter.check(Request::new(&quota, &key)).await.is_err(),
            "{quota:?}: one refund gives back one admission"
        );
    }
    assert_eq!(limiter.stats().refunded, 5);
}

#[tokio::test]
async fn a_check_of_several_limits_gives_each_its_cost_back() {
    let server = RedisServer::start();
    let limiter = on_redis_time(&server);
    let quotas = daily();
    let keys: Vec<String> = quotas
        .iter()
        .map(|q| format!("several:{}", q.algorithm()))
        .collect();
    let requests: Vec<Request<'_>> = quotas
        .iter()
        .zip(&keys)
        .map(|(quota, key)| Request::new(quota, key).cost(2))
        .collect();
    let sent = std::time::Instant::now();
    let admitted = limiter.check(&requests[..]).await.unwrap();
    let took = sent.elapsed();
    assert!(limiter.check(&requests[..]).await.is_err());
    limiter.refund(admitted).await.unwrap();
    // A bucket gets back all but what it refilled while the check was on
    // its way (the refund cannot know when Redis decided, so it counts
    // from before the call): as long again later it is whole.
    tokio::time::sleep(took + Duration::from_millis(1)).await;
    for (quota, key) in quotas.iter().zip(&keys) {
        assert_eq!(left(&limiter, quota, key).await, 2, "{quota:?}");
    }
    assert!(limiter.check(&requests[..]).await.is_ok());
}

/// What `key` has left under `quota`, read without taking anything.
async fn left(limiter: &Limiter, quota: &Quota, key: &str) -> u64 {
    limiter.inspect(quota, key, 0).await.unwrap().remaining
}

#[tokio::test]
async fn a_leased_token_goes_back_to_its_lease() {
    let server = RedisServer::start();
    let limiter = on_redis_time(&server);
    let quota = Quota::new(10, "10/d".parse().unwrap()).unwrap();
    let request = Request::new(&quota, "leased").lease(5);
    let admitted = limiter.check(request).await.unwrap();
    // Five taken from Redis in one call: one served, four leased.
    assert_eq!(left(&limiter, &quota, "leased").await, 5);
    // Three served from the lease, one of them refunded: back in the
    // lease, not in Redis.
    for _ in 0..2 {
        limiter.check(request).await.unwrap();
    }
    let from_lease = limiter.check(request).await.unwrap();
    limiter.refund(admitted).await.unwrap();
    limiter.refund(from_lease).await.unwrap();
    assert_eq!(left(&limiter, &quota, "leased").await, 5);
    // The lease serves the refunded tokens again, with no Redis call.
    let served = limiter.check(request).await.unwrap();
    assert_eq!(left(&limiter, &quota, "leased").await, 5);
    assert!(
        served.decisions()[0].remaining >= 1,
        "{:?}",
        served.decisions()
    );
    assert_eq!(limiter.stats().refunded, 2);
}

#[tokio::test]
async fn fallback_admissions_are_given_back_where_they_were_taken() {
    let mut server = RedisServer::start();
    let quota = Quota::new(4, "4/d".parse().unwrap()).unwrap();
    let local = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(200))
        .failure_policy(ratelimit::FailurePolicy::Local)
        .local_share(0.5)
        .build()
        .unwrap();
    let open = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    // One admitted on Redis before it goes.
    let on_redis = open.check(Request::new(&quota, "kept")).await.unwrap();
    server.kill();
    // The local share is 2 of 4: spent, refunded, admitted again.
    let first = local.check(Request::new(&quota, "local")).await.unwrap();
    assert!(first.decisions()[0].fallback);
    local.check(Request::new(&quota, "local")).await.unwrap();
    assert!(local.check(Request::new(&quota, "local")).await.is_err());
    local.refund(first).await.unwrap();
    assert!(local.check(Request::new(&quota, "local")).await.is_ok());
    // Failing open took nothing: its refund does nothing, and succeeds.
    let opened = open.check(Request::new(&quota, "open")).await.unwrap();
    assert!(opened.decisions()[0].fallback);
    open.refund(opened).await.unwrap();
    // A refund that needs Redis while it is down is a typed error.
    let error = open.refund(on_redis).await.unwrap_err();
    assert!(
        matches!(error.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{error:?}"
    );
    assert_eq!(local.stats().refunded, 1);
}

/// A clock that stands still but for one step forward, at its `step_at`-th
/// reading, and counts its readings.
#[derive(Debug, Clone)]
struct StepAt {
    start: u64,
    step: u64,
    step_at: u64,
    readings: Arc<AtomicU64>,
}

impl Clock for StepAt {
    fn now_micros(&self) -> u64 {
        if self.readings.fetch_add(1, Ordering::Relaxed) < self.step_at {
            self.start
        } else {
            self.start + self.step
        }
    }
}

/// A fallback admission given back leaves its key whole, whenever the clock
/// moves: the step is tried at every reading a check and its refund make in
/// turn. Had the admission been stamped with an instant read before the
/// local limiter decided, a step between the two readings would have made
/// the refund count a refill that never happened and give back half a
/// token.
#[tokio::test]
async fn a_fallback_admission_given_back_leaves_its_key_whole_however_the_clock_steps() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    // Two of four a day locally: a token every 12 hours; the step is half
    // of one.
    let quota = Quota::new(4, "4/d".parse().unwrap()).unwrap();
    for step_at in 0.. {
        let clock = StepAt {
            start: 1_780_000_000_000_000,
            step: 6 * 3_600_000_000,
            step_at,
            readings: Arc::new(AtomicU64::new(0)),
        };
        let limiter = Limiter::builder()
            .redis(url.clone())
            .clock(clock.clone())
            .timeout(Duration::from_millis(200))
            .failure_policy(ratelimit::FailurePolicy::Local)
            .local_share(0.5)
            .build()
            .unwrap();
        let first = limiter.check(Request::new(&quota, "k")).await.unwrap();
        assert!(first.decisions()[0].fallback, "{:?}", first.decisions());
        limiter.refund(first).await.unwrap();
        for n in 1..=2 {
            let again = limiter.check(Request::new(&quota, "k")).await;
            assert!(
                again.is_ok(),
                "with the clock stepping at reading {step_at}, check {n} after the refund \
                 was denied: {again:?}"
            );
        }
        assert!(limiter.check(Request::new(&quota, "k")).await.is_err());
        if clock.readings.load(Ordering::Relaxed) <= step_at {
            // The clock never stepped: every reading has been tried.
            assert!(step_at > 2, "only {step_at} readings");
            break;
        }
    }
}

/// Hundreds of callers at once, each checking and giving back half of what
/// it was admitted, with the deny cache on: no admission beyond the quota
/// while they run, every refund makes room for another admission, and once
/// they are done the key holds exactly what was kept. With leases on, the
/// leases the crowd took at once add up rather than replace each other, so
/// the callers after it are admitted the rest of the quota.
#[test]
fn concurrent_checks_and_refunds_keep_the_count() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for (quota, lease) in [
            (Quota::new(100, "100/d".parse().unwrap()).unwrap(), 0),
            (Quota::new(100, "100/d".parse().unwrap()).unwrap(), 8),
            (
                Quota::fixed_window(100, Duration::from_secs(86_400)).unwrap(),
                0,
            ),
            (
                Quota::sliding_log(100, Duration::from_secs(86_400)).unwrap(),
                0,
            ),
        ] {
            let limiter = on_redis_time(&server);
            let key = format!("crowd:{}:{lease}", quota.algorithm());
            let callers = (0..400).map(|i| {
                let (limiter, key) = (limiter.clone(), key.clone());
                tokio::spawn(async move {
                    let request = Request::new(&quota, &key).lease(lease);
                    match limiter.check(request).await {
                        Ok(admitted) if i % 2 == 0 => {
                            limiter.refund(admitted).await.expect("a refund");
                            (1, 0)
                        }
                        Ok(_) => (1, 1),
                        Err(denied) => {
                            assert_eq!(denied.cause, ratelimit::DenialCause::Quota);
                            (0, 0)
                        }
                    }
                })
            });
            let mut admitted = 0;
            let mut kept = 0;
            for caller in futures::future::join_all(callers).await {
                let (a, k) = caller.unwrap();
                admitted += a;
                kept += k;
            }
            let left = left(&limiter, &quota, &key).await;
            assert!(
                left + kept <= 100,
                "{quota:?} lease {lease}: {kept} kept, {left} left"
            );
            if lease == 0 {
                // Every refund made room for another admission, and the key
                // holds what was kept: exactly for the windows; a bucket's
                // refunds leave out what it refilled while each check was on
                // its way, so it may be a fraction of a token short.
                assert!(admitted > 100, "{quota:?}: {admitted} admitted");
                let short = u64::from(!quota.algorithm().is_windowed());
                assert!(
                    left + kept <= 100 && left + kept + short >= 100,
                    "{quota:?}: {kept} kept, {left} left"
                );
                continue;
            }
            // Callers that found no lease at once each leased: what they
            // leased serves the callers after them, none of it lost. Drained
            // one call at a time, the day's quota is all admitted (a token
            // at most is lost to the lease's rounding).
            let request = Request::new(&quota, &key).lease(lease);
            let mut drained = 0;
            while limiter.check(request).await.is_ok() {
                drained += 1;
                assert!(
                    kept + drained <= 100,
                    "{quota:?} lease {lease}: over the quota"
                );
            }
            assert!(
                kept + drained >= 99,
                "{quota:?} lease {lease}: {kept} kept by the crowd, {drained} after it"
            );
        }
    });
}

/// Redis flushed between an admission and its refund: the refund finds
/// nothing and gives nothing, the key stays whole (never above its
/// quota). Redis frozen during a refund: a typed timeout; the refund sent
/// may still land when Redis wakes, once, never twice.
#[tokio::test]
async fn a_refund_after_a_flush_or_into_a_frozen_redis_gives_nothing_extra() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    for quota in daily() {
        let key = format!("flushed:{}", quota.algorithm());
        let admitted = limiter
            .check(Request::new(&quota, &key).cost(2))
            .await
            .unwrap();
        let mut connection = server.connection().await;
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut connection)
            .await
            .unwrap();
        limiter.refund(admitted).await.unwrap();
        assert_eq!(left(&limiter, &quota, &key).await, 2, "{quota:?}");
        let mut db_keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut connection)
            .await
            .unwrap();
        db_keys.retain(|k| k.contains("flushed"));
        assert!(db_keys.is_empty(), "{quota:?}: a refund wrote {db_keys:?}");
    }
    let quota = Quota::new(2, "2/d".parse().unwrap()).unwrap();
    let admitted = limiter.check(Request::new(&quota, "frozen")).await.unwrap();
    server.freeze();
    let error = limiter.refund(admitted).await.unwrap_err();
    server.thaw();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error:?}");
    let now_left = left(&limiter, &quota, "frozen").await;
    assert!(
        (1..=2).contains(&now_left),
        "a timed-out refund lands once or not at all: {now_left} left"
    );
}

/// A key that something replaced with another type after its admission:
/// its refund leaves it as it is, and the refund sent beside it applies, on
/// the function and on the native module. (The function failed the whole
/// call with `WRONGTYPE` before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_beside_one_of_a_key_of_another_type_applies() {
    let module = support::native_module();
    for server in [
        RedisServer::start(),
        RedisServer::start_with(&["--loadmodule", module.to_str().unwrap()]),
    ] {
        let limiter = on_redis_time(&server);
        let mut connection = server.connection().await;
        for quota in daily() {
            let (kept, replaced) = (
                format!("kept:{}", quota.algorithm()),
                format!("replaced:{}", quota.algorithm()),
            );
            let kept_admitted = limiter
                .check(Request::new(&quota, &kept).cost(2))
                .await
                .unwrap();
            let replaced_admitted = limiter
                .check(Request::new(&quota, &replaced).cost(2))
                .await
                .unwrap();
            let stored = format!("rl:{replaced}");
            let _: () = redis::pipe()
                .atomic()
                .del(&stored)
                .rpush(&stored, "not a limit's")
                .query_async(&mut connection)
                .await
                .unwrap();
            // Sent together: they may share a call.
            let (kept_refund, replaced_refund) = tokio::join!(
                limiter.refund(kept_admitted),
                limiter.refund(replaced_admitted)
            );
            assert!(
                kept_refund.is_ok() && replaced_refund.is_ok(),
                "{quota:?}: {kept_refund:?}, {replaced_refund:?}"
            );
            // Nothing is left without the refund, all day; a bucket may
            // have a token less for the microseconds it refilled since.
            let now_left = left(&limiter, &quota, &kept).await;
            assert!(now_left >= 1, "{quota:?}: {now_left} left after its refund");
            let kind: String = redis::cmd("TYPE")
                .arg(&stored)
                .query_async(&mut connection)
                .await
                .unwrap();
            assert_eq!(kind, "list", "{quota:?}");
        }
    }
}

/// A bucket refunds only what it has not refilled of an admission: one
/// made before the bucket was full again gives nothing back, so the
/// admissions made since keep the bucket at its capacity.
#[test]
fn a_bucket_refund_never_gives_back_a_token_that_refilled() {
    let runtime = runtime();
    let server = RedisServer::start();
    let start = 1_780_000_000_000_000;
    let clock = ManualClock::new(start);
    let limiters = on_one_clock(&server, &clock);
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        let quota = bucket(algorithm, 2, "1/s");
        for limiter in &limiters {
            clock.set(start);
            let key = format!("refilled:{algorithm}:{}", limiter.backend_name());
            runtime.block_on(async {
                let first = limiter.check(Request::new(&quota, &key)).await.unwrap();
                clock.set(start + 2_000_000);
                limiter.check(Request::new(&quota, &key)).await.unwrap();
                limiter.check(Request::new(&quota, &key)).await.unwrap();
                limiter.refund(first).await.unwrap();
                let again = limiter.check(Request::new(&quota, &key)).await;
                assert!(
                    again.is_err(),
                    "{quota:?} on {}: a refilled token was given back: {again:?}",
                    limiter.backend_name()
                );
            });
        }
    }
}

/// An admission is refunded by the limiter that made it, or a clone of it;
/// another limiter refuses it and gives nothing back.
#[tokio::test]
async fn only_the_limiter_that_admitted_takes_the_refund() {
    let (a, b) = (Limiter::memory(), Limiter::memory());
    let quota = Quota::per_minute(1).unwrap();
    b.check(Request::new(&quota, "k")).await.unwrap();
    let admitted = a.check(Request::new(&quota, "k")).await.unwrap();
    let error = b.refund(admitted).await.unwrap_err();
    assert!(matches!(error, ratelimit::Error::OtherLimiter), "{error:?}");
    assert_eq!(error.kind(), ErrorKind::Configuration);
    assert_eq!(left(&b, &quota, "k").await, 0, "b's key untouched");
    assert_eq!(left(&a, &quota, "k").await, 0, "a's admission stands");
    let admitted = b.clone().check(Request::new(&quota, "j")).await.unwrap();
    b.refund(admitted).await.unwrap();
    assert_eq!(
        left(&b, &quota, "j").await,
        1,
        "a clone is the same limiter"
    );
}

/// A limiter made after another was dropped, whose shared state the
/// allocator may put at the dropped one's address, refuses the dropped
/// one's admissions: it named its limiter by that address, and took them.
#[tokio::test]
async fn a_new_limiter_refuses_the_refund_of_a_dropped_ones_admission() {
    let quota = Quota::fixed_window(1, Duration::from_secs(3_600)).unwrap();
    for round in 0..50 {
        let dropped = Limiter::memory();
        let admitted = dropped.check(Request::new(&quota, "k")).await.unwrap();
        drop(dropped);
        let limiter = Limiter::memory();
        limiter.check(Request::new(&quota, "k")).await.unwrap();
        let refunded = limiter.refund(admitted).await;
        assert!(
            matches!(refunded, Err(ratelimit::Error::OtherLimiter)),
            "round {round}: a new limiter took the refund of a dropped one's admission: \
             {refunded:?}, then {}",
            outcome(&limiter.check(Request::new(&quota, "k")).await)
        );
    }
}

/// A reset made after an admission, on a clock that stepped back between
/// the two (a wall clock set back), still makes the admission's refund give
/// nothing: the reset was told from the admission by the clock's readings,
/// and the refund gave the old token to the count begun after the reset.
#[tokio::test]
async fn a_reset_after_the_clock_stepped_back_still_voids_older_refunds() {
    let clock = ManualClock::new(1_760_000_000_000_000);
    let limiter = Limiter::builder()
        .memory()
        .clock(clock.clone())
        .build()
        .unwrap();
    for quota in daily() {
        let key = format!("stepped-back:{}", quota.algorithm());
        clock.set(1_760_000_000_000_000);
        let before = limiter.check(Request::new(&quota, &key)).await.unwrap();
        clock.set(1_760_000_000_000_000 - 5_000_000);
        limiter.reset(&key).await.unwrap();
        for _ in 0..quota.capacity() {
            limiter.check(Request::new(&quota, &key)).await.unwrap();
        }
        limiter.refund(before).await.unwrap();
        let after = limiter.check(Request::new(&quota, &key)).await;
        assert!(
            after.is_err(),
            "{quota:?}: a refund from before the reset admitted one more: {}",
            outcome(&after)
        );
    }
}

/// A refund of an admission made under a bucket's old quota, after the
/// limiter leased the key's tokens under a new one (a rule raised while a
/// call ran, with `refund_on`), brings the lease's tokens sooner as much as
/// one under the same quota: the lease is cut with it. It was left as it
/// was, and served tokens the bucket held again: 29 admitted at one
/// instant from a bucket of 20.
#[tokio::test]
async fn a_refund_under_an_older_quota_cuts_a_lease_taken_under_the_new_one() {
    let server = RedisServer::start();
    let clock = ManualClock::new(1_760_000_000_000_000);
    let on_clock = |cache: usize| {
        Limiter::builder()
            .redis(server.url())
            .clock(clock.clone())
            .timeout(Duration::from_secs(5))
            .deny_cache_max_keys(cache)
            .build()
            .unwrap()
    };
    let (leasing, other) = (on_clock(10_000), on_clock(0));
    let old = Quota::new(10, "100/s".parse().unwrap()).unwrap();
    let new = Quota::new(20, "100/s".parse().unwrap()).unwrap();
    let before = leasing
        .check(Request::new(&old, "k").cost(10))
        .await
        .unwrap();
    clock.advance(Duration::from_micros(1));
    leasing
        .check(Request::new(&new, "k").lease(10))
        .await
        .unwrap();
    clock.advance(Duration::from_micros(1));
    leasing.refund(before).await.unwrap();
    clock.advance(Duration::from_millis(100));
    let mut admitted = 0;
    while other.check(Request::new(&new, "k")).await.is_ok() {
        admitted += 1;
    }
    let from_redis = admitted;
    while leasing
        .check(Request::new(&new, "k").lease(10))
        .await
        .is_ok()
    {
        admitted += 1;
        assert!(admitted <= 40, "the lease never ran out");
    }
    assert!(
        admitted <= 20,
        "a bucket of 20 admitted {admitted} at one instant ({from_redis} by Redis, the rest \
         by the lease)"
    );
}

/// A rule changed to a shorter window while an admission of the old one is
/// out: its refund leaves the new window's count, which never held it, so
/// the new window admits no more than its limit; changed to a longer one, a
/// refund of the new rule's admission gives it back. On Redis (the function
/// and the native module) and in memory alike.
#[test]
fn a_refund_leaves_a_window_begun_under_another_rule() {
    let runtime = runtime();
    let (plain, module) = (
        RedisServer::start(),
        RedisServer::start_with(&["--loadmodule", support::native_module().to_str().unwrap()]),
    );
    let minute = 60_000_000;
    let start = 30_000_000 * minute;
    let clock = ManualClock::new(start + 5_000_000);
    let on = |server: &RedisServer| {
        Limiter::builder()
            .redis(server.url())
            .clock(clock.clone())
            .deny_cache_max_keys(0)
            .build()
            .unwrap()
    };
    let limiters = [
        ("the function", on(&plain)),
        ("the module", on(&module)),
        (
            "memory",
            Limiter::builder()
                .memory()
                .clock(clock.clone())
                .build()
                .unwrap(),
        ),
    ];
    for (algorithm, limit) in [(Algorithm::FixedWindow, 10), (Algorithm::SlidingWindow, 9)] {
        let old = window(algorithm, 100, "1m");
        let new = window(algorithm, 10, "10s");
        for (name, limiter) in &limiters {
            clock.set(start + 5_000_000);
            let key = format!("rule-changed:{algorithm}");
            runtime.block_on(async {
                let first = limiter.check(Request::new(&old, &key)).await.unwrap();
                clock.set(start + 12_000_000);
                let mut admitted = 0;
                while limiter.check(Request::new(&new, &key)).await.is_ok() {
                    admitted += 1;
                }
                assert_eq!(admitted, limit, "{new:?} on {name}");
                limiter.refund(first).await.unwrap();
                let again = limiter.check(Request::new(&new, &key)).await;
                assert!(
                    again.is_err(),
                    "{new:?} on {name}: admitted past its limit after the old rule's refund"
                );
            });
        }
        // Lengthened: the short window's count is carried, and a refund of
        // an admission under the long one gives it back.
        let (short, long) = (window(algorithm, 10, "10s"), window(algorithm, 3, "1m"));
        for (name, limiter) in &limiters {
            clock.set(start + 22_000_000);
            let key = format!("rule-lengthened:{algorithm}");
            runtime.block_on(async {
                limiter.check(Request::new(&short, &key)).await.unwrap();
                clock.set(start + 25_000_000);
                let admitted = limiter.check(Request::new(&long, &key)).await.unwrap();
                limiter.check(Request::new(&long, &key)).await.unwrap();
                assert!(limiter.check(Request::new(&long, &key)).await.is_err());
                limiter.refund(admitted).await.unwrap();
                let again = limiter.check(Request::new(&long, &key)).await;
                assert!(
                    again.is_ok(),
                    "{long:?} on {name}: its own admission's refund gave nothing back"
                );
            });
        }
    }
    runtime.block_on(async {
        assert!(
            module.command_calls(&["ratelimit.decide"]).await > 0,
            "the module decided"
        );
        assert_eq!(module.script_calls().await, 0, "the module decided alone");
    });
}

/// An admission made before its key was reset holds nothing of the state
/// after it: its refund gives nothing back there, on the memory backend, on
/// Redis and under the local fallback. (Each gave the refund's cost to the
/// reset key's new count or debt, admitting a request over its quota.)
#[tokio::test]
async fn a_refund_of_an_admission_made_before_a_reset_gives_nothing_back() {
    let mut server = RedisServer::start();
    // Mid-day, on a clock that moves only when told: the refund finds every
    // token of its admission still owed and its window still running.
    let clock = ManualClock::new(
        1_760_000_000_000_000 - 1_760_000_000_000_000 % 86_400_000_000 + 3_600_000_000,
    );
    let [redis, memory] = on_one_clock(&server, &clock);
    let mut over = Vec::new();
    for (name, limiter) in [("memory", &memory), ("redis", &redis)] {
        for quota in daily() {
            let key = format!("reset-then-refund:{name}:{}", quota.algorithm());
            let before = limiter.check(Request::new(&quota, &key)).await.unwrap();
            clock.advance(Duration::from_micros(1));
            limiter.reset(&key).await.unwrap();
            clock.advance(Duration::from_micros(1));
            // The reset gave the whole quota back, and it is spent again.
            for _ in 0..quota.capacity() {
                limiter.check(Request::new(&quota, &key)).await.unwrap();
            }
            limiter.refund(before).await.unwrap();
            // Past what the bucket refilled since the admission.
            clock.advance(Duration::from_micros(10));
            if limiter.check(Request::new(&quota, &key)).await.is_ok() {
                over.push(format!("{name} {quota:?}"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "a refund from before the reset admitted one more: {over:?}"
    );
    // The local fallback: the reset reaches no Redis, but forgets what the
    // fallback counted of the key, and the admission from before it gives
    // nothing back to what is counted after.
    let local = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(200))
        .failure_policy(ratelimit::FailurePolicy::Local)
        .local_share(1.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    server.kill();
    let quota = Quota::new(2, "2/d".parse().unwrap()).unwrap();
    let before = local.check(Request::new(&quota, "local")).await.unwrap();
    local.check(Request::new(&quota, "local")).await.unwrap();
    assert!(local.check(Request::new(&quota, "local")).await.is_err());
    clock.advance(Duration::from_micros(1));
    assert!(local.reset("local").await.is_err(), "Redis is gone");
    clock.advance(Duration::from_micros(1));
    local.check(Request::new(&quota, "local")).await.unwrap();
    local
        .check(Request::new(&quota, "local"))
        .await
        .unwrap_or_else(|denied| panic!("the reset left the fallback's count: {denied:?}"));
    local.refund(before).await.unwrap();
    clock.advance(Duration::from_micros(10));
    assert!(
        local.check(Request::new(&quota, "local")).await.is_err(),
        "a fallback refund from before the reset admitted one more"
    );
}

/// A lease asked for while another caller's call on its key was on its way
/// waits for that call's answer before its own call is made. An admission
/// asked for meanwhile, without a lease, is owed before the lease's tokens,
/// and its refund must bring the lease's end sooner: the lease had taken
/// the instant before its wait for its own, found the admission asked for
/// after it, kept its end, and served two tokens past a full bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_waited_for_another_call_is_cut_by_a_refund_asked_for_meanwhile() {
    let server = RedisServer::start();
    let relay = support::Relay::start(server.port()).await;
    // Twenty at a token every 3 s, on a clock that moves only when told.
    let start = 1_760_000_000_000_000;
    let clock = ManualClock::new(start);
    // Long enough for the lease's wait for the probe and its own call, each
    // held up by the relay's delay.
    let limiter = Limiter::builder()
        .redis(relay.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .lease_ttl(Duration::from_secs(3_600))
        .build()
        .unwrap();
    let other = Limiter::builder()
        .redis(server.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(2))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    // Spawned checks keep their requests' quota.
    let quota: &'static Quota =
        Box::leak(Box::new(Quota::new(20, "20/min".parse().unwrap()).unwrap()));
    let key = "waited";
    let tick = |clock: &ManualClock| clock.advance(Duration::from_micros(1));
    // The limiter takes seven, which it keeps in its deny cache (the next
    // seven may not fit); another instance takes three.
    limiter
        .check(Request::new(quota, key).cost(7))
        .await
        .unwrap();
    tick(&clock);
    other.check(Request::new(quota, key).cost(3)).await.unwrap();
    tick(&clock);
    // Every connection the batches take turns on is made (on first use)
    // before the network slows down: one still connecting would hold its
    // call back.
    for _ in 0..4 {
        limiter.check(Request::new(quota, "warm")).await.unwrap();
    }
    // The three calls below are made 300 ms apart, all well before the
    // probe's answer comes back, however slowly the machine runs them.
    relay.delay_replies(Duration::from_secs(2));
    let limiter = Arc::new(limiter);
    let spawn = |cost: u64, lease: u64| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let request = Request::new(quota, key).cost(cost).lease(lease);
            limiter.check(request).await
        })
    };
    // Eleven may be the last to fit, as the limiter knows the key: it asks
    // Redis, which denies it (the other instance's three).
    let probe = spawn(11, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    tick(&clock);
    // A lease of seven may not fit either: it waits for the probe's answer.
    let leased = spawn(1, 7);
    tokio::time::sleep(Duration::from_millis(300)).await;
    tick(&clock);
    // Three fit whatever the probe finds: asked for at once.
    let meanwhile = spawn(3, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    tick(&clock);
    assert!(probe.await.unwrap().is_err(), "Redis denies eleven");
    let meanwhile = meanwhile.await.unwrap().expect("three admitted");
    let leased = leased.await.unwrap().expect("the lease of seven admitted");
    assert_eq!(
        (
            meanwhile.decisions()[0].remaining,
            leased.decisions()[0].remaining
        ),
        (7, 0),
        "the three decided before the lease of seven, which took the rest"
    );
    relay.delay_replies(Duration::ZERO);
    // 7 + 3 + 3 + 7 taken, in that order; the second three given back.
    limiter.refund(meanwhile).await.unwrap();
    // 45 s on, the bucket owes 2 tokens, the lease's: what Redis holds and
    // what the lease may still serve is a full bucket, 20, at most.
    clock.advance(Duration::from_secs(45));
    let mut admitted = 0;
    while other.check(Request::new(quota, key)).await.is_ok() {
        admitted += 1;
    }
    let from_redis = admitted;
    while limiter
        .check(Request::new(quota, key).lease(7))
        .await
        .is_ok()
    {
        admitted += 1;
    }
    assert!(
        admitted <= 20,
        "{admitted} admitted at once from a bucket of 20, {from_redis} of them by Redis"
    );
}

/// A refund whose caller gives up once it is sent (a tower `Timeout`, a
/// client gone): Redis takes it all the same, and the key's cached denial,
/// which it ends, is forgotten, rather than denying the key in process for
/// the rest of the window. It is not counted as refunded: its caller does
/// not know that it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_given_up_once_sent_leaves_no_cached_denial() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let quota = Quota::fixed_window(1, Duration::from_secs(3600)).unwrap();
    let admitted = limiter
        .check(Request::new(&quota, "given-up"))
        .await
        .unwrap();
    let denied = limiter.check(Request::new(&quota, "given-up")).await;
    assert!(denied.is_err(), "spent: {denied:?}");
    server.freeze();
    // Half a second: long enough for the refund to be sent, well short of
    // the limiter's own timeout.
    let given_up = tokio::time::timeout(Duration::from_millis(500), limiter.refund(admitted)).await;
    assert!(given_up.is_err(), "Redis is frozen: {given_up:?}");
    server.thaw();
    // Redis takes the refund once it wakes; the next check goes to it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.check(Request::new(&quota, "given-up")).await {
            Ok(admitted) => {
                assert!(!admitted.decisions()[0].fallback);
                break;
            }
            Err(denied) => assert!(
                std::time::Instant::now() < deadline,
                "Redis took the refund, and the key is still denied: {denied:?} (stats {:?})",
                limiter.stats()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limiter.stats().refunded, 0);
}

#[derive(Debug)]
enum JobError {
    Limited(#[allow(dead_code)] RateLimited),
    Failed,
}

impl From<RateLimited> for JobError {
    fn from(denied: RateLimited) -> Self {
        JobError::Limited(denied)
    }
}

#[ratelimit::rate_limit(key = "job:<id>", capacity = 100, rate = "1/h", limiter = limiter, refund_on = err)]
async fn failing_job(limiter: &Limiter, id: u64, hold: Duration) -> Result<(), JobError> {
    tokio::time::sleep(hold).await;
    let _ = id;
    Err(JobError::Failed)
}

/// Redis killed while 200 admitted calls run: each call's refund fails, and
/// the failure is logged once a second at most, as the checks' own failures
/// are, not once per call.
#[tokio::test]
async fn refunds_an_outage_fails_are_logged_once_a_second() {
    let mut server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let began = std::time::Instant::now();
    let (outcomes, log) = support::logged(async {
        let calls: Vec<_> = (0..200)
            .map(|id| failing_job(&limiter, id, Duration::from_millis(500)))
            .collect();
        let all = futures::future::join_all(calls);
        let kill = async {
            tokio::time::sleep(Duration::from_millis(250)).await;
            server.kill();
        };
        let (outcomes, ()) = tokio::join!(all, kill);
        outcomes
    })
    .await;
    let failed = outcomes
        .iter()
        .filter(|o| matches!(o, Err(JobError::Failed)))
        .count();
    assert_eq!(failed, 200, "every call was admitted and ran: {outcomes:?}");
    // One a second, in as many seconds as the calls took (a line at each
    // end of a second's boundary at most).
    let seconds = began.elapsed().as_secs() as usize;
    let lines = log.matches("could not give back").count();
    assert!(
        (1..=2 + seconds).contains(&lines),
        "{lines} lines for 200 lost refunds in {seconds} s and a fraction: {log}"
    );
    assert_eq!(limiter.stats().refunded, 0, "no refund reached Redis");
}

/// A bucket's refund after the refund of an older admission of the key: the
/// older refund moved the admission's tokens up the debt, so they drain
/// sooner, and what is left of them is less than their decision's debt less
/// what drained. A bucket of 4 at one token per 5 s: A takes 2 and B 2, A is
/// refunded, 5 s later C takes 1, then B is refunded. One of B's tokens has
/// drained, so one goes back and the bucket holds 3 for the instant after C,
/// where giving back 2 would admit 5 at one instant. On one Redis, with the
/// native module, and in memory, for the three buckets.
#[test]
fn a_bucket_refund_after_an_older_refund_gives_back_no_refilled_token() {
    let runtime = runtime();
    let lua = RedisServer::start();
    let module =
        RedisServer::start_with(&["--loadmodule", support::native_module().to_str().unwrap()]);
    let mut failures = Vec::new();
    for backend in ["function", "module", "memory"] {
        for algorithm in [
            Algorithm::TokenBucket,
            Algorithm::Gcra,
            Algorithm::LeakyBucket,
        ] {
            let clock = ManualClock::new(1_760_000_000_000_000);
            let builder = Limiter::builder().clock(clock.clone());
            let limiter = match backend {
                "function" => builder.redis(lua.url()),
                "module" => builder.redis(module.url()),
                _ => builder.memory(),
            }
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
            let quota = bucket(algorithm, 4, "12/min");
            let key = format!("older-refund:{algorithm:?}");
            let at_once = runtime.block_on(async {
                let request = |cost| Request::new(&quota, &key).cost(cost);
                let a = limiter.check(request(2)).await.unwrap();
                let b = limiter.check(request(2)).await.unwrap();
                limiter.refund(a).await.unwrap();
                clock.advance(Duration::from_secs(5));
                limiter.check(request(1)).await.unwrap();
                limiter.refund(b).await.unwrap();
                let mut more = 0;
                while more < 10 && limiter.check(request(1)).await.is_ok() {
                    more += 1;
                }
                1 + more
            });
            if at_once != 4 {
                failures.push(format!(
                    "{backend} {algorithm:?}: {at_once} admitted at t0+5 s"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "a bucket of 4: {failures:?}");
}

/// The same at scale, in memory: a bucket of 100 at one token per 5 s, A
/// takes 90 and B 10, A is refunded; 50 s later B's 10 have drained and C
/// takes the whole 100. B has nothing left to give back, where giving back
/// its 10 would admit 110 at one instant.
#[test]
fn a_bucket_refund_after_an_older_refund_gives_back_nothing_drained() {
    let runtime = runtime();
    let clock = ManualClock::new(1_760_000_000_000_000);
    let limiter = Limiter::builder().clock(clock.clone()).build().unwrap();
    let quota = bucket(Algorithm::TokenBucket, 100, "12/min");
    let at_once = runtime.block_on(async {
        let request = |cost| Request::new(&quota, "k").cost(cost);
        let a = limiter.check(request(90)).await.unwrap();
        let b = limiter.check(request(10)).await.unwrap();
        limiter.refund(a).await.unwrap();
        clock.advance(Duration::from_secs(50));
        limiter.check(request(100)).await.unwrap();
        limiter.refund(b).await.unwrap();
        let mut more = 0;
        while more < 1000 && limiter.check(request(1)).await.is_ok() {
            more += 1;
        }
        100 + more
    });
    assert_eq!(at_once, 100, "admitted at one instant by a bucket of 100");
}

/// Random checks, refunds and pauses on one key of a bucket in memory, one
/// at a time: the admissions that stand (not refunded) never exceed the
/// bucket's bound over any span, `capacity` plus what refills in it, which a
/// refund after another's would break if it gave back tokens that had
/// refilled.
#[test]
fn standing_admissions_keep_the_bucket_bound_whatever_the_refunds() {
    #[derive(Debug, Clone)]
    enum Step {
        Check(u64),
        Refund(usize),
        Forward(u64),
    }
    let step = prop_oneof![
        4 => (1u64..4).prop_map(Step::Check),
        3 => (0usize..64).prop_map(Step::Refund),
        2 => (0u64..8_000_000).prop_map(Step::Forward),
    ];
    let runtime = runtime();
    proptest!(cases(400), |(algorithm in 0usize..3, steps in proptest::collection::vec(step, 1..60))| {
        let algorithm = [Algorithm::TokenBucket, Algorithm::Gcra, Algorithm::LeakyBucket][algorithm];
        // 4 tokens, one every 5 s.
        let quota = bucket(algorithm, 4, "12/min");
        let start = 1_760_000_000_000_000u64;
        let clock = ManualClock::new(start);
        let limiter = Limiter::builder().clock(clock.clone()).build().unwrap();
        let mut now = start;
        // Admissions held for a refund, and those that stand: (instant, cost).
        let mut held: Vec<(Admitted<'_>, usize)> = Vec::new();
        let mut standing: Vec<Option<(u64, u64)>> = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Step::Forward(d) => {
                    now += d;
                    clock.set(now);
                }
                Step::Refund(pick) => {
                    if held.is_empty() {
                        continue;
                    }
                    let (admitted, index) = held.swap_remove(pick % held.len());
                    runtime.block_on(limiter.refund(admitted)).unwrap();
                    standing[index] = None;
                }
                Step::Check(cost) => {
                    let request = Request::new(&quota, "k").cost(cost);
                    if let Ok(admitted) = runtime.block_on(limiter.check(request)) {
                        held.push((admitted, standing.len()));
                        standing.push(Some((now, cost)));
                    }
                }
            }
            // Over every span ending now: at most 4 plus one a 5 s.
            for &(from, _) in standing.iter().flatten() {
                let taken: u64 = standing.iter().flatten().filter(|(at, _)| *at >= from).map(|(_, c)| c).sum();
                let bound = 4 + (now - from) / 5_000_000;
                prop_assert!(
                    taken <= bound,
                    "step {} {:?}: {} standing since {} µs ago, bound {}",
                    i, algorithm, taken, now - from, bound
                );
            }
        }
    });
}

/// A refund sent while a lease of its key is on its way back: Redis decides
/// the lease (owed until the bucket is full, 10 s away) and then the refund
/// (the bucket full 5 s sooner), but the lease arrives after the refund was
/// made and would be kept owed for the whole 10 s, serving tokens the bucket
/// holds again. A bucket of 100 at 10/s, leases of 50 living 3 s, replies
/// held 200 ms by a relay: kept, the lease and the bucket would serve 128
/// at once at t0+2.9 s. The lease on its way is not kept, as after a reset.
#[test]
fn a_lease_on_its_way_while_its_key_is_refunded_is_not_kept() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let relay = runtime.block_on(support::Relay::start(server.port()));
    let clock = ManualClock::new(1_760_000_000_000_000);
    let quota = bucket(Algorithm::TokenBucket, 100, "10/s");
    let limiter = Limiter::builder()
        .redis(relay.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(3))
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let t0 = clock.now_micros();
    let served = runtime.block_on(async {
        // The connections up before the race.
        for _ in 0..3 {
            let warm = || limiter.check(Request::new(&quota, "warm").cost(0));
            let _ = tokio::join!(warm(), warm(), warm());
        }
        let first = limiter
            .check(Request::new(&quota, "race").cost(50))
            .await
            .unwrap();
        relay.delay_replies(Duration::from_millis(200));
        let leased = limiter.check(Request::new(&quota, "race").cost(1).lease(50));
        let refund = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            limiter.refund(first).await
        };
        let (checked, refunded) = tokio::join!(leased, refund);
        checked.unwrap();
        refunded.unwrap();
        relay.delay_replies(Duration::ZERO);
        clock.set(t0 + 2_900_000);
        let mut served = 0;
        while served < 1000
            && limiter
                .check(Request::new(&quota, "race").cost(1).lease(50))
                .await
                .is_ok()
        {
            served += 1;
        }
        served
    });
    assert!(
        served <= 100,
        "{served} admitted at once by a bucket of 100"
    );
}
