//! A model-based property test of the algorithms against Redis and the
//! memory backend at once: random sequences of operations on a few keys,
//! with quotas that change while keys hold state, costs from 0 to twice the
//! capacity, the caller's clock stepping forward and back, several decisions
//! on one key in one script call, and all-or-nothing checks of 1 to 4
//! dimensions. After each operation:
//! - the Lua scripts and the Rust twins decided alike;
//! - no error but the typed ones (a cost above the capacity);
//! - no denial asks for a wait longer than the quota's longest wait (plus
//!   however far the clock has gone back);
//! - no key was admitted above its algorithm's bound, checked against a
//!   simple reference model of each, over each stretch of time in which the
//!   key's quota stayed the same and the clock did not go back.

mod support;

use support::{Decide, Decided};

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use ratelimit::{
    Algorithm, Clock as _, DenialCause, Limiter, ManualClock, Quota, RateLimited, Request,
};
use support::{bucket, window, RedisServer};

/// Quotas a key can be decided under, by the state they keep: a key's quota
/// changes only within its family (each algorithm's state is foreign to the
/// others, and the attribute derives a key per algorithm).
fn families() -> Vec<Vec<Quota>> {
    use Algorithm::*;
    vec![
        vec![
            bucket(TokenBucket, 5, "2/s"),
            bucket(TokenBucket, 2, "1/min"),
            bucket(Gcra, 8, "10/s"),
            bucket(Gcra, 3, "7/min"),
        ],
        vec![
            bucket(LeakyBucket, 4, "3/s"),
            bucket(LeakyBucket, 10, "1/s"),
        ],
        vec![
            window(FixedWindow, 5, "1s"),
            window(FixedWindow, 3, "2s"),
            window(FixedWindow, 10, "1m"),
        ],
        vec![
            window(SlidingLog, 4, "1s"),
            window(SlidingLog, 2, "3s"),
            window(SlidingLog, 12, "1m"),
        ],
        vec![
            window(SlidingWindow, 6, "1s"),
            window(SlidingWindow, 3, "3s"),
            window(SlidingWindow, 20, "1m"),
        ],
    ]
}

/// A runtime of two workers, so that decisions sent together run in
/// parallel and share script calls.
fn two_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `cases` cases, none of them written down: every case starts from a
/// server of its own state, so a stored seed would not replay.
fn cases(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Keys: two of each family.
const KEYS: usize = 10;

fn family_of(key: usize) -> usize {
    key / 2
}

#[derive(Debug, Clone)]
enum Op {
    /// One decision: key, the quota's index in its family (modulo), cost in
    /// twice the capacity (modulo).
    Decide(usize, usize, u64),
    /// `n` decisions on one key sent together, so they share a script call.
    Burst(usize, usize, u64, usize),
    /// An all-or-nothing check of distinct keys.
    All(Vec<(usize, usize, u64)>),
    Forward(u64),
    Back(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    let quota = 0usize..4;
    let cost = 0u64..64;
    prop_oneof![
        5 => (key.clone(), quota.clone(), cost.clone()).prop_map(|(k, q, c)| Op::Decide(k, q, c)),
        2 => (key.clone(), quota.clone(), cost.clone(), 2usize..6)
            .prop_map(|(k, q, c, n)| Op::Burst(k, q, c, n)),
        2 => proptest::collection::vec((key, quota, cost), 1..5).prop_map(Op::All),
        4 => prop_oneof![0u64..2_000, 0u64..400_000, 0u64..90_000_000].prop_map(Op::Forward),
        1 => (0u64..1_500_000).prop_map(Op::Back),
    ]
}

/// The numbers a quota's bound is made of, for a quota or a share of it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bound {
    algorithm: Algorithm,
    limit: u64,
    /// Tokens per `period_us` (buckets).
    tokens: u128,
    period_us: u128,
    window_us: u64,
}

impl Bound {
    fn of(quota: &Quota) -> Self {
        Self::share(quota, 1, 1)
    }

    /// `parts / whole` of `quota`, as the local fallback limiter grants it.
    fn share(quota: &Quota, parts: u64, whole: u64) -> Self {
        let rate = quota.rate();
        Bound {
            algorithm: quota.algorithm(),
            limit: (quota.capacity() * parts / whole).max(1),
            tokens: u128::from(rate.tokens()) * u128::from(parts),
            period_us: rate.period().as_micros() * u128::from(whole),
            window_us: quota.window().map_or(0, |w| w.as_micros() as u64),
        }
    }
}

/// What the reference model knows of one key: its quota and its
/// admissions since the quota last changed or the clock last went back.
#[derive(Default)]
struct Stretch {
    bound: Option<Bound>,
    start: u64,
    admitted: Vec<(u64, u64)>,
}

impl Stretch {
    fn decided(&mut self, quota: &Quota, now: u64, cost: u64, allowed: bool) {
        self.decided_within(Bound::of(quota), now, cost, allowed)
    }

    fn decided_within(&mut self, bound: Bound, now: u64, cost: u64, allowed: bool) {
        if self.bound != Some(bound) {
            *self = Stretch {
                bound: Some(bound),
                start: now,
                admitted: Vec::new(),
            };
        }
        if allowed && cost > 0 {
            self.admitted.push((now, cost));
        }
    }

    /// The bound each algorithm documents, over this stretch.
    fn check(&self, now: u64) -> Result<(), String> {
        let Some(quota) = self.bound else {
            return Ok(());
        };
        let sum = |from: u64, to: u64| -> u64 {
            self.admitted
                .iter()
                .filter(|(t, _)| *t >= from && *t < to)
                .map(|(_, c)| c)
                .sum()
        };
        let limit = quota.limit;
        match quota.algorithm {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                let refilled = u128::from(now - self.start) * quota.tokens / quota.period_us;
                let bound = u128::from(limit) + refilled;
                let total = u128::from(sum(0, u64::MAX));
                if total > bound {
                    return Err(format!(
                        "{quota:?}: {total} admitted over {} µs, bound {bound}",
                        now - self.start
                    ));
                }
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                let w = quota.window_us;
                for (t, _) in &self.admitted {
                    let start = t - t % w;
                    let total = sum(start, start + w);
                    if total > limit {
                        return Err(format!(
                            "{quota:?}: {total} admitted in the window at {start}"
                        ));
                    }
                }
            }
            Algorithm::SlidingLog => {
                let w = quota.window_us;
                for (t, _) in &self.admitted {
                    let total = sum(t.saturating_sub(w - 1), t + 1);
                    if total > limit {
                        return Err(format!(
                            "{quota:?}: {total} admitted in the window ending at {t}"
                        ));
                    }
                }
            }
            other => return Err(format!("no model for {other}")),
        }
        Ok(())
    }
}

/// A denial of a cost above the capacity: never, not "not now".
fn never_admittable(denied: &RateLimited) -> bool {
    matches!(denied.cause, DenialCause::CostExceedsCapacity { .. })
}

/// How much longer than `quota`'s own longest wait a key may be asked to
/// wait: the time a clock went back, and a bucket's debt run up under
/// another of the key's `quotas` (waited out as it is), with the rounding of
/// that debt read in this quota's units (at most 4 µs over every pair of
/// the bucket family's quotas; the wait is then longer than needed, never
/// shorter, which the check of a retry after each denial holds to).
fn slack(quotas: &[Quota], quota: &Quota, regress: u64) -> Duration {
    const ROUNDING: Duration = Duration::from_micros(10);
    let longest = quotas
        .iter()
        .map(Quota::longest_wait)
        .max()
        .unwrap_or_default();
    let carried = longest.saturating_sub(quota.longest_wait());
    let rounding = if quotas.len() > 1 {
        ROUNDING
    } else {
        Duration::ZERO
    };
    carried + rounding + Duration::from_micros(regress)
}

/// Redis's and the memory backend's answers to one request agree, and are
/// within the bounds that hold for any answer.
fn agree(
    context: &str,
    quota: &Quota,
    cost: u64,
    slack: Duration,
    redis: &Result<Decided, RateLimited>,
    memory: &Result<Decided, RateLimited>,
) -> Result<(), TestCaseError> {
    match (redis, memory) {
        (Ok(r), Ok(m)) => {
            prop_assert_eq!(r, m, "{}: {:?} cost {}", context, quota, cost);
            let longest = quota.longest_wait() + slack;
            prop_assert!(
                r.retry_after <= longest,
                "{}: {:?} cost {} asked to wait {:?}, longer than {:?}",
                context,
                quota,
                cost,
                r.retry_after,
                longest
            );
            prop_assert!(r.remaining <= quota.capacity(), "{}: {:?}", context, r);
        }
        (Err(r), Err(m)) if never_admittable(r) && r == m => {
            prop_assert!(
                cost > quota.capacity(),
                "{}: {:?} cost {}",
                context,
                quota,
                cost
            )
        }
        (r, m) => prop_assert!(false, "{}: redis {:?} vs memory {:?}", context, r, m),
    }
    Ok(())
}

#[test]
fn scripts_and_twins_agree_and_keep_their_bounds_under_changing_quotas_and_clocks() {
    let runtime = two_worker_runtime();
    let server = RedisServer::start();
    let families = families();
    let case = std::sync::atomic::AtomicU64::new(0);
    let hits = std::sync::atomic::AtomicU64::new(0);
    let config = cases(400);
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..80))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = 1_750_000_000_000_000;
        let clock = ManualClock::new(start);
        let (redis, cached, memory) = runtime.block_on(async {
            let redis = Limiter::builder()
                .redis(server.url())
                .timeout(Duration::from_secs(5))
                .clock(clock.clone())
                .deny_cache_max_keys(0)
                .build()
                .unwrap();
            // The same, with the deny cache on (its default), on keys of its own.
            let cached = Limiter::builder()
                .redis(server.url())
                .prefix("cached")
                .timeout(Duration::from_secs(5))
                .clock(clock.clone())
                .build()
                .unwrap();
            let memory = Limiter::builder().memory().clock(clock.clone()).build().unwrap();
            (redis, cached, memory)
        });
        let key = |k: usize| format!("model:{case}:{k}");
        let quota_of = |k: usize, q: usize| families[family_of(k)][q % families[family_of(k)].len()];
        let cost_of = |quota: &Quota, c: u64| c % (2 * quota.capacity() + 1);
        let mut stretches: HashMap<usize, Stretch> = HashMap::new();
        // The quotas each key was decided under.
        let mut quotas_of: HashMap<usize, Vec<Quota>> = HashMap::new();
        let (mut now, mut high) = (start, start);
        for (step, op) in ops.iter().enumerate() {
            let context = format!("step {step} {op:?}");
            let regress = high - now;
            match op {
                Op::Forward(d) => {
                    now += d;
                    high = high.max(now);
                    clock.set(now);
                }
                Op::Back(d) => {
                    now -= (*d).min(now - start);
                    clock.set(now);
                    // The bounds hold on a clock that does not go back.
                    stretches.clear();
                }
                Op::Decide(k, q, c) => {
                    let quota = quota_of(*k, *q);
                    let cost = cost_of(&quota, *c);
                    let decide = || runtime.block_on(async {
                        let name = key(*k);
                        (
                            redis.decide(&quota, &name, cost).await,
                            cached.decide(&quota, &name, cost).await,
                            memory.decide(&quota, &name, cost).await,
                        )
                    });
                    let quotas = quotas_of.entry(*k).or_default();
                    if !quotas.contains(&quota) {
                        quotas.push(quota);
                    }
                    let slack = slack(quotas, &quota, regress);
                    let (r, c, m) = decide();
                    agree(&context, &quota, cost, slack, &r, &m)?;
                    agree(&format!("{context}, deny cache"), &quota, cost, slack, &c, &m)?;
                    let Ok(d) = r else { continue };
                    stretches.entry(*k).or_default().decided(&quota, now, cost, d.allowed);
                    // Deny, sleep `retry_after`, retry the same cost: admitted,
                    // as nothing else consumed the key (on a clock that has
                    // not gone back; under a quota that changed too: a debt
                    // run up under another is waited out, and the wait named).
                    if d.allowed || regress > 0 || d.retry_after == Duration::MAX {
                        continue;
                    }
                    now += d.retry_after.as_micros() as u64;
                    high = high.max(now);
                    clock.set(now);
                    let (r, c, m) = decide();
                    let context = format!("{context}, retried after {:?}", d.retry_after);
                    agree(&context, &quota, cost, slack, &r, &m)?;
                    agree(&format!("{context}, deny cache"), &quota, cost, slack, &c, &m)?;
                    prop_assert!(r.as_ref().is_ok_and(|d| d.allowed), "{}: {:?}", context, r);
                    stretches.entry(*k).or_default().decided(&quota, now, cost, true);
                }
                Op::Burst(k, q, c, n) => {
                    let quota = quota_of(*k, *q);
                    let quotas = quotas_of.entry(*k).or_default();
                    if !quotas.contains(&quota) {
                        quotas.push(quota);
                    }
                    let cost = cost_of(&quota, *c);
                    let name = key(*k);
                    // Sent together: batches go out on two connections, so
                    // their order is Redis's to choose; at one instant and
                    // one cost, the answers are the same whatever the order.
                    let by_outcome = |d: &Result<Decided, RateLimited>| format!("{d:?}");
                    let mut from_redis = runtime.block_on(futures::future::join_all(
                        (0..*n).map(|_| redis.decide(&quota, &name, cost)),
                    ));
                    let mut from_cached = runtime.block_on(futures::future::join_all(
                        (0..*n).map(|_| cached.decide(&quota, &name, cost)),
                    ));
                    let mut from_memory: Vec<_> = (0..*n)
                        .map(|_| runtime.block_on(memory.decide(&quota, &name, cost)))
                        .collect();
                    from_redis.sort_by_key(by_outcome);
                    from_cached.sort_by_key(by_outcome);
                    from_memory.sort_by_key(by_outcome);
                    let slack = slack(&quotas_of[k], &quota, regress);
                    for ((r, c), m) in from_redis.iter().zip(&from_cached).zip(&from_memory) {
                        agree(&context, &quota, cost, slack, r, m)?;
                        agree(&format!("{context}, deny cache"), &quota, cost, slack, c, m)?;
                        if let Ok(d) = r {
                            stretches.entry(*k).or_default().decided(&quota, now, cost, d.allowed);
                        }
                    }
                }
                Op::All(dims) => {
                    let mut seen = Vec::new();
                    let dims: Vec<(usize, Quota, u64)> = dims
                        .iter()
                        .filter(|(k, _, _)| {
                            let new = !seen.contains(k);
                            seen.push(*k);
                            new
                        })
                        .map(|&(k, q, c)| {
                            let quota = quota_of(k, q);
                            (k, quota, cost_of(&quota, c))
                        })
                        .collect();
                    for (k, quota, _) in &dims {
                        let quotas = quotas_of.entry(*k).or_default();
                        if !quotas.contains(quota) {
                            quotas.push(*quota);
                        }
                    }
                    let names: Vec<String> = dims.iter().map(|(k, _, _)| key(*k)).collect();
                    let dimensions: Vec<Request<'_>> = dims
                        .iter()
                        .zip(&names)
                        .map(|((_, quota, cost), name)| Request::new(quota, name).cost(*cost))
                        .collect();
                    let (r, c, m) = runtime.block_on(async {
                        (
                            redis.decide_all(&dimensions).await,
                            cached.decide_all(&dimensions).await,
                            memory.decide_all(&dimensions).await,
                        )
                    });
                    // The deny cache denies a check by a limit it knows is
                    // spent, without asking about the others: the limit it
                    // names denies in memory too, and another may deny longer.
                    match (&c, &m) {
                        (Err(c), Err(m)) if c.key != m.key => {
                            prop_assert!(
                                c.cause == m.cause && c.retry_after <= m.retry_after,
                                "{}, deny cache: {:?} vs memory {:?}", context, c, m
                            );
                        }
                        _ => prop_assert_eq!(format!("{c:?}"), format!("{m:?}"), "{}, deny cache", context),
                    }
                    match (&r, &m) {
                        (Ok(r), Ok(m)) => {
                            prop_assert_eq!(r, m, "{}", context);
                            for ((k, quota, cost), d) in dims.iter().zip(r) {
                                prop_assert!(d.allowed, "{}: {:?}", context, d);
                                let slack = slack(&quotas_of[k], quota, regress);
                                agree(&context, quota, *cost, slack, &Ok(*d), &Ok(*d))?;
                                stretches.entry(*k).or_default().decided(quota, now, *cost, true);
                            }
                        }
                        (Err(r), Err(m)) if never_admittable(r) => {
                            prop_assert_eq!(r, m, "{}", context);
                            prop_assert!(dims.iter().any(|(_, q, c)| *c > q.capacity()), "{}", context)
                        }
                        (Err(r), Err(m)) if r.cause == DenialCause::Quota => {
                            prop_assert_eq!(r, m, "{}", context);
                            let at = names.iter().position(|n| *n == r.key);
                            prop_assert!(at.is_some(), "{}: denied by {:?}", context, r.key);
                            let (k, quota, cost) = dims[at.unwrap_or(0)];
                            let slack = slack(&quotas_of[&k], &quota, regress);
                            agree(&context, &quota, cost, slack, &Ok(Decided::from(r)), &Ok(Decided::from(m)))?;
                            for (k, quota, cost) in dims.iter() {
                                stretches.entry(*k).or_default().decided(quota, now, *cost, false);
                            }
                        }
                        _ => prop_assert!(false, "{}: redis {:?} vs memory {:?}", context, r, m),
                    }
                }
            }
            for stretch in stretches.values() {
                if let Err(broken) = stretch.check(now) {
                    prop_assert!(false, "{}: {}", context, broken);
                }
            }
        }
        hits.fetch_add(cached.stats().denied_from_cache, std::sync::atomic::Ordering::Relaxed);
    });
    // The deny cache's half of the property says nothing unless it answered.
    let hits = hits.into_inner();
    assert!(hits > 50, "the deny cache answered only {hits} requests");
}

#[derive(Debug, Clone)]
enum Call {
    /// `acquire_with`: key, quota (modulo), cost (modulo), lease size.
    Acquire(usize, usize, u64, u64),
    Forward(u64),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        6 => (0..KEYS, 0usize..4, 0u64..8, prop_oneof![Just(0u64), 2u64..12])
            .prop_map(|(k, q, c, l)| Call::Acquire(k, q, c, l)),
        3 => prop_oneof![0u64..2_000, 0u64..300_000, 0u64..5_000_000].prop_map(Call::Forward),
    ]
}

/// Runs `calls` on a clock starting at `start`: each acquisition (key,
/// quota, cost, lease) is answered by `acquire` (whether it admitted; it
/// checks the answer itself) and checked against the reference model with
/// the bound `bound_of` its quota has.
fn run_calls(
    calls: &[Call],
    clock: &ManualClock,
    max_cost: impl Fn(&Quota) -> u64,
    bound_of: impl Fn(&Quota) -> Bound,
    mut acquire: impl FnMut(usize, &Quota, u64, u64) -> Result<bool, TestCaseError>,
) -> Result<(), TestCaseError> {
    let families = families();
    let mut now = clock.now_micros();
    let mut stretches: HashMap<usize, Stretch> = HashMap::new();
    for (step, call) in calls.iter().enumerate() {
        match call {
            Call::Forward(d) => {
                now += d;
                clock.set(now);
            }
            Call::Acquire(k, q, c, lease) => {
                let family = &families[family_of(*k)];
                let quota = family[q % family.len()];
                let cost = c % (max_cost(&quota) + 1);
                let allowed = acquire(*k, &quota, cost, *lease)
                    .map_err(|e| TestCaseError::fail(format!("step {step} {call:?}: {e}")))?;
                let stretch = stretches.entry(*k).or_default();
                stretch.decided_within(bound_of(&quota), now, cost, allowed);
                if let Err(broken) = stretch.check(now) {
                    prop_assert!(false, "step {} {:?}: {}", step, call, broken);
                }
            }
        }
    }
    Ok(())
}

/// Leases, the deny cache and changing quotas together, through `acquire`
/// on Redis with the caller's clock: no key is admitted above its
/// algorithm's bound, and no answer is an error.
#[test]
fn leases_with_the_deny_cache_keep_every_bound_under_changing_quotas() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = RedisServer::start();
    let case = std::sync::atomic::AtomicU64::new(0);
    let config = cases(384);
    proptest!(config, |(calls in proptest::collection::vec(call(), 1..80), ttl_ms in 1u64..3_000)| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let clock = ManualClock::new(1_760_000_000_000_000);
        let limiter = runtime.block_on(async {
            Limiter::builder()
                .redis(server.url())
                .timeout(Duration::from_secs(5))
                .clock(clock.clone())
                .lease_ttl(Duration::from_millis(ttl_ms))
                .build()
                .unwrap()
        });
        run_calls(&calls, &clock, Quota::capacity, Bound::of, |k, quota, cost, lease| {
            let key = format!("lease:{case}:{k}");
            let request = Request::new(quota, &key).cost(cost).rule("model").lease(lease);
            match runtime.block_on(limiter.check(request)) {
                Ok(d) => {
                    prop_assert!(!d.decisions()[0].fallback, "lease ttl {} ms: {:?}", ttl_ms, d);
                    Ok(true)
                }
                Err(denied) => {
                    prop_assert_eq!(denied.cause, ratelimit::DenialCause::Quota);
                    Ok(false)
                }
            }
        })?;
    });
}

/// The local fallback policy with a share of each quota, Redis unreachable:
/// no panic (a debug build checks overflow), no admission above the share's
/// bound, and every denial says the local limiter denied.
#[test]
fn the_local_policy_keeps_its_share_of_every_bound_while_redis_is_down() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let config = cases(128);
    proptest!(config, |(calls in proptest::collection::vec(call(), 1..80), quarters in 1u64..5)| {
        let clock = ManualClock::new(1_760_000_000_000_000);
        let limiter = runtime.block_on(async {
            Limiter::builder()
                .redis(url.clone())
                .timeout(Duration::from_millis(50))
                .clock(clock.clone())
                .failure_policy(ratelimit::FailurePolicy::Local)
                .local_share(quarters as f64 / 4.0)
                .build()
                .unwrap()
        });
        let twice = |quota: &Quota| 2 * quota.capacity();
        let share = |quota: &Quota| Bound::share(quota, quarters, 4);
        run_calls(&calls, &clock, twice, share, |k, quota, cost, _| {
            let key = format!("local:{k}");
            match runtime.block_on(limiter.check(Request::new(quota, &key).cost(cost))) {
                Ok(d) => {
                    prop_assert!(d.decisions()[0].fallback, "share {}/4: {:?}", quarters, d);
                    Ok(true)
                }
                Err(denied) => {
                    prop_assert!(
                        matches!(
                            denied.cause,
                            ratelimit::DenialCause::LocalFallback
                                | ratelimit::DenialCause::CostExceedsCapacity { .. }
                        ),
                        "share {}/4: {:?}", quarters, denied
                    );
                    Ok(false)
                }
            }
        })?;
    });
}

/// One user of [`checks_and_single_decisions_sharing_script_calls_stay_all_or_nothing`]:
/// its capacity, how many checks of (user, global) it sends, and how many
/// single decisions on its own key.
#[derive(Debug, Clone, Copy)]
struct User {
    capacity: u64,
    checks: usize,
    singles: usize,
}

/// All-or-nothing checks and single decisions sent at once, so that they
/// share script calls (a batch decides runs of single decisions and each
/// check on its own), every check naming one global key: on a clock that
/// stands still, whatever order Redis decides them in,
/// - every check consumed on all its keys or on none, and every key holds
///   exactly its capacity less what was admitted on it;
/// - no key admitted more than its capacity;
/// - a key that still has tokens at the end denied nothing.
#[test]
fn checks_and_single_decisions_sharing_script_calls_stay_all_or_nothing() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let runtime = two_worker_runtime();
    let server = RedisServer::start();
    let case = std::sync::atomic::AtomicU64::new(0);
    let (requests, inspections) = (AtomicU64::new(0), AtomicU64::new(0));
    let calls_before = runtime.block_on(server.script_calls());
    let config = cases(96);
    let user = (1u64..5, 0usize..6, 0usize..3).prop_map(|(capacity, checks, singles)| User {
        capacity,
        checks,
        singles,
    });
    let algorithms = [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
    ];
    proptest!(config, |(
        users in proptest::collection::vec(user, 1..8),
        global_capacity in 1u64..30,
        global_singles in 0usize..12,
        algorithm in proptest::sample::select(algorithms.to_vec()),
        order in any::<u64>(),
    )| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let quota = |capacity: u64| {
            let builder = Quota::builder(algorithm);
            if algorithm.is_windowed() {
                builder.limit(capacity).window(Duration::from_secs(3_600)).build().unwrap()
            } else {
                builder.capacity(capacity).rate("1/h".parse().unwrap()).build().unwrap()
            }
        };
        let clock = ManualClock::new(1_770_000_000_000_000);
        let limiter = runtime.block_on(async {
            Limiter::builder()
                .redis(server.url())
                .timeout(Duration::from_secs(5))
                .clock(clock.clone())
                .deny_cache_max_keys(0)
                .build()
                .unwrap()
        });
        let global = quota(global_capacity);
        let global_key = format!("mixed:{case}:global");
        let user_quotas: Vec<Quota> = users.iter().map(|u| quota(u.capacity)).collect();
        let user_keys: Vec<String> = (0..users.len()).map(|u| format!("mixed:{case}:user:{u}")).collect();
        // Who sends what: `None` a single decision on the global key,
        // `Some((u, true))` a check of user u and the global key,
        // `Some((u, false))` a single decision on user u's key.
        let mut sends: Vec<Option<(usize, bool)>> = vec![None; global_singles];
        for (u, user) in users.iter().enumerate() {
            sends.extend(std::iter::repeat_n(Some((u, true)), user.checks));
            sends.extend(std::iter::repeat_n(Some((u, false)), user.singles));
        }
        // A shuffle, so checks and singles interleave in the queue.
        let mut seed = order | 1;
        for i in (1..sends.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            sends.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        requests.fetch_add(sends.len() as u64, Relaxed);
        let answers: Vec<Result<Vec<Decided>, RateLimited>> = runtime.block_on(futures::future::join_all(
            sends.iter().map(|send| {
                let limiter = &limiter;
                let (global, global_key) = (&global, &global_key);
                let (user_quotas, user_keys) = (&user_quotas, &user_keys);
                async move {
                    match *send {
                        None => limiter.decide(global, global_key, 1).await.map(|d| vec![d]),
                        Some((u, false)) => limiter.decide(&user_quotas[u], &user_keys[u], 1).await.map(|d| vec![d]),
                        Some((u, true)) => {
                            limiter
                                .decide_all(&[
                                    Request::new(&user_quotas[u], &user_keys[u]),
                                    Request::new(global, global_key),
                                ])
                                .await
                        }
                    }
                }
            }),
        ));
        let mut admitted_global = 0;
        let mut admitted_user = vec![0u64; users.len()];
        let (mut global_denied, mut user_denied) = (false, vec![false; users.len()]);
        for (send, answer) in sends.iter().zip(&answers) {
            // Admitted (a denial by a single key's quota is an `Ok` too), or
            // denied by a quota: which key denied.
            let (all, denied_by) = match answer {
                Ok(decisions) => (decisions.iter().all(|d| d.allowed), None),
                Err(denied) if denied.cause == DenialCause::Quota => (false, Some(denied.key.as_str())),
                Err(denied) => return Err(TestCaseError::fail(format!("{send:?}: {denied}"))),
            };
            match *send {
                None => {
                    admitted_global += all as u64;
                    global_denied |= !all;
                }
                Some((u, false)) => {
                    admitted_user[u] += all as u64;
                    user_denied[u] |= !all;
                }
                Some((u, true)) => {
                    admitted_user[u] += all as u64;
                    admitted_global += all as u64;
                    user_denied[u] |= denied_by == Some(user_keys[u].as_str());
                    global_denied |= denied_by == Some(global_key.as_str());
                }
            }
        }
        let left = |quota: &Quota, key: &str| {
            runtime
                .block_on(limiter.inspect(quota, key, 0))
                .map(|d| d.remaining)
                .map_err(|e| TestCaseError::fail(format!("inspecting {key}: {e}")))
        };
        inspections.fetch_add(1 + users.len() as u64, Relaxed);
        let context = format!("{algorithm:?}, global {global_capacity}, {users:?}, {global_singles} global singles");
        prop_assert!(admitted_global <= global_capacity, "{}: global admitted {}", context, admitted_global);
        prop_assert_eq!(left(&global, &global_key)?, global_capacity - admitted_global, "{}: global", context);
        prop_assert!(
            !global_denied || admitted_global == global_capacity,
            "{}: the global key denied with {} of {} tokens taken",
            context, admitted_global, global_capacity
        );
        for (u, user) in users.iter().enumerate() {
            prop_assert!(admitted_user[u] <= user.capacity, "{}: user {} admitted {}", context, u, admitted_user[u]);
            prop_assert_eq!(
                left(&user_quotas[u], &user_keys[u])?,
                user.capacity - admitted_user[u],
                "{}: user {}: a check consumes on all its keys or on none", context, u
            );
            prop_assert!(
                !user_denied[u] || admitted_user[u] == user.capacity,
                "{}: user {} denied with {} of {} tokens taken",
                context, u, admitted_user[u], user.capacity
            );
        }
    });
    // Less the inspections, which go one per call.
    let (requests, inspections) = (requests.into_inner(), inspections.into_inner());
    let calls = runtime.block_on(server.script_calls()) - calls_before - inspections;
    assert!(
        calls < requests / 2,
        "{requests} checks and decisions sent together took {calls} script calls: they were not batched"
    );
}
