//! The Redis Cluster backend against a private cluster of 3 masters and 3
//! replicas on loopback.

mod support;

use support::{fault, Decide};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit::{BreakerConfig, FailurePolicy, Limiter, Quota, Request};
use support::{native_module, RedisCluster};

/// Two tests of one body, `$name::on_the_function` on a cluster without the
/// native module and `$name::on_the_module` on one whose every node loads it.
macro_rules! on_both_paths {
    (multi_thread: $name:ident) => {
        on_both_paths!($name, #[tokio::test(flavor = "multi_thread", worker_threads = 2)]);
    };
    (current_thread: $name:ident) => {
        on_both_paths!($name, #[tokio::test]);
    };
    ($name:ident, #[$test:meta]) => {
        mod $name {
            #[$test]
            async fn on_the_function() {
                super::$name(false).await;
            }

            #[$test]
            async fn on_the_module() {
                super::$name(true).await;
            }
        }
    };
}

/// Keys `<prefix>:<n>` whose slot master `master` serves, in order.
fn keys_on<'a>(
    cluster: &'a RedisCluster,
    master: usize,
    prefix: &'a str,
) -> impl Iterator<Item = String> + 'a {
    (0..)
        .map(move |i| format!("{prefix}:{i}"))
        .filter(move |key| {
            cluster.slot_owner(cluster.keyslot(&format!("rl:{key}")), master) == master
        })
}

/// A limiter on `cluster` without the deny cache: every decision reaches
/// Redis.
fn uncached(cluster: &RedisCluster, timeout: Duration) -> Limiter {
    Limiter::builder()
        .cluster(cluster.urls())
        .timeout(timeout)
        .deny_cache_max_keys(0)
        .build()
        .unwrap()
}

/// A cluster whose nodes load the native module (and allow `MODULE
/// UNLOAD`), or do not.
fn start(masters: usize, replicas: usize, module: bool) -> RedisCluster {
    start_with(masters, replicas, module, &[])
}

/// The same, each node started with `extra` arguments too.
fn start_with(masters: usize, replicas: usize, module: bool, extra: &[&str]) -> RedisCluster {
    if module {
        let module = native_module();
        let mut args = vec![
            "--loadmodule",
            module.to_str().unwrap(),
            "--enable-module-command",
            "yes",
        ];
        args.extend_from_slice(extra);
        RedisCluster::start_with(masters, replicas, &args)
    } else {
        RedisCluster::start_with(masters, replicas, extra)
    }
}

/// Asserts which path decided on the masters: the native module, and no
/// script, when the nodes load it; else the function.
async fn served_by(cluster: &RedisCluster, module: bool) {
    let (mut scripts, mut native) = (0, 0);
    for node in cluster.masters() {
        scripts += cluster.nodes[node].script_calls().await;
        native += cluster.nodes[node]
            .command_calls(&["ratelimit.decide"])
            .await;
    }
    if module {
        assert_eq!(scripts, 0, "script calls beside the module's {native}");
        assert!(native > 0, "the module decided nothing");
    } else {
        assert_eq!(native, 0, "module calls on a cluster without it");
        assert!(scripts > 0, "no script ran");
    }
}

/// Zeroes every master's command counts (`CONFIG RESETSTAT`).
async fn reset_masters_stats(cluster: &RedisCluster) {
    for node in cluster.masters() {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut cluster.nodes[node].connection().await)
            .await
            .unwrap();
    }
}

/// Two of `quota`'s tokens admitted on `key`, then a denial (the quota
/// refills slowly); a fault fails the test.
async fn admits_twice_then_denies(limiter: &Limiter, quota: &Quota, key: &str) {
    for expected in [true, true, false] {
        let d = limiter
            .decide(quota, key, 1)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(d.allowed, expected, "{key} {quota:?}: {d:?}");
    }
}

/// Keys were spread over every master.
fn every_master_holds_over_50_keys(cluster: &RedisCluster) {
    for master in cluster.masters() {
        assert!(
            cluster.dbsize(master) > 50,
            "master {master} holds {} keys",
            cluster.dbsize(master)
        );
    }
}

fn limiter(cluster: &RedisCluster, policy: FailurePolicy) -> Limiter {
    Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_millis(500))
        .failure_policy(policy)
        .build()
        .unwrap()
}

// One cluster for the whole binary's tests would couple them; each test
// builds its own.
on_both_paths!(multi_thread: keys_spread_over_every_master_and_every_algorithm_decides);
async fn keys_spread_over_every_master_and_every_algorithm_decides(module: bool) {
    let cluster = start(3, 1, module);
    let limiter = limiter(&cluster, FailurePolicy::Closed);
    // Hour-long windows: a fixed window, aligned on the clock, that began
    // between a key's first and second decision would admit its third (a
    // minute-long one did, once in CI).
    let quotas = [
        Quota::new(2, "1/h".parse().unwrap()).unwrap(),
        Quota::gcra(2, "1/h".parse().unwrap()).unwrap(),
        Quota::fixed_window(2, Duration::from_secs(3_600)).unwrap(),
        Quota::sliding_log(2, Duration::from_secs(3_600)).unwrap(),
        Quota::sliding_window(2, Duration::from_secs(3_600)).unwrap(),
        Quota::leaky_bucket(2, "1/h".parse().unwrap()).unwrap(),
    ];
    for i in 0..300 {
        let quota = &quotas[i % quotas.len()];
        let key = format!("user:{i}");
        admits_twice_then_denies(&limiter, quota, &key).await;
    }
    every_master_holds_over_50_keys(&cluster);
    served_by(&cluster, module).await;
}

on_both_paths!(multi_thread: all_or_nothing_holds_within_a_slot_and_across_slots);
async fn all_or_nothing_holds_within_a_slot_and_across_slots(module: bool) {
    let cluster = start(3, 1, module);
    let limiter = limiter(&cluster, FailurePolicy::Closed);
    let per_user = Quota::new(10, "10/min".parse().unwrap()).unwrap();
    let per_ip = Quota::sliding_log(1, Duration::from_secs(60)).unwrap();
    // A common hash tag: one slot, one script call.
    let tagged = |ip: &'static str| {
        [
            Request::new(&per_user, "{u7}:user"),
            Request::new(&per_ip, ip),
        ]
    };
    limiter.check(tagged("{u7}:ip:a")).await.unwrap();
    let denied = limiter.check(tagged("{u7}:ip:a")).await.unwrap_err();
    assert_eq!(denied.key, "{u7}:ip:a");
    assert_eq!(
        limiter
            .decide(&per_user, "{u7}:user", 0)
            .await
            .unwrap()
            .remaining,
        9
    );
    // Different slots: consumed in order, given back when a later one denies.
    let global = Quota::gcra(100, "100/min".parse().unwrap()).unwrap();
    let spread = |ip: &'static str| {
        [
            Request::new(&per_user, "user:8"),
            Request::new(&global, "global"),
            Request::new(&per_ip, ip),
        ]
    };
    limiter.check(spread("ip:b")).await.unwrap();
    let denied = limiter.check(spread("ip:b")).await.unwrap_err();
    assert_eq!(denied.key, "ip:b");
    assert_eq!(
        limiter
            .decide(&per_user, "user:8", 0)
            .await
            .unwrap()
            .remaining,
        9,
        "user refunded"
    );
    assert_eq!(
        limiter
            .decide(&global, "global", 0)
            .await
            .unwrap()
            .remaining,
        99,
        "global refunded"
    );
    served_by(&cluster, module).await;
}

on_both_paths!(multi_thread: a_killed_master_fails_over_and_limiting_continues);
async fn a_killed_master_fails_over_and_limiting_continues(module: bool) {
    let mut cluster = start(3, 1, module);
    let limiter = limiter(&cluster, FailurePolicy::Open);
    let quota = Quota::new(1_000_000, "1000000/s".parse().unwrap()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let from_redis = Arc::new(AtomicU64::new(0));
    let fallbacks = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (limiter, stop, from_redis, fallbacks) = (
                limiter.clone(),
                stop.clone(),
                from_redis.clone(),
                fallbacks.clone(),
            );
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = format!("k:{t}:{}", i % 50);
                    let admitted = limiter.check(Request::new(&quota, &key)).await.unwrap();
                    let decision = admitted.decisions()[0];
                    let counter = if decision.fallback {
                        &fallbacks
                    } else {
                        &from_redis
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    let wait_for_redis = |count: u64, within: Duration| {
        let from_redis = from_redis.clone();
        async move {
            let started = Instant::now();
            let target = from_redis.load(Ordering::Relaxed) + count;
            while from_redis.load(Ordering::Relaxed) < target {
                assert!(
                    started.elapsed() < within,
                    "Redis did not decide again within {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_for_redis(200, Duration::from_secs(10)).await;
    let victim = cluster.masters()[0];
    cluster.nodes[victim].kill();
    // The replica is promoted after the node timeout (1 s); until then the
    // failure policy answers for the dead master's slots.
    tokio::task::spawn_blocking({
        let started = Instant::now();
        move || {
            while started.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    })
    .await
    .unwrap();
    tokio::task::block_in_place(|| cluster.wait_until_ok(Duration::from_secs(30)));
    let seen_before = fallbacks.load(Ordering::Relaxed);
    wait_for_redis(500, Duration::from_secs(20)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("no caller panics");
    }
    assert_eq!(
        cluster.masters().len(),
        3,
        "a replica took the dead master's place"
    );
    assert!(
        seen_before > 0,
        "the dead master's keys fell back to the policy meanwhile"
    );
    assert_eq!(
        limiter.stats().fallback_allowed,
        fallbacks.load(Ordering::Relaxed),
        "every fallback counted"
    );
    served_by(&cluster, module).await;
}

on_both_paths!(multi_thread: a_refund_across_slots_removes_exactly_its_own_sliding_log_admissions);
async fn a_refund_across_slots_removes_exactly_its_own_sliding_log_admissions(module: bool) {
    use ratelimit::ManualClock;
    use redis::AsyncCommands as _;
    let cluster = start(3, 0, module);
    let start = 1_800_000_000_000_000;
    let (clock, later) = (ManualClock::new(start), ManualClock::new(start + 1_000_000));
    let on = |clock: &ManualClock| {
        Limiter::builder()
            .cluster(cluster.urls())
            .timeout(Duration::from_millis(500))
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let (limiter, other) = (on(&clock), on(&later));
    let log = Quota::sliding_log(5, Duration::from_secs(60)).unwrap();
    let spent = Quota::fixed_window(1, Duration::from_secs(60)).unwrap();
    // Keys on different slots: the check consumes the log, then is denied by
    // the spent window, and gives the log's admission back by a refund.
    let (log_key, window_key) = ("{a}log", "{b}window");
    limiter.decide(&spent, window_key, 1).await.unwrap();
    // Another instance's admission, the newest in the log.
    other.decide(&log, log_key, 1).await.unwrap();
    for _ in 0..3 {
        let denied = limiter
            .check([
                Request::new(&log, log_key),
                Request::new(&spent, window_key),
            ])
            .await
            .unwrap_err();
        assert_eq!(denied.key, window_key);
    }
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let mut redis = client.get_async_connection().await.unwrap();
    let members: Vec<(String, f64)> = redis
        .zrange_withscores(format!("rl:{log_key}"), 0, -1)
        .await
        .unwrap();
    assert_eq!(
        members.len(),
        1,
        "three refunded checks left the log with {members:?}"
    );
    assert_eq!(
        members[0].1 as u64,
        start + 1_000_000,
        "the refunds took the other instance's admission: {members:?}"
    );
    served_by(&cluster, module).await;
}

// Current-thread: every decision below is queued before the batching task
// runs, so they go together.
on_both_paths!(current_thread: a_batch_over_several_slots_of_one_master_is_one_call);
async fn a_batch_over_several_slots_of_one_master_is_one_call(module: bool) {
    let cluster = start(3, 0, module);
    let limiter = uncached(&cluster, Duration::from_millis(500));
    let quota = Quota::new(1, "1/min".parse().unwrap()).unwrap();
    let master = cluster.masters()[0];
    let mut keys = keys_on(&cluster, master, "user");
    let (warm, keys): (Vec<String>, Vec<String>) =
        ((&mut keys).take(2).collect(), keys.take(20).collect());
    let slots: std::collections::HashSet<u16> = keys
        .iter()
        .map(|key| cluster.keyslot(&format!("rl:{key}")))
        .collect();
    assert!(slots.len() > 10, "the keys share slots: {slots:?}");
    // Loads the slot map and the flagged script, which a first call does.
    for decision in
        futures::future::join_all(warm.iter().map(|k| limiter.decide(&quota, k, 1))).await
    {
        assert!(decision.unwrap().allowed);
    }
    reset_masters_stats(&cluster).await;
    let decisions =
        futures::future::join_all(keys.iter().map(|k| limiter.decide(&quota, k, 1))).await;
    for (key, decision) in keys.iter().zip(decisions) {
        let decision = decision.unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(decision.allowed, "{key}: {decision:?}");
        assert!(cluster.holds(master, &format!("rl:{key}")), "{key} written");
    }
    let calls: &[&str] = if module {
        &["ratelimit.decide"]
    } else {
        &["fcall", "evalsha"]
    };
    for node in cluster.masters() {
        let made = cluster.nodes[node].command_calls(calls).await;
        let expected = u64::from(node == master);
        assert_eq!(
            made, expected,
            "{calls:?} calls on node {node} (the keys' master is {master})"
        );
    }
    served_by(&cluster, module).await;
}

// Current-thread: the decisions below are queued before the batching task
// runs, so they go in one batch.
on_both_paths!(current_thread: a_full_master_answers_the_denials_of_a_batch);
async fn a_full_master_answers_the_denials_of_a_batch(module: bool) {
    let cluster = start(3, 0, module);
    let limiter = uncached(&cluster, Duration::from_millis(500));
    let quota = Quota::new(1, "1/min".parse().unwrap()).unwrap();
    let master = cluster.masters()[0];
    let mut keys = keys_on(&cluster, master, "user");
    let (spent, fresh): (Vec<String>, Vec<String>) =
        ((&mut keys).take(3).collect(), keys.take(3).collect());
    for key in &spent {
        assert!(limiter.decide(&quota, key, 1).await.unwrap().allowed);
    }
    for node in cluster.masters() {
        let mut connection = cluster.nodes[node].connection().await;
        for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
            support::config_set(&mut connection, name, value).await;
        }
    }
    let decisions = futures::future::join_all(
        spent
            .iter()
            .chain(&fresh)
            .map(|key| limiter.decide(&quota, key, 1)),
    )
    .await;
    for node in cluster.masters() {
        support::config_set(
            &mut cluster.nodes[node].connection().await,
            "maxmemory",
            "0",
        )
        .await;
    }
    let (spent_decisions, fresh_decisions) = decisions.split_at(spent.len());
    for (key, decision) in spent.iter().zip(spent_decisions) {
        let decision = decision
            .as_ref()
            .unwrap_or_else(|e| panic!("{key}: a denial needs no memory: {e}"));
        assert!(!decision.allowed, "{key}: {decision:?}");
    }
    for (key, decision) in fresh.iter().zip(fresh_decisions) {
        let error = decision.as_ref().expect_err("an admission needs a write");
        assert_eq!(
            fault(error),
            Some(ratelimit::ErrorKind::Unavailable),
            "{key}: {error}"
        );
    }
}

on_both_paths!(multi_thread: decisions_stay_exact_while_slots_move_between_masters);
async fn decisions_stay_exact_while_slots_move_between_masters(module: bool) {
    let cluster = Arc::new(start(3, 0, module));
    let limiter = uncached(&cluster, Duration::from_secs(2));
    // Never refills within the test: what Redis has left is exactly what
    // it did not admit.
    let capacity = 100_000;
    let quota = Quota::new(capacity, "1/h".parse().unwrap()).unwrap();
    // Eight slots of 25 keys each; half of the slots move.
    let keys: Arc<Vec<String>> = Arc::new(
        (0..8)
            .flat_map(|t| (0..25).map(move |i| format!("{{t{t}}}:k{i}")))
            .collect(),
    );
    let admitted: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let timeouts = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (limiter, keys, admitted, timeouts, stop) = (
                limiter.clone(),
                keys.clone(),
                admitted.clone(),
                timeouts.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut i = t * 13;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let k = i % keys.len();
                    match limiter.decide(&quota, &keys[k], 1).await {
                        Ok(d) if d.allowed => {
                            admitted[k].fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(d) => panic!("{}: denied under capacity: {d:?}", keys[k]),
                        // What a caller's failure policy answers.
                        Err(denied) if fault(&denied) == Some(ratelimit::ErrorKind::Timeout) => {
                            timeouts.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("{}: {e}", keys[k]),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let moved: Vec<(String, usize, usize)> = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || {
            let masters = cluster.masters();
            (0..4)
                .map(|t| {
                    let key = format!("rl:{{t{t}}}:k0");
                    let slot = cluster.keyslot(&key);
                    let from = cluster.slot_owner(slot, masters[0]);
                    let to = masters[(masters.iter().position(|&m| m == from).unwrap() + 1) % 3];
                    cluster.move_slot(slot, from, to, Duration::from_millis(5));
                    (key, from, to)
                })
                .collect()
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("no caller saw an error but a timeout");
    }
    for (key, from, to) in &moved {
        assert!(cluster.holds(*to, key), "{key} moved to node {to}");
        assert!(!cluster.holds(*from, key), "{key} left node {from}");
    }
    let timeouts = timeouts.load(Ordering::Relaxed);
    let mut total = 0;
    for (k, key) in keys.iter().enumerate() {
        let admitted = admitted[k].load(Ordering::Relaxed);
        total += admitted;
        let left = limiter.decide(&quota, key, 0).await.unwrap().remaining;
        // Never more left than was not admitted: no admission was lost.
        assert!(
            left <= capacity - admitted,
            "{key}: {admitted} admitted, {left} left"
        );
        // A call that timed out may have run; with none, nothing was
        // applied twice either.
        if timeouts == 0 {
            assert_eq!(left, capacity - admitted, "{key}: applied twice");
        }
    }
    assert!(total > 2_000, "decisions flowed: {total} admitted");
    eprintln!("{total} admitted, {timeouts} timeouts");
    served_by(&cluster, module).await;
}

// One master killed under load, with a breaker per master: the keys of the
// two healthy masters are decided by Redis the whole time, and only the
// dead master's keys go to the failure policy until its replica takes over.
on_both_paths!(multi_thread: a_dead_master_sends_only_its_own_keys_to_the_failure_policy);
async fn a_dead_master_sends_only_its_own_keys_to_the_failure_policy(module: bool) {
    let mut cluster = start(3, 1, module);
    let limiter = limiter(&cluster, FailurePolicy::Open);
    let quota = Quota::new(1_000_000, "1000000/s".parse().unwrap()).unwrap();
    let victim = cluster.masters()[0];
    let keys: Vec<String> = (0..60).map(|i| format!("health:{i}")).collect();
    let on_victim: Vec<bool> = keys
        .iter()
        .map(|k| cluster.slot_owner(cluster.keyslot(&format!("rl:{k}")), victim) == victim)
        .collect();
    assert!(on_victim.iter().any(|&v| v) && on_victim.iter().any(|&v| !v));
    let keys = Arc::new(keys);
    let on_victim = Arc::new(on_victim);
    let stop = Arc::new(AtomicBool::new(false));
    // Fallbacks of keys on the victim, and on the healthy masters; when the
    // victim's keys last fell back (µs after the start).
    let fallbacks = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let last_fallback_us = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let from_redis = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let (limiter, stop, keys, on_victim, fallbacks, from_redis, last_fallback_us) = (
                limiter.clone(),
                stop.clone(),
                keys.clone(),
                on_victim.clone(),
                fallbacks.clone(),
                from_redis.clone(),
                last_fallback_us.clone(),
            );
            tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 7) % keys.len();
                    let admitted = limiter.check(Request::new(&quota, &keys[i])).await.unwrap();
                    if admitted.decisions()[0].fallback {
                        fallbacks[usize::from(!on_victim[i])].fetch_add(1, Ordering::Relaxed);
                        let at = started.elapsed().as_micros() as u64;
                        last_fallback_us.fetch_max(at, Ordering::Relaxed);
                    } else {
                        from_redis.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    while from_redis.load(Ordering::Relaxed) < 300 {
        assert!(started.elapsed() < Duration::from_secs(10), "Redis decides");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let killed_at = started.elapsed();
    cluster.nodes[victim].kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    tokio::task::block_in_place(|| cluster.wait_until_ok(Duration::from_secs(30)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("no caller panics");
    }
    let [dead, healthy] = [0, 1].map(|i| fallbacks[i].load(Ordering::Relaxed));
    let last = Duration::from_micros(last_fallback_us.load(Ordering::Relaxed));
    eprintln!(
        "a dead master: {dead} fallbacks for its keys until {:?} after the kill, {healthy} for \
         the others",
        last.saturating_sub(killed_at)
    );
    assert!(dead > 0, "the dead master's keys fell back meanwhile");
    assert_eq!(healthy, 0, "keys on healthy masters fell back");
    assert_eq!(limiter.circuit_state(), ratelimit::CircuitState::Closed);
    served_by(&cluster, module).await;
}

/// What `key` has left under `quota` once a bucket has refilled what it
/// did while a refunded check was on its way (a refund counts from before
/// the call, as it cannot know when Redis decided): a moment.
async fn whole_again(limiter: &Limiter, quota: &Quota, key: &str) -> u64 {
    tokio::time::sleep(Duration::from_millis(50)).await;
    limiter.inspect(quota, key, 0).await.unwrap().remaining
}

on_both_paths!(multi_thread: refunds_give_back_on_every_master_for_every_algorithm);
async fn refunds_give_back_on_every_master_for_every_algorithm(module: bool) {
    let cluster = start(3, 0, module);
    let limiter = limiter(&cluster, FailurePolicy::Closed);
    let day = Duration::from_secs(86_400);
    let quotas = [
        Quota::new(2, "2/d".parse().unwrap()).unwrap(),
        Quota::gcra(2, "2/d".parse().unwrap()).unwrap(),
        Quota::leaky_bucket(2, "2/d".parse().unwrap()).unwrap(),
        Quota::fixed_window(2, day).unwrap(),
        Quota::sliding_log(2, day).unwrap(),
        Quota::sliding_window(2, day).unwrap(),
    ];
    // Keys of many slots, so every master refunds.
    let keys: Vec<String> = (0..30).map(|i| format!("refund:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let quota = &quotas[i % quotas.len()];
        let admitted = limiter
            .check(Request::new(quota, key).cost(2))
            .await
            .unwrap();
        assert!(
            limiter.check(Request::new(quota, key)).await.is_err(),
            "{key}"
        );
        limiter.refund(admitted).await.unwrap();
        assert_eq!(
            whole_again(&limiter, quota, key).await,
            2,
            "{key} {quota:?}"
        );
    }
    // One check across slots, refunded as a whole.
    let requests: Vec<Request<'_>> = keys[..6]
        .iter()
        .zip(&quotas)
        .map(|(key, quota)| Request::new(quota, key))
        .collect();
    let admitted = limiter.check(&requests[..]).await.unwrap();
    limiter.refund(admitted).await.unwrap();
    for (key, quota) in keys[..6].iter().zip(&quotas) {
        assert_eq!(whole_again(&limiter, quota, key).await, 2, "{key}");
    }
    // A check across slots denied by its last limit gives the earlier
    // ones back itself, a fixed window's too.
    let spent = Quota::fixed_window(1, day).unwrap();
    limiter.check(Request::new(&spent, "spent")).await.unwrap();
    let denied = limiter
        .check([
            Request::new(&quotas[3], "first"),
            Request::new(&spent, "spent"),
        ])
        .await
        .unwrap_err();
    assert_eq!(denied.key, "spent");
    assert_eq!(
        limiter
            .inspect(&quotas[3], "first", 0)
            .await
            .unwrap()
            .remaining,
        2
    );
    assert_eq!(limiter.stats().refunded, 36);
    served_by(&cluster, module).await;
}

// Current-thread, so the decisions below go as one batch: a key the ACL
// user may not touch is refused on its own with the user's error and never
// written, and the batch's other keys are decided, also when that key
// comes first.
on_both_paths!(current_thread: a_key_the_user_may_not_touch_is_refused_alone_within_a_batch);
async fn a_key_the_user_may_not_touch_is_refused_alone_within_a_batch(module: bool) {
    let cluster = start(3, 0, module);
    // ACL users are each node's own.
    for node in &cluster.nodes {
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "app",
                "on",
                ">secret",
                "~rl:user:*",
                "%R~rl:read:*",
                "+@all",
            ])
            .query_async(&mut node.connection().await)
            .await
            .unwrap();
    }
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|node| format!("redis://app:secret@127.0.0.1:{}", node.port()))
        .collect();
    let limiter = Limiter::builder()
        .cluster(urls)
        .timeout(Duration::from_millis(500))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = Quota::new(1, "1/min".parse().unwrap()).unwrap();
    let master = cluster.masters()[0];
    let mine = |prefix: &'static str| {
        (0..).map(move |i| format!("{prefix}:{i}")).filter(|key| {
            cluster.slot_owner(cluster.keyslot(&format!("rl:{key}")), master) == master
        })
    };
    let allowed: Vec<String> = mine("user").take(12).collect();
    // Keys the user may not touch, and a key it may read but not write
    // (which the batch reads before it writes anything).
    let refused: Vec<String> = mine("other").take(2).chain(mine("read").take(1)).collect();
    // Loads the slot map and the script, which a first call does.
    assert!(
        limiter
            .decide(&quota, &allowed[0], 1)
            .await
            .unwrap()
            .allowed
    );
    let reset_stats = || async {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut cluster.nodes[master].connection().await)
            .await
            .unwrap();
    };
    reset_stats().await;
    // One refused key first.
    let keys: Vec<&String> = refused[..1]
        .iter()
        .chain(&allowed[1..])
        .chain(&refused[1..])
        .collect();
    let decisions =
        futures::future::join_all(keys.iter().map(|k| limiter.decide(&quota, k, 1))).await;
    for (key, decision) in keys.iter().zip(decisions) {
        let stored = cluster.holds(master, &format!("rl:{key}"));
        if key.starts_with("user:") {
            let decision = decision.unwrap_or_else(|e| panic!("{key}: {e}"));
            assert!(decision.allowed, "{key}: {decision:?}");
            assert!(stored, "{key} written");
        } else {
            let error = decision.expect_err(key);
            assert_eq!(
                fault(&error),
                Some(ratelimit::ErrorKind::Permission),
                "{key}: {error}"
            );
            assert!(!stored, "{key} written by a user that may not");
        }
    }
    // The batch ran on the module (a refused key's own call is refused
    // before it runs, and counted apart).
    if module {
        assert!(
            cluster.nodes[master]
                .command_calls(&["ratelimit.decide"])
                .await
                > 0,
            "the batch went elsewhere"
        );
    }
    // A refused key says nothing of the path: the next call takes the same
    // one (the module, or the function rather than EVALSHA).
    reset_stats().await;
    assert!(limiter.decide(&quota, &allowed[0], 1).await.is_ok());
    let expected = if module { "ratelimit.decide" } else { "fcall" };
    for command in ["ratelimit.decide", "fcall", "evalsha"] {
        assert_eq!(
            cluster.nodes[master].command_calls(&[command]).await,
            u64::from(command == expected),
            "{command} calls after a refused key"
        );
    }
}

// Current-thread, so both decisions go as one batch, while their slot is
// marked as moving but its keys are still on the old master: the first key
// is absent there (a call naming it is redirected with `ASK`), the second
// is spent there, and must be decided there, denied, not anew on the new
// master.
on_both_paths!(current_thread: a_batch_is_decided_where_each_of_its_keys_lives_while_their_slot_moves);
async fn a_batch_is_decided_where_each_of_its_keys_lives_while_their_slot_moves(module: bool) {
    let cluster = start(3, 0, module);
    let limiter = uncached(&cluster, Duration::from_secs(2));
    let quota = Quota::new(1, "1/h".parse().unwrap()).unwrap();
    let (absent, spent) = ("{moving}:absent", "{moving}:spent");
    assert!(limiter.decide(&quota, spent, 1).await.unwrap().allowed);
    let slot = cluster.keyslot(&format!("rl:{spent}"));
    let masters = cluster.masters();
    let from = cluster.slot_owner(slot, masters[0]);
    let to = *masters.iter().find(|&&m| m != from).unwrap();
    cluster.start_moving_slot(slot, from, to);
    let (first, second) = tokio::join!(
        limiter.decide(&quota, absent, 1),
        limiter.decide(&quota, spent, 1)
    );
    assert!(first.unwrap().allowed, "{absent}, new, is admitted");
    assert!(
        !second.unwrap().allowed,
        "{spent}, spent on its master, is admitted anew elsewhere"
    );
    // The master the slot moves to answers for it only after ASKING.
    let importing = |key: &str| -> bool {
        let mut connection = cluster.nodes[to].client().get_connection().unwrap();
        let (exists,): (bool,) = redis::pipe()
            .cmd("ASKING")
            .ignore()
            .cmd("EXISTS")
            .arg(format!("rl:{key}"))
            .query(&mut connection)
            .unwrap();
        exists
    };
    assert!(cluster.holds(from, &format!("rl:{spent}")));
    assert!(
        !importing(spent),
        "{spent} written on the master its slot moves to"
    );
    assert!(importing(absent), "{absent} decided where it was asked to");
}

/// Keys batched with a key whose slot moves to a master that does not
/// answer are decided without waiting for it: only the moved key waits.
// Current-thread: the decisions below are queued before the batching task
// runs, so they go in one batch.
#[tokio::test]
async fn keys_batched_with_a_moved_key_do_not_wait_for_its_master() {
    let cluster = start(3, 0, false);
    let limiter = uncached(&cluster, Duration::from_secs(3));
    let quota = Quota::new(1, "1/h".parse().unwrap()).unwrap();
    let moving = "{moving}:absent";
    let slot = cluster.keyslot(&format!("rl:{moving}"));
    let masters = cluster.masters();
    let from = cluster.slot_owner(slot, masters[0]);
    let to = *masters.iter().find(|&&m| m != from).unwrap();
    let mut staying =
        keys_on(&cluster, from, "user").filter(|key| cluster.keyslot(&format!("rl:{key}")) != slot);
    let (warm, staying): (String, Vec<String>) =
        (staying.next().unwrap(), staying.take(2).collect());
    assert!(limiter.decide(&quota, &warm, 1).await.unwrap().allowed);
    cluster.start_moving_slot(slot, from, to);
    // The moved key is sent where `ASK` says, to a master that answers
    // nothing for a while (up to the limiter's timeout of 3 s).
    cluster.nodes[to].freeze();
    let answered = |key: &String| {
        let limiter = &limiter;
        let quota = &quota;
        let key = key.clone();
        async move {
            let decided =
                tokio::time::timeout(Duration::from_secs(1), limiter.decide(quota, &key, 1)).await;
            let decided = decided.unwrap_or_else(|_| panic!("{key} waited for the moved key"));
            assert!(decided.unwrap().allowed, "{key}");
        }
    };
    let (_, _, _) = tokio::join!(
        limiter.decide(&quota, moving, 1),
        answered(&staying[0]),
        answered(&staying[1]),
    );
    cluster.nodes[to].thaw();
}

/// A cluster where one master unloads the native module while a limiter
/// decides through it (an operator rolling the module back, one node at a
/// time), and a limiter started after: every key, on every master, is
/// decided exactly (two admitted, then denied), and none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_where_one_master_lacks_the_module_decides_every_key_exactly() {
    let cluster = start(3, 0, true);
    let quota = Quota::new(2, "1/min".parse().unwrap()).unwrap();
    let before = limiter(&cluster, FailurePolicy::Closed);
    for i in 0..30 {
        before
            .decide(&quota, &format!("warm:{i}"), 1)
            .await
            .unwrap();
    }
    served_by(&cluster, true).await;
    let without = cluster.masters()[1];
    let mut node = cluster.nodes[without].connection().await;
    let _: () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("ratelimit")
        .query_async(&mut node)
        .await
        .unwrap();
    let after = limiter(&cluster, FailurePolicy::Closed);
    for (name, limiter) in [("before", &before), ("after", &after)] {
        for i in 0..150 {
            let key = format!("{name}:{i}");
            admits_twice_then_denies(limiter, &quota, &key).await;
        }
    }
    every_master_holds_over_50_keys(&cluster);
    assert!(
        cluster.nodes[without].script_calls().await > 0,
        "the master without the module decided nothing through the function"
    );
}

on_both_paths!(multi_thread: a_cluster_down_that_serves_reads_writes_nothing_and_reports_the_fault);
/// A cluster that is down (a master with no replica died, and every slot
/// must be served) but still answers reads (`cluster-allow-reads-when-down`):
/// the masters left write nothing, and the limiter reports the fault, never
/// a denial by the quota nor an admission by Redis. On the module, whose
/// check of each key is a write for that reason, as on the function.
async fn a_cluster_down_that_serves_reads_writes_nothing_and_reports_the_fault(module: bool) {
    let mut cluster = start_with(
        3,
        0,
        module,
        &[
            "--cluster-require-full-coverage",
            "yes",
            "--cluster-allow-reads-when-down",
            "yes",
        ],
    );
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_millis(500))
        .deny_cache_max_keys(0)
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    // Keys that last an hour a token, so none expires during the test.
    let quota = Quota::new(10, "1/h".parse().unwrap()).unwrap();
    let keys: Vec<String> = (0..40).map(|i| format!("down:{i}")).collect();
    for key in &keys {
        limiter
            .check(Request::new(&quota, key))
            .await
            .unwrap_or_else(|d| panic!("{key} before the fault: {d:?}"));
    }
    let masters = cluster.masters();
    let victim = masters[0];
    let survivors: Vec<usize> = masters[1..].to_vec();
    cluster.nodes[victim].kill();
    // Until the masters left know the cluster is down.
    tokio::task::block_in_place(|| cluster.wait_until_down(Duration::from_secs(30)));
    // Reads are served: a key on a master left reads as it was.
    let survivor = cluster.nodes[survivors[0]].client();
    let mut connection = survivor.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(pong, "PONG");
    let held: Vec<i64> = survivors.iter().map(|&i| cluster.dbsize(i)).collect();
    let values_before = holdings(&cluster, &survivors).await;
    // Checks of one key, sent together so that each master's batch names
    // several keys (a call that names no key to Redis, which Redis runs
    // whatever the cluster's state: the module's check of each key is what
    // refuses it), then all-or-nothing checks of two keys.
    let singles = futures::future::join_all(
        keys.iter()
            .map(|key| limiter.check([Request::new(&quota, key)])),
    )
    .await;
    let mut pairs = Vec::new();
    for key in &keys {
        pairs.push(
            limiter
                .check([
                    Request::new(&quota, key),
                    Request::new(&quota, "down:other"),
                ])
                .await,
        );
    }
    let mut kinds = std::collections::BTreeSet::new();
    for (key, outcome) in keys
        .iter()
        .chain(&keys)
        .zip(singles.into_iter().chain(pairs))
    {
        match outcome {
            Ok(admitted) => panic!("{key}: admitted while the cluster is down: {admitted:?}"),
            Err(denied) => {
                let kind = fault(&denied).unwrap_or_else(|| {
                    panic!("{key}: denied as if by the quota while the cluster is down: {denied:?}")
                });
                kinds.insert(kind.as_str());
            }
        }
    }
    eprintln!("a cluster down: the faults reported were {kinds:?}");
    assert_eq!(
        survivors
            .iter()
            .map(|&i| cluster.dbsize(i))
            .collect::<Vec<_>>(),
        held,
        "keys were created while the cluster was down"
    );
    assert_eq!(
        holdings(&cluster, &survivors).await,
        values_before,
        "values were written while the cluster was down"
    );
}

/// Every key, value and expiry on the masters `which`.
async fn holdings(
    cluster: &RedisCluster,
    which: &[usize],
) -> Vec<std::collections::BTreeMap<String, (String, i64)>> {
    let mut held = Vec::new();
    for &i in which {
        held.push(cluster.nodes[i].holdings().await);
    }
    held
}

on_both_paths!(multi_thread: every_replica_holds_what_its_master_wrote);
async fn every_replica_holds_what_its_master_wrote(module: bool) {
    let cluster = start(3, 1, module);
    let limiter = uncached(&cluster, Duration::from_secs(2));
    let quotas = [
        Quota::new(3, "1/min".parse().unwrap()).unwrap(),
        Quota::gcra(3, "1/min".parse().unwrap()).unwrap(),
        Quota::fixed_window(3, Duration::from_secs(60)).unwrap(),
        Quota::sliding_log(3, Duration::from_secs(60)).unwrap(),
        Quota::sliding_window(3, Duration::from_secs(60)).unwrap(),
        Quota::leaky_bucket(3, "1/min".parse().unwrap()).unwrap(),
    ];
    // Synced first, so that every write reaches a replica as a command.
    let masters = cluster.masters();
    for (index, node) in cluster.nodes.iter().enumerate() {
        if !masters.contains(&index) {
            node.wait_until_synced().await;
        }
    }
    // Concurrent checks: each master's batch names keys of many slots, and
    // its writes reach its replica together. A third are refunded.
    for _ in 0..2 {
        let checks = (0..600).map(|i| {
            let (limiter, quota, key) = (&limiter, &quotas[i % quotas.len()], format!("copy:{i}"));
            async move {
                let request = Request::new(quota, &key).on_error(FailurePolicy::Closed);
                let admitted = limiter
                    .check(request)
                    .await
                    .unwrap_or_else(|e| panic!("{key}: {e:?}"));
                if i % 3 == 0 {
                    limiter.refund(admitted).await.unwrap();
                }
            }
        });
        futures::future::join_all(checks).await;
    }
    let (mut on_masters, mut on_replicas) = (BTreeMap::new(), BTreeMap::new());
    for (index, node) in cluster.nodes.iter().enumerate() {
        if masters.contains(&index) {
            node.wait_for_replicas().await;
        }
    }
    for (index, node) in cluster.nodes.iter().enumerate() {
        let held = node.holdings().await;
        if masters.contains(&index) {
            on_masters.extend(held);
        } else {
            on_replicas.extend(held);
            let scripts = node.command_calls(&["eval"]).await;
            assert!(
                !module || scripts > 0,
                "replica {index}: no call's writes came as one script"
            );
        }
    }
    // The same keys, values and expiries (the master sends the instant).
    // A refunded bucket may be full again within moments, its key about to
    // expire (and so gone from the reading made later): such keys are left
    // out.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let lasting = |held: &BTreeMap<String, (String, i64)>| -> BTreeMap<String, (String, i64)> {
        held.iter()
            .filter(|(_, (_, expires))| *expires > now_ms + 1_000)
            .map(|(key, held)| (key.clone(), held.clone()))
            .collect()
    };
    let (lasting_on_masters, lasting_on_replicas) = (lasting(&on_masters), lasting(&on_replicas));
    assert!(
        lasting_on_masters.len() > 250,
        "{} keys",
        lasting_on_masters.len()
    );
    let missing: Vec<_> = lasting_on_masters
        .keys()
        .filter(|k| !on_replicas.contains_key(*k))
        .collect();
    let extra: Vec<_> = lasting_on_replicas
        .keys()
        .filter(|k| !on_masters.contains_key(*k))
        .collect();
    assert!(missing.is_empty(), "not on a replica: {missing:?}");
    assert!(
        extra.is_empty(),
        "on a replica, not on its master: {extra:?}"
    );
    for (key, (value, expires)) in &lasting_on_masters {
        let (replica_value, replica_expires) = &on_replicas[key];
        assert_eq!(value, replica_value, "{key}");
        assert!(
            (expires - replica_expires).abs() <= 50,
            "{key} expires at {expires} on its master, at {replica_expires} on its replica"
        );
    }
    served_by(&cluster, module).await;
}

/// Callers that arrive together at a cluster whose nodes never answer
/// (frozen before the limiter's first decision) wait about one timeout, not
/// one per caller ahead of them: the attempt to connect that ended while
/// they waited answers them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_queued_behind_a_slot_map_read_of_frozen_nodes_wait_one_timeout() {
    let cluster = RedisCluster::start(3, 0);
    let timeout = Duration::from_millis(100);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(timeout)
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    cluster.nodes.iter().for_each(|node| node.freeze());
    let started = Instant::now();
    let calls = (0..30).map(|i| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let quota = Quota::per_second(100).unwrap();
            let key = format!("queued:{i}");
            let denied = limiter.check(Request::new(&quota, &key)).await.err();
            denied
        })
    });
    let answers = futures::future::join_all(calls).await;
    let took = started.elapsed();
    cluster.nodes.iter().for_each(|node| node.thaw());
    for answer in answers {
        let denied = answer.unwrap().expect("a frozen cluster admitted a call");
        assert!(fault(&denied).is_some(), "{denied:?}");
    }
    assert!(
        took < 2 * timeout + Duration::from_secs(1),
        "30 callers took {took:?} to be answered, with a timeout of {timeout:?}"
    );
}

/// While every node of a cluster is down, calls refused by the masters'
/// open breakers do not drive the cluster client: each call it cannot send
/// has it reconnect to every node (and log that, through `log`, at WARN and
/// ERROR), so only the breakers' probes and the slot map's reads may reach
/// it, and the reads come at most about once a second while they fail,
/// logging their failure as often at most. Before, the probes were sent
/// again until their timeout and the reads came every 100 ms: the client
/// began reconnecting about 50 times a second under 8 callers.
#[tokio::test]
async fn a_cluster_with_every_node_down_is_not_reconnected_to_at_each_call() {
    let mut cluster = RedisCluster::start(3, 0);
    // A probe a second per master.
    let mut breaker = BreakerConfig::default();
    breaker.initial_backoff = Duration::from_secs(1);
    breaker.max_backoff = Duration::from_secs(1);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_millis(100))
        .breaker(breaker)
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    limiter.check(Request::new(&quota, "warm")).await.unwrap();
    let ports: Vec<u16> = cluster.nodes.iter().map(|node| node.port()).collect();
    cluster.nodes.iter_mut().for_each(|node| node.kill());
    // The dead nodes' ports count the client's attempts to connect, each
    // closed at once, as a node that is down would refuse it.
    let attempts = Arc::new(AtomicU64::new(0));
    let mut listeners = Vec::new();
    for port in ports {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let attempts = attempts.clone();
        listeners.push(tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                attempts.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        }));
    }
    // The breakers open within the first calls; counted from then on.
    let secs = 4;
    let ((), logs) = support::logged(async {
        let warmup = Instant::now() + Duration::from_millis(500);
        let end = warmup + Duration::from_secs(secs);
        let callers = (0..8).map(|caller| {
            let (limiter, quota, attempts) = (limiter.clone(), quota, attempts.clone());
            tokio::spawn(async move {
                let mut counted = false;
                for n in 0.. {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    if now >= warmup && !std::mem::replace(&mut counted, true) && caller == 0 {
                        attempts.store(0, Ordering::Relaxed);
                    }
                    let key = format!("down:{caller}:{n}");
                    let answer = limiter.check(Request::new(&quota, &key)).await;
                    assert!(
                        answer.is_err(),
                        "a cluster with every node down admitted a call"
                    );
                    tokio::task::yield_now().await;
                }
            })
        });
        for caller in futures::future::join_all(callers).await {
            caller.unwrap();
        }
    })
    .await;
    let attempts = attempts.load(Ordering::Relaxed);
    listeners.iter().for_each(tokio::task::JoinHandle::abort);
    // Each probe (3 a second) and each read of the slot map (1 a second)
    // may have the client try every node (3) twice; and the client tries
    // again by itself about once a second.
    let most = 3 * (3 * 2 + 2 + 1) * secs;
    assert!(
        attempts <= most,
        "the cluster client tried to connect {attempts} times in {secs} s with every node down \
         (at most {most} expected: the breakers' probes and the slot map's reads)"
    );
    let warnings = logs
        .lines()
        .filter(|line| line.contains("could not read the Redis Cluster slot map"))
        .count() as u64;
    assert!(
        warnings <= secs + 2,
        "the slot map's failed reads were logged {warnings} times in {secs} s:\n{logs}"
    );
}

/// The cluster connection runs on the runtime of the first call that needs
/// it: once that runtime has shut down, the next call connects again on its
/// own. Outside any runtime, a call is an error saying so, never a panic.
#[test]
fn a_cluster_limiter_outlives_the_runtime_of_its_first_decision() {
    let cluster = start(3, 0, false);
    let limiter = uncached(&cluster, Duration::from_secs(2));
    let quota = Quota::per_hour(100).unwrap();
    let outside = futures::executor::block_on(limiter.inspect(&quota, "outside", 1));
    match outside {
        Err(error @ ratelimit::Error::NoRuntime { .. }) => {
            assert!(error.to_string().contains("Tokio runtime"), "{error}")
        }
        other => panic!("a decision outside a runtime: {other:?}"),
    }
    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let decisions = runtime.block_on(async {
            let mut decisions = Vec::new();
            // Keys over every master: each master's batching lane too.
            for user in 0..10 {
                let key = format!("user:{user}");
                decisions.push(limiter.decide(&quota, &key, 1).await);
            }
            decisions
        });
        for (user, decision) in decisions.into_iter().enumerate() {
            let decision = decision.unwrap_or_else(|e| panic!("runtime {round}, user {user}: {e}"));
            assert_eq!(
                decision.remaining,
                99 - round,
                "runtime {round}, user {user}"
            );
        }
        drop(runtime);
    }
}

// A master frozen (its connections open, nothing answered, as behind a
// network partition) is failed over: its replica decides its keys once it
// is promoted, though the frozen master never says it is not a master any
// more (no `MOVED` comes from it), and the new master's breaker does not
// stay open for the frozen one's timeouts.
on_both_paths!(multi_thread: a_frozen_master_failed_over_is_left_for_its_replica);
async fn a_frozen_master_failed_over_is_left_for_its_replica(module: bool) {
    let cluster = start(3, 1, module);
    let limiter = uncached(&cluster, Duration::from_millis(300));
    let quota = Quota::per_hour(1_000).unwrap();
    let victim = cluster.masters()[0];
    let keys: Vec<String> = keys_on(&cluster, victim, "frozen").take(3).collect();
    for key in &keys {
        assert!(limiter.decide(&quota, key, 1).await.unwrap().allowed);
    }
    let masters_before = cluster.masters();
    cluster.nodes[victim].freeze();
    // The replica is promoted after the node timeout (1 s): a node that was
    // a replica says it is a master.
    let started = Instant::now();
    tokio::task::block_in_place(|| loop {
        let promoted = (0..cluster.nodes.len())
            .filter(|n| *n != victim && !masters_before.contains(n))
            .any(|n| {
                redis::cmd("ROLE")
                    .query::<redis::Value>(&mut cluster.nodes[n].client().get_connection().unwrap())
                    .is_ok_and(|role| format!("{role:?}").contains("master"))
            });
        if promoted {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no failover");
        std::thread::sleep(Duration::from_millis(20));
    });
    let promoted = Instant::now();
    for key in &keys {
        loop {
            match limiter.decide(&quota, key, 1).await {
                Ok(decision) => {
                    assert!(decision.allowed, "{decision:?}");
                    break;
                }
                // Within a few of the limiter's timeouts: its calls to the
                // frozen master open its breaker, whose refusals have the
                // slot map read again (left to the map's periodic read, it
                // took eight seconds).
                Err(error) => assert!(
                    promoted.elapsed() < Duration::from_secs(6),
                    "{key} still not decided {:?} after the failover: {error:?}",
                    promoted.elapsed()
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    cluster.nodes[victim].thaw();
}

/// While the cluster is down, a decision is refused unrun (`CLUSTERDOWN`)
/// and sent again until its timeout; once its caller has gone (and the
/// failure policy answered it), it is sent no more: sent once the cluster
/// is back, it would take a token nobody was told of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_whose_caller_left_while_the_cluster_was_down_takes_nothing() {
    let mut cluster = start_with(3, 0, false, &["--cluster-require-full-coverage", "yes"]);
    let limiter = uncached(&cluster, Duration::from_secs(6));
    let quota = Quota::per_hour(10).unwrap();
    let masters = cluster.masters();
    let key = keys_on(&cluster, masters[0], "down").next().unwrap();
    assert!(limiter.decide(&quota, &key, 1).await.unwrap().allowed);
    cluster.nodes[masters[1]].kill();
    tokio::task::block_in_place(|| cluster.wait_until_down(Duration::from_secs(30)));
    let left =
        tokio::time::timeout(Duration::from_millis(200), limiter.decide(&quota, &key, 1)).await;
    assert!(
        left.is_err(),
        "decided while the cluster was down: {left:?}"
    );
    tokio::task::block_in_place(|| {
        cluster.nodes[masters[1]].restart();
        cluster.wait_until_ok(Duration::from_secs(30));
    });
    // Past the timeout of the decision its caller left.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let remaining = limiter.inspect(&quota, &key, 0).await.unwrap().remaining;
    assert_eq!(remaining, 9, "only the first decision took a token");
}

/// A master that lost the library (restarted, or `FUNCTION FLUSH`) gets it
/// loaded again while another master does not answer: the load goes to the
/// master that lacks it, not to every master, where the frozen one would
/// fail it and with it every decision of the healthy one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_lost_the_library_gets_it_while_another_is_frozen() {
    let cluster = start(3, 0, false);
    let limiter = uncached(&cluster, Duration::from_millis(300));
    let quota = Quota::per_hour(1_000).unwrap();
    let masters = cluster.masters();
    let (flushed, frozen) = (masters[0], masters[1]);
    let keys: Vec<String> = keys_on(&cluster, flushed, "flushed").take(3).collect();
    for key in &keys {
        assert!(limiter.decide(&quota, key, 1).await.unwrap().allowed);
    }
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut cluster.nodes[flushed].connection().await)
        .await
        .unwrap();
    cluster.nodes[frozen].freeze();
    for key in &keys {
        let decided = limiter.decide(&quota, key, 1).await;
        assert!(
            decided.as_ref().is_ok_and(|d| d.allowed),
            "{key}: {decided:?}"
        );
    }
    cluster.nodes[frozen].thaw();
    assert!(
        cluster.nodes[flushed]
            .command_calls(&["function|load"])
            .await
            >= 1,
        "loaded again where it was flushed"
    );
}

/// A master whose breaker opened and which then stopped being a master (it
/// died, and its replica took over) leaves no open circuit in the metrics:
/// the limiter no longer calls it, and an alert on the gauge would fire
/// while nothing is wrong.
// Current-thread: the metrics recorder below is this thread's.
#[tokio::test]
async fn a_master_gone_from_the_slot_map_leaves_no_open_circuit_in_the_metrics() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let exposition = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut cluster = start(3, 1, false);
    // No probe until the test is over: the breaker is open when the slot
    // map next read leaves its master out.
    let mut breaker = ratelimit::BreakerConfig::default();
    breaker.initial_backoff = Duration::from_secs(120);
    breaker.max_backoff = Duration::from_secs(120);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_millis(500))
        .deny_cache_max_keys(0)
        .breaker(breaker)
        .build()
        .unwrap();
    let quota = Quota::per_hour(100).unwrap();
    let victim = cluster.masters()[0];
    let key = keys_on(&cluster, victim, "user").next().unwrap();
    let gauge = format!(
        "ratelimit_circuit_state{{backend=\"redis-cluster\",node=\"127.0.0.1:{}\"}}",
        cluster.nodes[victim].port()
    );
    let other = (0..)
        .map(|i| format!("other:{i}"))
        .find(|key| cluster.slot_owner(cluster.keyslot(&format!("rl:{key}")), victim) != victim)
        .unwrap();
    assert!(limiter.decide(&quota, &key, 1).await.unwrap().allowed);
    cluster.nodes[victim].kill();
    let started = Instant::now();
    loop {
        let outcome = limiter.decide(&quota, &key, 1).await;
        if matches!(&outcome, Err(d) if fault(d) == Some(ratelimit::ErrorKind::CircuitOpen)) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{outcome:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let shown = |exposition: &str| {
        exposition
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{gauge} ")).map(str::to_owned))
    };
    assert_eq!(shown(&exposition.render()).as_deref(), Some("1"), "open");
    cluster.wait_until_ok(Duration::from_secs(30));
    // The slot map is read again at its age (10 s), at the next decision.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(limiter.decide(&quota, &other, 1).await.unwrap().allowed);
    assert!(
        limiter.decide(&quota, &key, 1).await.unwrap().allowed,
        "the replica that took over decides"
    );
    assert_eq!(
        shown(&exposition.render()).as_deref(),
        Some("0"),
        "the gone master's circuit, in:\n{}",
        exposition.render()
    );
}

/// Each backend call on a cluster is counted once, under the backend name
/// the limiter gives (`redis-cluster`), as on one Redis: a failed call is
/// one backend error, and a call an open breaker skips is none. Each was
/// counted twice, under `redis-cluster` and `cluster`, and a skipped call
/// once, as a `circuit_open` error.
// Current-thread: the metrics recorder below is this thread's.
#[tokio::test]
async fn a_failed_call_on_a_cluster_is_counted_once_under_one_backend_name() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let exposition = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut cluster = start(3, 0, false);
    let limiter = uncached(&cluster, Duration::from_millis(300));
    let quota = Quota::per_hour(100).unwrap();
    let victim = cluster.masters()[0];
    let key = keys_on(&cluster, victim, "user").next().unwrap();
    assert!(limiter.decide(&quota, &key, 1).await.unwrap().allowed);
    cluster.nodes[victim].kill();
    let (mut failed, mut skipped) = (0, 0);
    for _ in 0..8 {
        match limiter.decide(&quota, &key, 1).await {
            Err(denied) if fault(&denied) == Some(ratelimit::ErrorKind::CircuitOpen) => {
                skipped += 1
            }
            Err(_) => failed += 1,
            Ok(decision) => panic!("decided by a killed master: {decision:?}"),
        }
    }
    assert!(
        failed > 0 && skipped > 0,
        "{failed} failed, {skipped} skipped"
    );
    let text = exposition.render();
    let errors: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("ratelimit_backend_errors_total{"))
        .collect();
    let counted: f64 = errors
        .iter()
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        errors
            .iter()
            .all(|line| line.contains("backend=\"redis-cluster\"")
                && !line.contains("kind=\"circuit_open\"")),
        "{errors:#?}"
    );
    assert_eq!(
        counted, failed as f64,
        "{failed} failed calls ({skipped} skipped) counted as: {errors:#?}"
    );
    assert!(
        !text.contains("backend=\"cluster\""),
        "a second backend name:\n{text}"
    );
}

/// A check across slots consumes its dimensions one after another: one
/// dropped between two (its caller gave up while a master did not answer)
/// gives back what the earlier ones took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_across_slots_dropped_midway_gives_back_what_it_took() {
    let cluster = start(3, 0, false);
    let limiter = uncached(&cluster, Duration::from_millis(500));
    let quota = Quota::per_hour(1).unwrap();
    let masters = cluster.masters();
    let on = |master: usize, prefix: &str| keys_on(&cluster, master, prefix).next().unwrap();
    let (first, second) = (on(masters[0], "first"), on(masters[1], "second"));
    // Both masters known, and their lanes running.
    for key in ["warm:a", "warm:b", "warm:c"] {
        limiter.decide(&quota, key, 1).await.unwrap();
    }
    cluster.nodes[masters[1]].freeze();
    let check = [Request::new(&quota, &first), Request::new(&quota, &second)];
    let dropped = tokio::time::timeout(Duration::from_millis(200), limiter.check(&check[..])).await;
    cluster.nodes[masters[1]].thaw();
    assert!(dropped.is_err(), "the check ended before it was dropped");
    let started = Instant::now();
    loop {
        let left = limiter.inspect(&quota, &first, 0).await.unwrap().remaining;
        if left == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{first} kept the token a dropped check took"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A check across slots gives back an earlier dimension when a later one
/// denies: what the bucket still holds of it then, not its whole cost,
/// which would hand back tokens that refilled since and that others took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_across_slots_gives_back_only_what_a_bucket_still_holds() {
    use ratelimit::{ManualClock, Rate};
    let cluster = start(3, 0, false);
    let start_at = 1_800_000_000_000_000;
    let clock = ManualClock::new(start_at);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_secs(5))
        .deny_cache_max_keys(0)
        .clock(clock.clone())
        .build()
        .unwrap();
    let bucket = Quota::new(2, Rate::per_second(1).unwrap()).unwrap();
    let spent = Quota::per_hour(1).unwrap();
    let masters = cluster.masters();
    let first = keys_on(&cluster, masters[0], "holds").next().unwrap();
    let second = keys_on(&cluster, masters[1], "spent").next().unwrap();
    assert!(limiter.decide(&spent, &second, 1).await.unwrap().allowed);
    cluster.nodes[masters[1]].freeze();
    let check = {
        let (limiter, first, second) = (limiter.clone(), first.clone(), second.clone());
        tokio::spawn(async move {
            limiter
                .check([Request::new(&bucket, &first), Request::new(&spent, &second)])
                .await
                .map(|_| ())
        })
    };
    // The first dimension is taken: a token of a full bucket, whole again
    // a second later, when another caller takes both tokens.
    let started = Instant::now();
    while limiter.inspect(&bucket, &first, 0).await.unwrap().remaining != 1 {
        assert!(started.elapsed() < Duration::from_secs(3), "not taken");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    clock.advance(Duration::from_secs(1));
    assert!(limiter.decide(&bucket, &first, 2).await.unwrap().allowed);
    cluster.nodes[masters[1]].thaw();
    let denied = check.await.unwrap().unwrap_err();
    assert_eq!(denied.key, second);
    assert_eq!(
        limiter.inspect(&bucket, &first, 0).await.unwrap().remaining,
        0,
        "the refilled token was given back again"
    );
}

/// A reset follows its key where the slot went: moved to another master
/// since the client last read the slot map, or moving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_follows_its_key_to_where_its_slot_moved() {
    let cluster = start(3, 0, false);
    let limiter = uncached(&cluster, Duration::from_secs(2));
    let quota = Quota::per_hour(1).unwrap();
    let masters = cluster.masters();
    let (moved, moving) = ("{moved}:k", "{moving}:k");
    for key in [moved, moving] {
        assert!(limiter.decide(&quota, key, 1).await.unwrap().allowed);
        assert!(!limiter.decide(&quota, key, 1).await.unwrap().allowed);
    }
    let slot_of = |key: &str| cluster.keyslot(&format!("rl:{key}"));
    let owner = |key: &str| cluster.slot_owner(slot_of(key), masters[0]);
    let elsewhere = |from: usize| *masters.iter().find(|&&m| m != from).unwrap();
    let (from, to) = (owner(moved), elsewhere(owner(moved)));
    tokio::task::block_in_place(|| cluster.move_slot(slot_of(moved), from, to, Duration::ZERO));
    limiter.reset(moved).await.unwrap();
    assert!(
        limiter.decide(&quota, moved, 1).await.unwrap().allowed,
        "{moved} whole again"
    );
    // Half moved: the key already on the master the slot goes to.
    let (from, to) = (owner(moving), elsewhere(owner(moving)));
    cluster.start_moving_slot(slot_of(moving), from, to);
    let _: redis::Value = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(cluster.nodes[to].port())
        .arg(format!("rl:{moving}"))
        .arg(0)
        .arg(5000)
        .query_async(&mut cluster.nodes[from].connection().await)
        .await
        .unwrap();
    limiter.reset(moving).await.unwrap();
    let mut connection = cluster.nodes[to].connection().await;
    let (held,): (bool,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(format!("rl:{moving}"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(!held, "{moving} deleted where it moved");
}

// A scale-out: a master added with no slot, and the first slot moving to
// it. The cluster client keeps no connection to a master that serves no
// slot, which `ASK` names for the keys already there (or absent).
on_both_paths!(multi_thread: a_slot_moving_to_a_master_added_since_is_decided_there);
async fn a_slot_moving_to_a_master_added_since_is_decided_there(module: bool) {
    let mut cluster = start(3, 0, module);
    let limiter = uncached(&cluster, Duration::from_millis(500));
    let quota = Quota::new(1, "1/h".parse().unwrap()).unwrap();
    let (absent, spent) = ("{moving}:absent", "{moving}:spent");
    assert!(limiter.decide(&quota, spent, 1).await.unwrap().allowed);
    let module_path = native_module();
    let extra: Vec<&str> = if module {
        vec![
            "--loadmodule",
            module_path.to_str().unwrap(),
            "--enable-module-command",
            "yes",
        ]
    } else {
        Vec::new()
    };
    let added = tokio::task::block_in_place(|| cluster.add_empty_master(&extra));
    let slot = cluster.keyslot(&format!("rl:{spent}"));
    let from = cluster.slot_owner(slot, cluster.masters()[0]);
    cluster.start_moving_slot(slot, from, added);
    let (first, second) = tokio::join!(
        limiter.decide(&quota, absent, 1),
        limiter.decide(&quota, spent, 1)
    );
    let first = first.unwrap_or_else(|e| panic!("{absent}: {e}"));
    assert!(
        first.allowed,
        "{absent}, new, is admitted where its slot goes"
    );
    let second = second.unwrap_or_else(|e| panic!("{spent}: {e}"));
    assert!(
        !second.allowed,
        "{spent}, spent on its master, is admitted anew"
    );
    let mut connection = cluster.nodes[added].connection().await;
    let (held,): (bool,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(format!("rl:{absent}"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(held, "{absent} written on the master its slot moves to");
    // Each such key goes there on the limiter's own connection: the cluster
    // client, asked to reach a master it keeps no connection to, would
    // make anew its connections to every node at each of them.
    let unrelated = *cluster
        .masters()
        .iter()
        .find(|&&m| m != from && m != added)
        .unwrap();
    let connections_made = || async {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut cluster.nodes[unrelated].connection().await)
            .await
            .unwrap();
        info.lines()
            .find_map(|line| line.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap()
    };
    let before = connections_made().await;
    for i in 0..10 {
        let key = format!("{{moving}}:absent:{i}");
        let decided = limiter.decide(&quota, &key, 1).await;
        assert!(decided.unwrap_or_else(|e| panic!("{key}: {e}")).allowed);
    }
    // One for each count read above.
    assert!(
        connections_made().await - before <= 2,
        "the cluster client connected to another master again"
    );
    // A reset finds it there too.
    limiter.reset(absent).await.unwrap();
    let (held,): (bool,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("EXISTS")
        .arg(format!("rl:{absent}"))
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(!held, "{absent} deleted on the master its slot moves to");
}

/// The limiter's timeout bounds a check, not each call it makes: a check
/// across three masters, each slow but answering within the timeout, fails
/// at the timeout rather than at the sum of the waits, and what its first
/// dimension took is given back.
async fn a_check_across_slow_masters_ends_at_its_timeout(module: bool) {
    let cluster = start(3, 0, module);
    let timeout = Duration::from_secs(1);
    let limiter = uncached(&cluster, timeout);
    let quota = Quota::per_hour(5).unwrap();
    let masters = cluster.masters();
    let keys: Vec<String> = masters
        .iter()
        .map(|&master| keys_on(&cluster, master, "slow").next().unwrap())
        .collect();
    for key in &keys {
        // The slot map read and the library loaded on every master.
        assert_eq!(limiter.inspect(&quota, key, 0).await.unwrap().remaining, 5);
    }
    for &master in &masters {
        cluster.nodes[master].freeze();
    }
    let started = Instant::now();
    let check = {
        let (limiter, keys) = (limiter.clone(), keys.clone());
        tokio::spawn(async move {
            let requests: Vec<Request> = keys
                .iter()
                .map(|key| Request::new(&quota, key).on_error(FailurePolicy::Closed))
                .collect();
            let outcome = limiter.check(&requests[..]).await.map(|_| ());
            (outcome, started.elapsed())
        })
    };
    // Each master answers 600 ms after the one before: each dimension
    // within the timeout (with 400 ms to spare), the three of them nearly
    // twice over it.
    for &master in &masters {
        tokio::time::sleep(Duration::from_millis(600)).await;
        cluster.nodes[master].thaw();
    }
    let (outcome, took) = check.await.unwrap();
    let Err(denied) = outcome else {
        panic!("a check across slow masters admitted after {took:?}");
    };
    assert_eq!(
        fault(&denied),
        Some(ratelimit::ErrorKind::Timeout),
        "{denied:?} after {took:?}"
    );
    assert!(
        took < Duration::from_millis(1_500),
        "the check took {took:?} against a timeout of {timeout:?}"
    );
    // The first dimension's token comes back; the last was never asked.
    let given_back = Instant::now();
    while limiter
        .inspect(&quota, &keys[0], 0)
        .await
        .unwrap()
        .remaining
        != 5
    {
        assert!(
            given_back.elapsed() < Duration::from_secs(3),
            "the first dimension's token was not given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        limiter
            .inspect(&quota, &keys[2], 0)
            .await
            .unwrap()
            .remaining,
        5
    );
}

on_both_paths!(multi_thread: a_check_across_slow_masters_ends_at_its_timeout);

/// The rule source on a Redis Cluster: pointed at any node, it reads the
/// hash on the master of its slot and follows the messages (which reach
/// every node); a rule published or removed through any node reaches every
/// instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_sources_on_any_node_of_a_cluster_follow_the_rules() {
    use ratelimit::RedisRuleSource;
    let cluster = start(3, 0, false);
    let urls: Vec<String> = cluster
        .masters()
        .iter()
        .map(|&m| cluster.nodes[m].url())
        .collect();
    let instances: Vec<(Limiter, RedisRuleSource)> = urls
        .iter()
        .map(|url| {
            let limiter = Limiter::memory();
            let source = RedisRuleSource::builder(url.clone())
                .start(&limiter)
                .unwrap();
            (limiter, source)
        })
        .collect();
    for (i, (_, source)) in instances.iter().enumerate() {
        support::read_rules(
            source,
            Duration::from_secs(5),
            &format!("the source on {} never read the rules", urls[i]),
        )
        .await;
    }
    let capacity_everywhere = |capacity: Option<u64>| {
        let instances = &instances;
        async move {
            let started = Instant::now();
            while instances.iter().any(|(limiter, _)| {
                limiter.rules().get("checkout").map(|q| q.capacity()) != capacity
            }) {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "not every instance has checkout at {capacity:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    for url in &urls {
        RedisRuleSource::publish(url, "checkout", "capacity=7 rate=1/s")
            .await
            .unwrap_or_else(|e| panic!("publish through {url}: {e}"));
    }
    capacity_everywhere(Some(7)).await;
    assert!(RedisRuleSource::remove(&urls[1], "checkout").await.unwrap());
    capacity_everywhere(None).await;
}

/// A master that does not answer, met as the second dimension of checks
/// across slots, opens its breaker as it would alone: later checks fail at
/// once rather than each waiting out the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_master_behind_a_first_dimension_opens_its_breaker() {
    let cluster = start(3, 0, false);
    // A timeout far longer than a loaded machine's delays, so a check that
    // fails well within it failed at once, on the open breaker.
    let timeout = Duration::from_secs(2);
    let limiter = uncached(&cluster, timeout);
    let quota = Quota::per_hour(1_000).unwrap();
    let masters = cluster.masters();
    let first = keys_on(&cluster, masters[0], "open").next().unwrap();
    let second = keys_on(&cluster, masters[1], "open").next().unwrap();
    for key in [&first, &second] {
        assert!(limiter.decide(&quota, key, 1).await.unwrap().allowed);
    }
    cluster.nodes[masters[1]].freeze();
    let mut faults = Vec::new();
    for _ in 0..8 {
        let check = [
            Request::new(&quota, &first).on_error(FailurePolicy::Closed),
            Request::new(&quota, &second).on_error(FailurePolicy::Closed),
        ];
        let started = Instant::now();
        let denied = limiter.check(&check[..]).await.map(|_| ()).unwrap_err();
        faults.push((fault(&denied), started.elapsed()));
        if fault(&denied) == Some(ratelimit::ErrorKind::CircuitOpen) {
            break;
        }
    }
    cluster.nodes[masters[1]].thaw();
    let (last, took) = *faults.last().unwrap();
    assert_eq!(
        last,
        Some(ratelimit::ErrorKind::CircuitOpen),
        "the breaker never opened: {faults:?}"
    );
    assert!(took < timeout / 2, "{faults:?}");
}

/// A check across slots that fails after its first dimension was admitted
/// gives that back; while the first dimension's master fails too, every such
/// give-back fails, and is logged at most once a second (as the failure
/// policy's warning is), not once per check.
// Current-thread: the log capture is this thread's.
#[tokio::test]
async fn failed_give_backs_of_checks_across_slots_are_logged_at_most_once_a_second() {
    let cluster = start(3, 0, false);
    let timeout = Duration::from_millis(300);
    let limiter = uncached(&cluster, timeout);
    let quota = Quota::per_hour(1_000).unwrap();
    let masters = cluster.masters();
    let firsts: Vec<String> = keys_on(&cluster, masters[0], "give").take(20).collect();
    let second = keys_on(&cluster, masters[1], "give").next().unwrap();
    for key in firsts.iter().chain([&second]) {
        assert!(limiter.decide(&quota, key, 1).await.unwrap().allowed);
    }
    let ((), logs) = support::logged(async {
        // The second dimension's master does not answer: each check's
        // second dimension times out, and its first is given back...
        cluster.nodes[masters[1]].freeze();
        let checks = firsts.iter().map(|first| {
            let limiter = limiter.clone();
            let check = [
                Request::new(&quota, first).on_error(FailurePolicy::Closed),
                Request::new(&quota, &second).on_error(FailurePolicy::Closed),
            ];
            async move { limiter.check(&check[..]).await.map(|_| ()) }
        });
        let checks = futures::future::join_all(checks);
        // ... to the first dimension's master, frozen once it has admitted
        // them.
        let freeze_first = async {
            tokio::time::sleep(timeout / 3).await;
            cluster.nodes[masters[0]].freeze();
        };
        let (answers, ()) = tokio::join!(checks, freeze_first);
        for answer in answers {
            assert!(answer.is_err(), "a check admitted by a frozen master");
        }
        // The give-backs, on tasks of their own, end at their timeout.
        tokio::time::sleep(2 * timeout).await;
    })
    .await;
    cluster.nodes[masters[0]].thaw();
    cluster.nodes[masters[1]].thaw();
    let warnings = logs
        .lines()
        .filter(|line| line.contains("could not give back a multi-dimension check's tokens"))
        .count();
    assert!(
        (1..=2).contains(&warnings),
        "20 failed give-backs within a second were logged {warnings} times:\n{logs}"
    );
}

/// A refund of a check across three masters, one of which does not answer,
/// gives the other two their tokens back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_across_masters_is_not_held_up_by_a_frozen_one() {
    let cluster = start(3, 0, false);
    let limiter = uncached(&cluster, Duration::from_millis(200));
    let quota = Quota::per_hour(3).unwrap();
    let masters = cluster.masters();
    let keys: Vec<String> = masters
        .iter()
        .map(|&master| keys_on(&cluster, master, "refund").next().unwrap())
        .collect();
    let requests: Vec<Request> = keys.iter().map(|key| Request::new(&quota, key)).collect();
    let admitted = limiter.check(&requests[..]).await.unwrap();
    cluster.nodes[masters[0]].freeze();
    let refunded = limiter.refund(admitted).await;
    cluster.nodes[masters[0]].thaw();
    assert!(refunded.is_err(), "the frozen master's refund did not fail");
    for key in &keys[1..] {
        assert_eq!(
            limiter.inspect(&quota, key, 0).await.unwrap().remaining,
            3,
            "{key} did not get its token back"
        );
    }
}

/// A user allowed only what following rules takes (`HGET`, `HGETALL`,
/// `SUBSCRIBE`) finds the rules hash on a cluster from any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_only_user_follows_the_rules_from_any_node() {
    use ratelimit::RedisRuleSource;
    let cluster = start(3, 0, false);
    for &node in &cluster.masters() {
        let mut admin = cluster.nodes[node].connection().await;
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "rules",
                "on",
                ">pw-rules",
                "resetkeys",
                "~ratelimit:rules",
                "resetchannels",
                "&ratelimit:rules:changed",
                "-@all",
                "+hget",
                "+hgetall",
                "+subscribe",
            ])
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    RedisRuleSource::publish(&cluster.urls()[0], "checkout", "capacity=7 rate=1/s")
        .await
        .unwrap();
    for &node in &cluster.masters() {
        let url = format!(
            "redis://rules:pw-rules@127.0.0.1:{}",
            cluster.nodes[node].port()
        );
        let limiter = Limiter::memory();
        let source = RedisRuleSource::builder(url).start(&limiter).unwrap();
        support::read_rules(
            &source,
            Duration::from_secs(5),
            &format!("the source on node {node} never read the rules"),
        )
        .await;
        assert_eq!(
            limiter.rules().get("checkout").map(|q| q.capacity()),
            Some(7)
        );
    }
}

/// A cluster that names no endpoints in its slot map
/// (`cluster-preferred-endpoint-type unknown-endpoint`: a null where the
/// address is) means "the host you reached me at": the limiter reads the
/// map, answers `ping`, and sends each master its batch, as redis-rs's own
/// client does. (The whole map was refused: `ping` failed with an unexpected
/// reply, and every decision went alone under one breaker for the whole
/// cluster.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_map_that_names_no_endpoints_is_read_as_the_seed_host() {
    let cluster = start(3, 0, false);
    let quota = Quota::new(1, "1/min".parse().unwrap()).unwrap();
    let master = cluster.masters()[0];
    // (`hostname` with no hostname set answers `?`, which redis-rs's
    // cluster client cannot reach.)
    let endpoint = "unknown-endpoint";
    for node in cluster.masters() {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-preferred-endpoint-type")
            .arg(endpoint)
            .query_async(&mut cluster.nodes[node].connection().await)
            .await
            .unwrap();
    }
    let limiter = uncached(&cluster, Duration::from_millis(500));
    limiter
        .ping()
        .await
        .unwrap_or_else(|e| panic!("{endpoint}: {e}"));
    let keys: Vec<String> = keys_on(&cluster, master, "unnamed").take(20).collect();
    limiter.decide(&quota, &keys[0], 1).await.unwrap();
    reset_masters_stats(&cluster).await;
    let decisions =
        futures::future::join_all(keys[1..].iter().map(|k| limiter.decide(&quota, k, 1))).await;
    for (key, decision) in keys[1..].iter().zip(decisions) {
        let decision = decision.unwrap_or_else(|e| panic!("{endpoint} {key}: {e}"));
        assert!(decision.allowed, "{endpoint} {key}: {decision:?}");
    }
    let made = cluster.nodes[master]
        .command_calls(&["fcall", "evalsha"])
        .await;
    assert!(
        made < 19,
        "{endpoint}: {made} script calls for 19 decisions on one master, none batched"
    );
}

/// A check across masters denied by its last dimension gives back what the
/// others took all at once: a master frozen after its dimension admitted
/// does not hold back the others' give-back. (They went one after another,
/// each waiting for the one before it up to the timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_check_gives_back_on_every_master_at_once() {
    let cluster = start(3, 0, false);
    let limiter = Arc::new(uncached(&cluster, Duration::from_secs(3)));
    let quota: &'static Quota = Box::leak(Box::new(Quota::per_hour(3).unwrap()));
    let masters = cluster.masters();
    let keys: Vec<&'static str> = masters
        .iter()
        .map(|&master| &*keys_on(&cluster, master, "given").next().unwrap().leak())
        .collect();
    // The third dimension denies.
    limiter
        .check(Request::new(quota, keys[2]).cost(3))
        .await
        .unwrap();
    cluster.nodes[masters[2]].freeze();
    let check = tokio::spawn({
        let (limiter, keys) = (limiter.clone(), keys.clone());
        async move {
            let requests: Vec<Request<'static>> =
                keys.iter().map(|key| Request::new(quota, key)).collect();
            limiter.check(&requests[..]).await.map(|_| ())
        }
    });
    // The first two admitted, the third on its way: the first's master
    // freezes, and the denial comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.nodes[masters[0]].freeze();
    cluster.nodes[masters[2]].thaw();
    let started = Instant::now();
    let back = loop {
        let left = limiter.inspect(quota, keys[1], 0).await.unwrap().remaining;
        if left == 3 || started.elapsed() > Duration::from_secs(5) {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cluster.nodes[masters[0]].thaw();
    assert!(check.await.unwrap().is_err(), "the third dimension denies");
    assert!(
        back < Duration::from_secs(1),
        "the second dimension's token came back {back:?} after the denial, behind the frozen \
         master's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_nodes_closed_while_idle_are_made_again_before_the_next_call() {
    // What a node does to idle clients under `timeout` in redis.conf, and
    // an operator's `CLIENT KILL`: the next calls are decided, not failed.
    let cluster = RedisCluster::start(3, 0);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::Closed)
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    let mut nodes = Vec::new();
    for url in cluster.urls() {
        let client = redis::Client::open(url.as_str()).unwrap();
        nodes.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    for round in 0..3 {
        let keys: Vec<String> = (0..32).map(|i| format!("warm:{round}:{i}")).collect();
        let warm = futures::future::join_all(
            keys.iter()
                .map(|key| limiter.check(Request::new(&quota, key))),
        )
        .await;
        assert!(warm.iter().all(Result::is_ok), "round {round}: {warm:?}");
        let mut killed = Vec::new();
        for node in &mut nodes {
            killed.push(support::kill_other_clients(node).await);
        }
        assert!(killed.iter().sum::<usize>() > 0, "round {round}");
        // Made again by themselves (up to 2 s in all); with none made, the
        // calls below are the first to learn of the close.
        let deadline = Instant::now() + Duration::from_secs(2);
        for (node, killed) in nodes.iter_mut().zip(&killed) {
            support::await_other_clients(node, *killed, deadline).await;
        }
        let failed = support::failed_checks(&limiter, &quota, &format!("after:{round}"), 16).await;
        assert!(failed.is_empty(), "round {round}: {failed:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_nodes_refuse_resp3_is_served_over_resp2() {
    // `HELLO` renamed away: every node refuses the `HELLO 3` a RESP3
    // connection starts with.
    let cluster = RedisCluster::start_with(3, 0, &["--rename-command", "HELLO", ""]);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    limiter.ping().await.unwrap();
    let quota = Quota::per_hour(2).unwrap();
    for key in ["a", "b", "c", "d"] {
        admits_twice_then_denies(&limiter, &quota, key).await;
    }
}
