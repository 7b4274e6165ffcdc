//! The native module (`ratelimit-module`) against the Lua function, on real
//! servers that load the module built from this workspace:
//! - model-based: random sequences of checks (single, leased, all or
//!   nothing, of every algorithm, with quotas that change while keys hold
//!   state), inspections, refunds and clock steps forward and back, decided
//!   by a limiter on a server with the module and by one on a server
//!   without it: the same answers, and after every step the same keys with
//!   the same values and expiries;
//! - clients on both paths deciding the same keys of one server (one of
//!   them an ACL user without the module's command, who falls back to the
//!   function) agree with one memory limiter deciding the same sequence;
//! - raw calls that name a key again (in later groups, in later runs, in
//!   refunds) answer and store as the function's do;
//! - a call of another wire version is refused, and the module writes
//!   nothing over a key of another type.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use ratelimit::{
    Algorithm, DenialCause, Error, ErrorKind, Limiter, ManualClock, Quota, RateLimited, Request,
};
use ratelimit_core::native::WIRE_VERSION;
use support::{bucket, fault, native_module, window, Decide, Decided, RedisServer};

/// A limiter on `server` without the deny cache: every decision reaches
/// Redis.
fn uncached(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .deny_cache_max_keys(0)
        .build()
        .unwrap()
}

fn with_module() -> RedisServer {
    let module = native_module();
    RedisServer::start_with(&["--loadmodule", module.to_str().unwrap()])
}

/// Quotas by the state they keep: a key's quota changes within its family.
fn families() -> Vec<Vec<Quota>> {
    use Algorithm::*;
    vec![
        vec![bucket(TokenBucket, 5, "2/s"), bucket(Gcra, 3, "7/min")],
        vec![
            bucket(LeakyBucket, 4, "3/s"),
            bucket(LeakyBucket, 10, "1/s"),
        ],
        vec![window(FixedWindow, 5, "1s"), window(FixedWindow, 3, "2s")],
        vec![window(SlidingLog, 4, "1s"), window(SlidingLog, 2, "3s")],
        vec![
            window(SlidingWindow, 6, "1s"),
            window(SlidingWindow, 3, "3s"),
        ],
    ]
}

/// Keys: two of each family.
const KEYS: usize = 10;

#[derive(Debug, Clone)]
enum Op {
    /// A check of one key: key, quota (modulo its family), cost (modulo
    /// twice the capacity plus one).
    Check(usize, usize, u64),
    /// The same with a lease of `lease` tokens.
    Leased(usize, usize, u64, u64),
    /// An all-or-nothing check of distinct keys.
    All(Vec<(usize, usize, u64)>),
    /// An inspection, which consumes nothing.
    Inspect(usize, usize, u64),
    /// A check refunded at once.
    Refunded(usize, usize, u64),
    Forward(u64),
    Back(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let (key, quota, cost) = (0..KEYS, 0usize..2, 0u64..24);
    prop_oneof![
        6 => (key.clone(), quota.clone(), cost.clone()).prop_map(|(k, q, c)| Op::Check(k, q, c)),
        1 => (key.clone(), quota.clone(), cost.clone(), 2u64..6)
            .prop_map(|(k, q, c, l)| Op::Leased(k, q, c, l)),
        2 => proptest::collection::vec((key.clone(), quota.clone(), cost.clone()), 1..4)
            .prop_map(Op::All),
        1 => (key.clone(), quota.clone(), cost.clone()).prop_map(|(k, q, c)| Op::Inspect(k, q, c)),
        2 => (key, quota, cost).prop_map(|(k, q, c)| Op::Refunded(k, q, c)),
        4 => prop_oneof![0u64..2_000, 0u64..600_000, 0u64..5_000_000].prop_map(Op::Forward),
        1 => (0u64..1_500_000).prop_map(Op::Back),
    ]
}

/// Two servers hold the same keys and values, with expiries within
/// `tolerance_ms` of each other: 250 for two servers that each computed
/// them (from the same `PX`, a few milliseconds apart), none for a replica
/// and its master (the master writes and sends one instant). A key about
/// to expire on one server may be gone on the other already: it is not
/// compared.
fn same_holdings(
    context: &str,
    function: &BTreeMap<String, (String, i64)>,
    native: &BTreeMap<String, (String, i64)>,
    tolerance_ms: i64,
) -> Result<(), TestCaseError> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // -1: no expiry; -2: gone since it was listed.
    let lasting = |expires: i64| expires == -1 || expires > now_ms + 500;
    let keys: std::collections::BTreeSet<&String> = function.keys().chain(native.keys()).collect();
    for key in keys {
        match (function.get(key), native.get(key)) {
            (Some((value, expires)), Some((native_value, native_expires)))
                if lasting(*expires) || lasting(*native_expires) =>
            {
                prop_assert_eq!(value, native_value, "{}: {}", context, key);
                prop_assert!(
                    (*expires < 0) == (*native_expires < 0)
                        && (expires - native_expires).abs() <= tolerance_ms,
                    "{}: {} expires at {} by the function, at {} by the module",
                    context,
                    key,
                    expires,
                    native_expires
                );
            }
            (Some((value, expires)), None) => prop_assert!(
                !lasting(*expires),
                "{}: {} holds {} by the function, nothing by the module",
                context,
                key,
                value
            ),
            (None, Some((value, expires))) => prop_assert!(
                !lasting(*expires),
                "{}: {} holds {} by the module, nothing by the function",
                context,
                key,
                value
            ),
            _ => {}
        }
    }
    Ok(())
}

/// An answer as compared: the decision, or the denial's cause.
fn outcome(result: Result<Decided, RateLimited>) -> Result<Decided, DenialCause> {
    result.map_err(|denied| denied.cause)
}

/// One step on `limiter`: each request's outcome.
async fn step(
    limiter: &Limiter,
    op: &Op,
    key: &dyn Fn(usize) -> String,
    quota_of: &dyn Fn(usize, usize) -> Quota,
) -> Vec<Result<Decided, DenialCause>> {
    let cost_of = |quota: &Quota, c: u64| c % (2 * quota.capacity() + 1);
    match op {
        Op::Check(k, q, c) => {
            let quota = quota_of(*k, *q);
            vec![outcome(
                limiter.decide(&quota, &key(*k), cost_of(&quota, *c)).await,
            )]
        }
        Op::Leased(k, q, c, lease) => {
            let quota = quota_of(*k, *q);
            let name = key(*k);
            let request = Request::new(&quota, &name)
                .cost(cost_of(&quota, *c))
                .lease(*lease)
                .on_error(ratelimit::FailurePolicy::Closed);
            vec![outcome(match limiter.check(request).await {
                Ok(admitted) => Ok(Decided::from(&admitted.decisions()[0])),
                Err(denied) if denied.cause == DenialCause::Quota => Ok(Decided::from(&denied)),
                Err(denied) => Err(denied),
            })]
        }
        Op::All(dims) => {
            let mut seen = Vec::new();
            let dims: Vec<(Quota, String, u64)> = dims
                .iter()
                .filter(|(k, _, _)| {
                    let new = !seen.contains(k);
                    seen.push(*k);
                    new
                })
                .map(|(k, q, c)| {
                    let quota = quota_of(*k, *q);
                    let cost = cost_of(&quota, *c);
                    (quota, key(*k), cost)
                })
                .collect();
            let requests: Vec<Request<'_>> = dims
                .iter()
                .map(|(quota, name, cost)| Request::new(quota, name).cost(*cost))
                .collect();
            match limiter.decide_all(&requests).await {
                Ok(decided) => decided.into_iter().map(Ok).collect(),
                Err(denied) if denied.cause == DenialCause::Quota => {
                    vec![Ok(Decided::from(&denied))]
                }
                Err(denied) => vec![Err(denied.cause)],
            }
        }
        Op::Inspect(k, q, c) => {
            let quota = quota_of(*k, *q);
            let cost = cost_of(&quota, *c).min(quota.capacity());
            let inspected = limiter.inspect(&quota, &key(*k), cost).await.unwrap();
            vec![Ok(Decided::from(inspected))]
        }
        Op::Refunded(k, q, c) => {
            let quota = quota_of(*k, *q);
            let name = key(*k);
            let request = Request::new(&quota, &name)
                .cost(cost_of(&quota, *c))
                .on_error(ratelimit::FailurePolicy::Closed);
            match limiter.check(request).await {
                Ok(admitted) => {
                    let decided = Decided::from(&admitted.decisions()[0]);
                    limiter.refund(admitted).await.unwrap();
                    vec![Ok(decided)]
                }
                Err(denied) if denied.cause == DenialCause::Quota => {
                    vec![Ok(Decided::from(&denied))]
                }
                Err(denied) => vec![Err(denied.cause)],
            }
        }
        Op::Forward(_) | Op::Back(_) => Vec::new(),
    }
}

fn cases(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// `ops` decided by a limiter on `plain` (the function) and one on `native`
/// (the module), on one manual clock: the same answers, and after every
/// step the same keys with the same values and expiries.
fn decided_alike(
    runtime: &tokio::runtime::Runtime,
    (plain, native): (&RedisServer, &RedisServer),
    families: &[Vec<Quota>],
    ops: &[Op],
    case: &str,
) -> Result<(), TestCaseError> {
    let start = 1_750_000_000_000_000;
    let clock = ManualClock::new(start);
    let limiter = |server: &RedisServer| {
        Limiter::builder()
            .redis(server.url())
            .timeout(Duration::from_secs(5))
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let (function, module) = runtime.block_on(async { (limiter(plain), limiter(native)) });
    let key = |k: usize| format!("native:{case}:{k}");
    let quota_of = |k: usize, q: usize| families[k / 2][q % families[k / 2].len()];
    let mut now = start;
    for (n, op) in ops.iter().enumerate() {
        let context = format!("case {case} step {n} {op:?}");
        match op {
            Op::Forward(d) => now += d,
            Op::Back(d) => now -= (*d).min(now - start),
            _ => {}
        }
        clock.set(now);
        let (by_function, by_module, held_function, held_native) = runtime.block_on(async {
            let by_function = step(&function, op, &key, &quota_of).await;
            let by_module = step(&module, op, &key, &quota_of).await;
            (
                by_function,
                by_module,
                plain.holdings().await,
                native.holdings().await,
            )
        });
        prop_assert_eq!(&by_function, &by_module, "{}", context);
        same_holdings(&context, &held_function, &held_native, 250)?;
    }
    Ok(())
}

#[test]
fn the_module_decides_as_the_function_and_stores_the_same_values() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (plain, native) = (RedisServer::start(), with_module());
    let families = families();
    let case = std::sync::atomic::AtomicU64::new(0);
    proptest!(cases(60), |(ops in proptest::collection::vec(op(), 1..40))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        decided_alike(&runtime, (&plain, &native), &families, &ops, &case.to_string())?;
    });
    runtime.block_on(async {
        assert!(native.command_calls(&["ratelimit.decide"]).await > 0);
        assert_eq!(
            native.script_calls().await,
            0,
            "the server with the module ran the function"
        );
        assert!(plain.script_calls().await > 0);
    });
}

/// Quotas at the ends of what a quota may be, decided alike:
/// - a bucket that refills one token every ten years, whose instant of
///   being full again goes past 2^52 µs after a few admissions (the
///   scripts read it exactly up to 2^53);
/// - a sliding window's count of bytes a second, weighed under a quota of
///   requests a day: beyond 64 bits once scaled by the day's milliseconds.
#[test]
fn quotas_at_the_ends_of_their_range_decide_on_the_module_as_on_the_function() {
    use Algorithm::*;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (plain, native) = (RedisServer::start(), with_module());
    let families = [
        vec![
            bucket(Gcra, 10, "1/3650d"),
            bucket(TokenBucket, 10, "1/3650d"),
        ],
        vec![
            window(SlidingWindow, 1_000_000_000_000, "1s"),
            window(SlidingWindow, 50_000_000, "1d"),
        ],
    ];
    let mut ops: Vec<Op> = (0..12).map(|q| Op::Check(0, q, 1)).collect();
    ops.extend([
        Op::Refunded(0, 0, 1),
        Op::Forward(1_000),
        Op::Check(1, 1, 3),
    ]);
    ops.extend([
        Op::Check(2, 0, 500_000_000_000),
        Op::Check(2, 1, 1),
        Op::Forward(999_000),
        Op::Check(2, 1, 1),
        Op::Check(2, 0, 1),
    ]);
    decided_alike(&runtime, (&plain, &native), &families, &ops, "ends").unwrap();
}

/// A raw call's keys, by index into the call's key pool: each key keeps one
/// algorithm, the sliding log's key only sometimes in a call.
#[derive(Debug, Clone)]
enum RawCall {
    /// 'each': single decisions, a key named again in later groups.
    Each(Vec<(usize, u64)>),
    /// 'runs': all-or-nothing runs (`true`) and runs of single decisions,
    /// each of distinct keys, a key named again in later runs.
    Runs(Vec<(bool, Vec<(usize, u64)>)>),
    /// 'refund': costs given back, a key named again.
    Refund(Vec<(usize, u64)>),
    /// 'all', naming a key twice, as no limiter does: decided from the
    /// values before the call, then written in order.
    All(Vec<(usize, u64)>),
}

/// The pool's algorithms by wire id (see `Algorithm::wire_id`), with their
/// numbers p1 and p2: a rate of one per 100 ms, or a limit of 4 a second.
/// The last two keys hold lists, which every call finds foreign and leaves.
const RAW_KEYS: [(u64, u64, u64); 8] = [
    (0, 1, 100_000),
    (1, 1, 100_000),
    (5, 1, 100_000),
    (2, 4, 1_000_000),
    (4, 4, 1_000_000),
    (3, 4, 1_000_000),
    (1, 1, 100_000),
    (3, 4, 1_000_000),
];

fn raw_call() -> impl Strategy<Value = RawCall> {
    // The sliding log's key (5) in one call of four or so, and the lists
    // (6, and 7 for the sliding log).
    let key = prop_oneof![12 => 0usize..5, 1 => Just(5usize), 1 => 6usize..8];
    let keyed = (key.clone(), 0u64..4);
    let run = (
        any::<bool>(),
        proptest::collection::vec(keyed.clone(), 1..4).prop_map(|mut run| {
            let mut seen = Vec::new();
            run.retain(|(k, _)| {
                let new = !seen.contains(k);
                seen.push(*k);
                new
            });
            run
        }),
    );
    prop_oneof![
        3 => proptest::collection::vec(keyed.clone(), 1..12).prop_map(RawCall::Each),
        4 => proptest::collection::vec(run, 1..8).prop_map(RawCall::Runs),
        // Refunds, of nothing too (which no limiter sends), and refunds
        // that give nothing back (a window whose count is already 0): both
        // leave the key as it is, expiry included, on either path (this
        // test's clock runs ahead of Redis's, so an expiry set again would
        // differ). The lists among them: nothing is given back to them,
        // and the other keys' refunds of the call apply.
        1 => proptest::collection::vec((0usize..8, 0u64..4), 1..8).prop_map(RawCall::Refund),
        1 => proptest::collection::vec(keyed, 1..6).prop_map(RawCall::All),
    ]
}

/// The call's arguments after `RATELIMIT.DECIDE <wire version>`, or after
/// `FCALL <function>`: the keys, the mode, the requests (each named once,
/// however many keys share it) and one group a key.
fn raw_arguments(call: &RawCall, key: &dyn Fn(usize) -> String, now: u64) -> Vec<String> {
    let (mode, runs, keyed): (&str, Vec<String>, Vec<(usize, u64)>) = match call {
        RawCall::Each(keyed) => ("each", Vec::new(), keyed.clone()),
        RawCall::Refund(keyed) => ("refund", Vec::new(), keyed.clone()),
        RawCall::All(keyed) => ("all", Vec::new(), keyed.clone()),
        RawCall::Runs(runs) => {
            let mut lengths = vec![runs.len().to_string()];
            for (all, run) in runs {
                let length = run.len() as i64;
                lengths.push((if *all { -length } else { length }).to_string());
            }
            let keyed = runs.iter().flat_map(|(_, run)| run.clone()).collect();
            ("runs", lengths, keyed)
        }
    };
    let mut args = vec![keyed.len().to_string()];
    args.extend(keyed.iter().map(|(k, _)| key(*k)));
    args.push(mode.to_string());
    args.extend(runs);
    let mut requests: Vec<[String; 6]> = Vec::new();
    let mut groups = Vec::new();
    for (k, cost) in &keyed {
        let (algorithm, p1, p2) = RAW_KEYS[*k];
        let windowed = matches!(algorithm, 2..=4);
        let p3 = match (mode, windowed) {
            // A bucket's capacity; a window's untagged request.
            ("refund", false) => cost * p2,
            ("refund", true) => 500_000,
            (_, false) => 4,
            (_, true) => 0,
        };
        let cost = if mode == "refund" { cost } else { &(cost % 5) };
        let request = [
            algorithm.to_string(),
            cost.to_string(),
            now.to_string(),
            p1.to_string(),
            p2.to_string(),
            p3.to_string(),
        ];
        let place = match requests.iter().position(|r| *r == request) {
            Some(i) => i + 1,
            None => {
                requests.push(request);
                requests.len()
            }
        };
        groups.extend(["1".to_string(), place.to_string()]);
    }
    args.push(requests.len().to_string());
    args.extend(requests.into_iter().flatten());
    args.extend(groups);
    args
}

/// The arguments of a raw call of one key, after `RATELIMIT.DECIDE <wire
/// version>` or `FCALL <function>`: its mode, its count of requests as sent,
/// the requests' fields, then the groups.
fn one_key_call(
    key: &str,
    mode: &str,
    requests: &str,
    fields: impl IntoIterator<Item = impl ToString>,
    groups: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = ["1", key, mode, requests].map(String::from).to_vec();
    args.extend(fields.into_iter().map(|field| field.to_string()));
    args.extend(groups.iter().map(|group| group.to_string()));
    args
}

/// The name of the limiter's function on a server that has run it.
async fn function_name(server: &RedisServer) -> String {
    fn find(value: &redis::Value) -> Option<String> {
        match value {
            redis::Value::BulkString(bytes) => String::from_utf8(bytes.clone())
                .ok()
                .filter(|name| name.starts_with("ratelimit_")),
            redis::Value::Array(items) | redis::Value::Set(items) => items.iter().find_map(find),
            redis::Value::Map(pairs) => pairs.iter().find_map(|(k, v)| find(k).or_else(|| find(v))),
            _ => None,
        }
    }
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut server.connection().await)
        .await
        .unwrap();
    find(&listed).expect("the limiter's function is loaded")
}

/// A call naming keys again (a hot key every check of a batch names, as a
/// global limit is) answers as the function does and leaves the same keys,
/// values and expiries: the module stores such a key once, when the call
/// ends, and its later decisions in the call read what the earlier ones
/// wrote; a key named once is written through the handle it was read by.
/// Hostile calls too: all or nothing naming a key twice, and a list named
/// again and again. A replica of the module's server, without the module,
/// holds the same.
#[test]
fn calls_naming_keys_again_decide_and_store_as_the_function_does() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (plain, native) = (RedisServer::start(), with_module());
    let (replica, function) = runtime.block_on(async {
        let replica = RedisServer::replica_of(&native, &[]).await;
        // Loads the function.
        let limiter = Limiter::builder()
            .redis(plain.url())
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        limiter
            .decide(&bucket(Algorithm::Gcra, 1, "1/s"), "load", 1)
            .await
            .unwrap();
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut plain.connection().await)
            .await
            .unwrap();
        (replica, function_name(&plain).await)
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    proptest!(ProptestConfig { max_shrink_iters: 0, ..cases(64) }, |(calls in proptest::collection::vec((raw_call(), 0u64..400_000), 1..12))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = |k: usize| format!("raw:{case}:{k}");
        runtime.block_on(async {
            for (server, list) in [(&plain, 6), (&native, 6), (&plain, 7), (&native, 7)] {
                let _: () = redis::cmd("RPUSH")
                    .arg(key(list))
                    .arg("not a limit's")
                    .query_async(&mut server.connection().await)
                    .await
                    .unwrap();
            }
        });
        let mut now = 1_750_000_000_000_000u64;
        for (n, (call, step)) in calls.iter().enumerate() {
            now += step;
            let context = format!("case {case} call {n} {call:?}");
            let args = raw_arguments(call, &key, now);
            let (by_function, by_module, held_function, held_native, held_replica) = runtime.block_on(async {
                let by_function: redis::RedisResult<Vec<i64>> = redis::cmd("FCALL")
                    .arg(&function)
                    .arg(&args)
                    .query_async(&mut plain.connection().await)
                    .await;
                let by_module: redis::RedisResult<Vec<i64>> = redis::cmd("RATELIMIT.DECIDE")
                    .arg(WIRE_VERSION)
                    .arg(&args)
                    .query_async(&mut native.connection().await)
                    .await;
                native.wait_for_replicas().await;
                let held_function = plain.holdings().await;
                let (held_native, held_replica) = (native.holdings().await, replica.holdings().await);
                (by_function, by_module, held_function, held_native, held_replica)
            });
            let by_function = by_function.map_err(|e| e.to_string());
            prop_assert!(by_function.is_ok(), "{}: {:?}", context, by_function);
            prop_assert_eq!(by_function, by_module.map_err(|e| e.to_string()), "{}", context);
            same_holdings(&context, &held_function, &held_native, 250)?;
            same_holdings(
                &format!("{context}, on the replica"),
                &held_native,
                &held_replica,
                50,
            )?;
        }
    });
}

#[test]
fn clients_on_the_module_and_on_the_function_share_one_limit() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = with_module();
    // A user who may run everything but the module's command: its limiter
    // finds the module refused, and decides with the function.
    runtime.block_on(async {
        let mut connection = server.connection().await;
        let _: () = redis::cmd("ACL")
            .arg(
                &[
                    "SETUSER",
                    "lua",
                    "on",
                    ">secret",
                    "~*",
                    "+@all",
                    "-ratelimit.decide",
                ][..],
            )
            .query_async(&mut connection)
            .await
            .unwrap();
    });
    let families = families();
    let case = std::sync::atomic::AtomicU64::new(0);
    proptest!(cases(40), |(ops in proptest::collection::vec(op(), 1..40), sides in proptest::collection::vec(any::<bool>(), 40))| {
        let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = 1_750_000_000_000_000;
        let clock = ManualClock::new(start);
        let limiter = |url: String| {
            Limiter::builder()
                .redis(url)
                .timeout(Duration::from_secs(5))
                .clock(clock.clone())
                .deny_cache_max_keys(0)
                .build()
                .unwrap()
        };
        let lua_url = format!("redis://lua:secret@127.0.0.1:{}", server.port());
        let (native, lua, memory) = runtime.block_on(async {
            (
                limiter(server.url()),
                limiter(lua_url),
                Limiter::builder().memory().clock(clock.clone()).build().unwrap(),
            )
        });
        let key = |k: usize| format!("shared:{case}:{k}");
        let quota_of = |k: usize, q: usize| families[k / 2][q % families[k / 2].len()];
        let mut now = start;
        for (n, op) in ops.iter().enumerate() {
            // Leases are the Redis limiters' alone: the memory limiter
            // would not take one.
            if matches!(op, Op::Leased(..)) {
                continue;
            }
            let context = format!("case {case} step {n} {op:?}");
            match op {
                Op::Forward(d) => now += d,
                Op::Back(d) => now -= (*d).min(now - start),
                _ => {}
            }
            clock.set(now);
            let side = if sides[n] { &native } else { &lua };
            let (shared, alone) = runtime.block_on(async {
                (step(side, op, &key, &quota_of).await, step(&memory, op, &key, &quota_of).await)
            });
            prop_assert_eq!(&shared, &alone, "{} (on the {} path)", context, if sides[n] { "module" } else { "function" });
        }
    });
    runtime.block_on(async {
        assert!(server.command_calls(&["ratelimit.decide"]).await > 0);
        assert!(
            server.script_calls().await > 0,
            "the user without the module's command did not fall back to the function"
        );
    });
}

/// A refund that gives nothing back (a cost of 0, which no limiter sends,
/// or a window whose count is already 0) leaves the key as it is, its
/// expiry included, on the function as on the module. The calls carry a
/// caller's clock, which runs 600 ms between the decision and the refund
/// where Redis's runs a few: an expiry set again from the refund's instant
/// would land 600 ms early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_gives_nothing_back_leaves_the_key_and_its_expiry_as_they_are() {
    let (plain, native) = (RedisServer::start(), with_module());
    // Loads the function.
    Limiter::builder()
        .redis(plain.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .decide(&bucket(Algorithm::Gcra, 1, "1/s"), "load", 1)
        .await
        .unwrap();
    let function = function_name(&plain).await;
    let window_start = 1_750_000_000_000_000u64;
    let (decided_at, refunded_at) = (window_start + 100_000, window_start + 700_000);
    // By wire id: a token bucket of 4 at 1/s, a fixed window and a sliding
    // window of 4 a second. A refund's third number is the bucket's units
    // (none), or the windows' time to the admission's window's end.
    let requests: [(i64, [i64; 3], [i64; 3]); 3] = [
        (0, [1, 1_000_000, 4], [1, 1_000_000, 0]),
        (2, [4, 1_000_000, 0], [4, 1_000_000, 300_000]),
        (4, [4, 1_000_000, 0], [4, 1_000_000, 300_000]),
    ];
    for (algorithm, decide, refund) in requests {
        let key = format!("nothing-back:{algorithm}");
        let request =
            |cost: i64, now: u64, p: [i64; 3]| [algorithm, cost, now as i64, p[0], p[1], p[2]];
        let decision = one_key_call(
            &key,
            "each",
            "1",
            request(2, decided_at, decide),
            &["1", "1"],
        );
        let nothing = one_key_call(
            &key,
            "refund",
            "1",
            request(0, refunded_at, refund),
            &["1", "1"],
        );
        let mut expiries = Vec::new();
        for server in [&plain, &native] {
            let mut connection = server.connection().await;
            for args in [&decision, &nothing] {
                let mut command = if std::ptr::eq(server, &plain) {
                    let mut c = redis::cmd("FCALL");
                    c.arg(&function);
                    c
                } else {
                    let mut c = redis::cmd("RATELIMIT.DECIDE");
                    c.arg(WIRE_VERSION);
                    c
                };
                let reply: redis::RedisResult<redis::Value> =
                    command.arg(args).query_async(&mut connection).await;
                reply.unwrap_or_else(|e| panic!("{args:?}: {e}"));
            }
            let held = server.holdings().await;
            let (value, expires) = held
                .get(&key)
                .unwrap_or_else(|| panic!("{key} is gone: {held:?}"))
                .clone();
            expiries.push((value, expires));
        }
        let (by_function, by_module) = (&expiries[0], &expiries[1]);
        assert_eq!(by_function.0, by_module.0, "{key}'s value");
        assert!(
            (by_function.1 - by_module.1).abs() <= 50,
            "{key} expires at {} by the function, at {} by the module",
            by_function.1,
            by_module.1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_another_wire_version_is_refused_and_a_key_of_another_type_is_never_written() {
    let server = with_module();
    let mut connection = server.connection().await;
    let other: redis::RedisResult<redis::Value> = redis::cmd("RATELIMIT.DECIDE")
        .arg(999)
        .arg(1)
        .arg("k")
        .arg("each")
        .query_async(&mut connection)
        .await;
    let error = other.unwrap_err();
    assert_eq!(error.code(), Some("RLWIRE"), "{error}");

    // A list where a limit's key would be: each algorithm finds a value
    // it did not write, checked alone or with another key, and leaves
    // it as it was.
    let _: () = redis::cmd("RPUSH")
        .arg("rl:occupied")
        .arg("x")
        .query_async(&mut connection)
        .await
        .unwrap();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for quota in families().iter().map(|family| family[0]) {
        let alone = limiter.decide(&quota, "occupied", 1).await;
        assert!(
            matches!(&alone, Err(d) if fault(d) == Some(ErrorKind::ForeignValue)),
            "{}: {alone:?}",
            quota.algorithm()
        );
        let inspected = limiter.inspect(&quota, "occupied", 1).await;
        assert!(
            matches!(inspected, Err(Error::ForeignValue { .. })),
            "{}: {inspected:?}",
            quota.algorithm()
        );
        let all = limiter
            .decide_all(&[
                Request::new(&quota, "fresh"),
                Request::new(&quota, "occupied"),
            ])
            .await;
        assert!(
            matches!(&all, Err(d) if fault(d) == Some(ErrorKind::ForeignValue)),
            "{}: {all:?}",
            quota.algorithm()
        );
    }
    let kind: String = redis::cmd("TYPE")
        .arg("rl:occupied")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(kind, "list");
    assert!(server.command_calls(&["ratelimit.decide"]).await > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_leaves_a_watched_key_unmodified_and_an_admission_modifies_it() {
    let server = with_module();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = bucket(Algorithm::Gcra, 1, "1/min");
    let spent = limiter.decide(&quota, "watched", 1).await.unwrap();
    assert!(spent.allowed);
    // A transaction watching the key commits across a denial (which
    // writes nothing), and is aborted by an admission (which writes).
    let watched = |then: &'static str| {
        let server = &server;
        let limiter = &limiter;
        let quota = &quota;
        async move {
            let mut watcher = server
                .client()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let _: () = redis::cmd("WATCH")
                .arg("rl:watched")
                .query_async(&mut watcher)
                .await
                .unwrap();
            let decided = limiter.decide(quota, then, 1).await.unwrap();
            let committed: Option<Vec<String>> = redis::pipe()
                .atomic()
                .cmd("GET")
                .arg("rl:watched")
                .query_async(&mut watcher)
                .await
                .unwrap();
            (decided.allowed, committed.is_some())
        }
    };
    assert_eq!(
        watched("watched").await,
        (false, true),
        "a denial modified the key"
    );
    let _: () = redis::cmd("DEL")
        .arg("rl:watched")
        .query_async(&mut server.connection().await)
        .await
        .unwrap();
    assert_eq!(
        watched("watched").await,
        (true, false),
        "an admission left the key unmodified"
    );
}

/// The key of the hostile calls the module refuses and the function
/// decides: a bucket's cost above its capacity (a denial, which the client
/// never asks for), a rate not reduced (which it never sends), and an
/// instant past 2^53 µs (a caller's clock set past the year 2255).
const DECIDABLE: &str = "decidable";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_calls_are_refused_whole_and_the_server_lives_on() {
    let server = with_module();
    let mut connection = server.connection().await;
    let max = u64::MAX.to_string();
    // A bucket's request (algorithm, cost, clock and its three numbers).
    let bucket = ["1", "1", "", "1", "500000", "10"];
    let owned = |parts: &[&str]| parts.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    let calls: Vec<Vec<String>> = vec![
        // Counts that would wrap, or ask for vast allocations.
        owned(&["18446744073709551613", "k", "each"]),
        owned(&["1", "k", "runs", "99999999999999999"]),
        owned(&["1", "k", "runs", "1", "-9223372036854775808"]),
        owned(&["1", "k", "each", "99999999999999999"]),
        // A cost above the capacity, for a bucket and a sliding log's
        // refund (whose member names would be built by the billion). The
        // function decides the first, a denial (see `DECIDABLE`).
        one_key_call(
            DECIDABLE,
            "each",
            "1",
            ["1", "11", "", "1", "500000", "10"],
            &["1", "1"],
        ),
        one_key_call(
            "k",
            "refund",
            "1",
            ["3", &max, "", "4", "1000000", "77"],
            &["1", "1"],
        ),
        // A good group, then one cut short: nothing of the first is written.
        owned(
            &[
                &["2", "k", "k2", "each", "1"][..],
                &bucket,
                &["1", "1", "1"],
            ]
            .concat(),
        ),
        // A request cut short, and more requests than the call holds.
        one_key_call("k", "each", "1", &bucket[..3], &[]),
        one_key_call("k", "each", "3", bucket, &["1", "1"]),
        // The groups name more keys than the call, or a request it lacks.
        one_key_call("k", "each", "1", bucket, &["2", "1"]),
        one_key_call("k", "each", "1", bucket, &["1", "0"]),
        one_key_call("k", "each", "1", bucket, &["1", "2"]),
        // An instant no double holds exactly, an unknown algorithm, a
        // rate not reduced, a group across runs.
        one_key_call(
            DECIDABLE,
            "each",
            "1",
            ["1", "1", &max, "1", "500000", "10"],
            &["1", "1"],
        ),
        one_key_call(
            "k",
            "each",
            "1",
            ["9", "1", "", "1", "500000", "10"],
            &["1", "1"],
        ),
        one_key_call(
            DECIDABLE,
            "each",
            "1",
            ["1", "1", "", "2", "1000000", "10"],
            &["1", "1"],
        ),
        // A batch naming more keys than it holds.
        owned(&["0", "batch", "5", "k"]),
        owned(
            &[
                &["2", "k", "k2", "runs", "2", "1", "1", "1"][..],
                &bucket,
                &["2", "1"],
            ]
            .concat(),
        ),
        // A bucket's key, then a group of a sliding log naming vastly more
        // keys than the call: the function looped over the missing keys,
        // growing its reply, for good (`FUNCTION KILL`: unkillable, as the
        // bucket's key was written).
        owned(
            &[
                &["1", "k", "each", "2"][..],
                &bucket,
                &["3", "1", "", "10", "1000000", "0"],
                &["1", "1", "1000000000000000", "2"],
            ]
            .concat(),
        ),
        // The same with refunds, whose untagged log refunds return at once.
        owned(
            &[
                &["1", "k", "refund", "2"][..],
                &["1", "1", "", "1", "500000", "500000"],
                &["3", "1", "", "10", "1000000", "0"],
                &["1", "1", "1000000000000000", "2"],
            ]
            .concat(),
        ),
        // A sliding log longer than any quota makes, adding its cost in
        // members whatever the server's memory.
        one_key_call(
            "k",
            "each",
            "1",
            ["3", "300000", "", "1000000", "1000000", "0"],
            &["1", "1"],
        ),
        // All or nothing over a good request and one no quota has (no
        // tokens; a bucket deeper than 2^52; a window of no time): the
        // function wrote the first key, then failed at the second's write.
        owned(
            &[
                &["2", "k", "k2", "all", "2"][..],
                &bucket,
                &["1", "1", "", "0", "500000", "10"],
                &["1", "1", "1", "2"],
            ]
            .concat(),
        ),
        owned(
            &[
                &["2", "k", "k2", "all", "2"][..],
                &bucket,
                &["1", "1", "", "1", "9007199254740992", "9007199254740992"],
                &["1", "1", "1", "2"],
            ]
            .concat(),
        ),
        owned(
            &[
                &["2", "k", "k2", "all", "2"][..],
                &bucket,
                &["2", "1", "", "10", "0", "0"],
                &["1", "1", "1", "2"],
            ]
            .concat(),
        ),
        // A mode no limiter sends (the function ran it as `all`), and a
        // bucket refund of less than nothing (which adds debt).
        one_key_call("k", "bogus", "1", bucket, &["1", "1"]),
        one_key_call(
            "k",
            "refund",
            "1",
            ["1", "1", "", "1", "500000", "-5000000"],
            &["1", "1"],
        ),
        // Numbers no quota holds: NaN, a window past 2^53 µs (the log's
        // expiry failed after its `ZADD`, leaving it none; a window's was
        // 292 million years).
        one_key_call(
            "k",
            "each",
            "1",
            ["2", "nan", "", "10", "1000000", "0"],
            &["1", "1"],
        ),
        one_key_call(
            "k",
            "each",
            "1",
            ["2", "1", "0", "10", "9223300000000000000000", "0"],
            &["1", "1"],
        ),
        one_key_call(
            "k",
            "each",
            "1",
            ["3", "1", "0", "10", "9223371000000000000000", "0"],
            &["1", "1"],
        ),
    ];
    // The same calls to the function, on a server without the module.
    let plain = RedisServer::start();
    Limiter::builder()
        .redis(plain.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
        .decide(&support::bucket(Algorithm::Gcra, 1, "1/s"), "load", 1)
        .await
        .unwrap();
    let mut plain_connection = plain.connection().await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut plain_connection)
        .await
        .unwrap();
    let function = function_name(&plain).await;
    for args in &calls {
        let reply: redis::RedisResult<redis::Value> = redis::cmd("RATELIMIT.DECIDE")
            .arg(WIRE_VERSION)
            .arg(&args[..])
            .query_async(&mut connection)
            .await;
        let error = reply.expect_err(&format!("{args:?} was decided"));
        assert!(
            matches!(error.code(), Some("RLARGS" | "ERR")),
            "{args:?}: {error}"
        );
        // The function may decide what the module refuses (a cost above
        // the capacity is a denial there), but writes nothing either.
        let by_function = tokio::time::timeout(
            Duration::from_secs(10),
            redis::cmd("FCALL")
                .arg(&function)
                .arg(&args[..])
                .query_async::<redis::Value>(&mut plain_connection),
        )
        .await;
        let answered = match &by_function {
            Ok(Ok(_)) => true,
            Ok(Err(error)) => error.code().is_some(),
            Err(_) => false,
        };
        assert!(
            answered,
            "the function never answered {args:?}: {by_function:?}"
        );
    }
    for (server, connection) in [
        ("module", &mut connection),
        ("function", &mut plain_connection),
    ] {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(connection)
            .await
            .unwrap();
        let written: Vec<&String> = keys
            .iter()
            .filter(|key| server == "module" || key.as_str() != DECIDABLE)
            .collect();
        assert!(
            written.is_empty(),
            "refused calls wrote {written:?} ({server})"
        );
        let pong: String = redis::cmd("PING").query_async(connection).await.unwrap();
        assert_eq!(pong, "PONG");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_holds_what_the_module_wrote_on_its_master() {
    let master = with_module();
    // The replica has no module: it applies the writes the module sent.
    // Synced before the first decision, so that every write reaches the
    // replica as a command, not in the master's snapshot.
    let replica = RedisServer::replica_of(&master, &[]).await;
    let limiter = uncached(&master);
    for (k, quota) in families().iter().flatten().enumerate() {
        let key = format!("replicated:{k}");
        for cost in [1, 1, 2] {
            let _ = limiter.decide(quota, &key, cost).await.unwrap();
        }
        let admitted = limiter
            .check(Request::new(quota, &key).on_error(ratelimit::FailurePolicy::Closed))
            .await;
        if let Ok(admitted) = admitted {
            limiter.refund(admitted).await.unwrap();
        }
    }
    master.wait_for_replicas().await;
    assert!(master.command_calls(&["ratelimit.decide"]).await > 0);
    let (on_master, on_replica) = (master.holdings().await, replica.holdings().await);
    assert!(!on_master.is_empty());
    // A key whose window ends between the two readings is gone from the
    // second: keys about to expire are not compared.
    same_holdings("on the replica", &on_master, &on_replica, 0).unwrap();
    assert!(
        on_master.values().all(|(_, expires)| *expires > 0),
        "a key with no expiry: {on_master:?}"
    );
}

/// A replica without the module, and the master's own AOF read back by a
/// restart, hold what the module wrote: a call's writes go out as one
/// `EVAL`, or as a command each where the servers have `EVAL` renamed away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_writes_reach_a_replica_and_the_aof_whatever_eval_is_named() {
    let module = native_module();
    for renamed in [false, true] {
        let rename: &[&str] = if renamed {
            &["--rename-command", "EVAL", "eval-renamed"]
        } else {
            &[]
        };
        let mut args = vec!["--loadmodule", module.to_str().unwrap()];
        args.extend(["--appendonly", "yes", "--appendfsync", "always"]);
        args.extend(rename);
        let mut master = RedisServer::start_with(&args);
        let replica = RedisServer::replica_of(&master, rename).await;
        let limiter = uncached(&master);
        // Concurrent checks share calls: many writes a call. Half are
        // refunded, in calls of their own. Each algorithm at a minute's
        // pace, so that the keys outlast the test however slow the machine.
        use Algorithm::*;
        let quotas = [
            bucket(TokenBucket, 5, "1/min"),
            bucket(Gcra, 3, "1/min"),
            bucket(LeakyBucket, 4, "1/min"),
            window(FixedWindow, 5, "1m"),
            window(SlidingLog, 4, "1m"),
            window(SlidingWindow, 6, "1m"),
        ];
        for (q, quota) in quotas.iter().enumerate() {
            let checks = (0..24).map(|k| {
                let (limiter, key) = (&limiter, format!("aof:{q}:{k}"));
                async move {
                    let request =
                        Request::new(quota, &key).on_error(ratelimit::FailurePolicy::Closed);
                    match limiter.check(request).await {
                        Ok(admitted) if k % 2 == 0 => limiter.refund(admitted).await.unwrap(),
                        Ok(_) => {}
                        Err(denied) => panic!("{key}: {denied:?}"),
                    }
                }
            });
            futures::future::join_all(checks).await;
        }
        let context = if renamed { "EVAL renamed" } else { "EVAL" };
        assert!(
            master.command_calls(&["ratelimit.decide"]).await > 0,
            "{context}"
        );
        master.wait_for_replicas().await;
        let scripts = replica.command_calls(&["eval", "eval-renamed"]).await;
        if renamed {
            assert_eq!(scripts, 0, "{context}: the replica ran scripts");
        } else {
            assert!(
                scripts > 0,
                "{context}: no call's writes went as one script"
            );
        }
        let on_master = master.holdings().await;
        // The 72 keys not refunded at least: a refunded bucket may be full
        // again, holding nothing.
        assert!(on_master.len() >= 72, "{context}: {} keys", on_master.len());
        same_holdings(
            &format!("{context}, on the replica"),
            &on_master,
            &replica.holdings().await,
            50,
        )
        .unwrap();
        // The master again, from its AOF alone.
        master.restart();
        same_holdings(
            &format!("{context}, read back from the AOF"),
            &on_master,
            &master.holdings().await,
            50,
        )
        .unwrap();
    }
}

/// Calls of the module inside `MULTI`/`EXEC` and inside a user's script
/// reach a replica as they did on the master: the call's `EVAL` travels
/// inside the transaction, or among the script's effects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_a_transaction_or_a_script_reach_a_replica_as_on_the_master() {
    let master = with_module();
    let replica = RedisServer::replica_of(&master, &[]).await;
    // Two keys of a bucket of 4 at one token a minute, on the server's clock.
    let call = |a: &str, b: &str| -> Vec<String> {
        let fields = [
            "2", a, b, "each", "1", "0", "1", "", "1", "60000000", "4", "1", "1", "1", "1",
        ];
        std::iter::once(WIRE_VERSION.to_string())
            .chain(fields.iter().map(|f| f.to_string()))
            .collect()
    };
    let mut connection = master.connection().await;
    let answers: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("RATELIMIT.DECIDE")
        .arg(call("multi:1", "multi:2"))
        .cmd("RATELIMIT.DECIDE")
        .arg(call("multi:3", "multi:4"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(answers.len(), 2, "{answers:?}");
    let script = "return redis.call('RATELIMIT.DECIDE', unpack(ARGV))";
    let _: Vec<i64> = redis::cmd("EVAL")
        .arg(script)
        .arg(0)
        .arg(call("script:1", "script:2"))
        .query_async(&mut connection)
        .await
        .unwrap();
    // A script that runs a while before its call: a server that reads its
    // clock once a script would count an expiry relative to it from the
    // script's start, and the instant sent to the replica from the call's.
    let busy = "local n = 0 for i = 1, 30000000 do n = n + i end \
                return redis.call('RATELIMIT.DECIDE', unpack(ARGV))";
    let _: Vec<i64> = redis::cmd("EVAL")
        .arg(busy)
        .arg(0)
        .arg(call("script:3", "script:4"))
        .query_async(&mut connection)
        .await
        .unwrap();
    master.wait_for_replicas().await;
    let on_master = master.holdings().await;
    assert_eq!(on_master.len(), 8, "{on_master:?}");
    same_holdings("on the replica", &on_master, &replica.holdings().await, 0).unwrap();
    assert!(
        replica.command_calls(&["eval"]).await >= 3,
        "each call's two writes went as one script"
    );
}

/// A sorted set that another writer gave a score no admission has (`inf`,
/// a negative one, one past 2^53): the module's sliding log still expires
/// within its window. (Read as an instant, `inf` wrapped the log's expiry to
/// about 500 years ahead.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_with_a_score_no_admission_has_still_expires() {
    let server = with_module();
    let limiter = uncached(&server);
    let quota = window(Algorithm::SlidingLog, 4, "1s");
    let mut connection = server.connection().await;
    for (n, score) in ["inf", "-5", "1e19"].into_iter().enumerate() {
        let key = format!("odd-score:{n}");
        limiter.check(Request::new(&quota, &key)).await.unwrap();
        let held: Vec<String> = server
            .holdings()
            .await
            .into_keys()
            .filter(|name| name.contains(&key))
            .collect();
        let [name] = &held[..] else {
            panic!("one key for {key}: {held:?}");
        };
        let _: i64 = redis::cmd("ZADD")
            .arg(name)
            .arg(score)
            .arg("elsewhere")
            .query_async(&mut connection)
            .await
            .unwrap();
        limiter.check(Request::new(&quota, &key)).await.unwrap();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(name)
            .query_async(&mut connection)
            .await
            .unwrap();
        assert!(
            (1..=2_000).contains(&pttl),
            "{name} with a member scored {score} expires in {pttl} ms"
        );
    }
}

/// A listener on keyspace events (`notify-keyspace-events`) sees the same
/// events from decisions and refunds on the module as on the function:
/// `set` and `expire` for each write, `del` for a key a refund empties. (The
/// module's in-place writes sent none.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_sends_the_keyspace_events_the_function_sends() {
    use futures::StreamExt as _;
    let mut seen = Vec::new();
    for server in [RedisServer::start(), with_module()] {
        let mut redis = server.connection().await;
        support::config_set(&mut redis, "notify-keyspace-events", "K$g").await;
        let mut events = server.client().get_async_pubsub().await.unwrap();
        events
            .psubscribe("__keyspace@0__:rl:events*")
            .await
            .unwrap();
        let limiter = uncached(&server);
        for (quota, key) in [
            (bucket(Algorithm::TokenBucket, 5, "1/h"), "events"),
            (window(Algorithm::FixedWindow, 5, "1h"), "events:window"),
        ] {
            let admitted = limiter.check(Request::new(&quota, key)).await.unwrap();
            limiter.refund(admitted).await.unwrap();
        }
        let mut stream = events.on_message();
        let mut names = Vec::new();
        while let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(500), stream.next()).await
        {
            names.push(message.get_payload::<String>().unwrap());
        }
        seen.push(names);
    }
    assert_eq!(
        seen[0],
        ["set", "expire", "set", "expire", "set", "expire", "del"],
        "the function's events: the bucket's and the window's decisions and refunds \
         (which empties the window)"
    );
    assert_eq!(seen[1], seen[0], "the module's events");
}
