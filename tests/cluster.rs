//! The Redis Cluster backend against a private cluster of 3 masters and 3
//! replicas on loopback.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit::{Dimension, FailurePolicy, Limiter, Quota};
use support::RedisCluster;

fn limiter(cluster: &RedisCluster, policy: FailurePolicy) -> Limiter {
    Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_millis(500))
        .failure_policy(policy)
        .build()
        .unwrap()
}

/// One cluster for the whole binary's tests would couple them; each test
/// builds its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_every_master_and_every_algorithm_decides() {
    let cluster = RedisCluster::start(3, 1);
    let limiter = limiter(&cluster, FailurePolicy::Closed);
    let quotas = [
        Quota::new(2, "1/min".parse().unwrap()).unwrap(),
        Quota::gcra(2, "1/min".parse().unwrap()).unwrap(),
        Quota::fixed_window(2, Duration::from_secs(60)).unwrap(),
        Quota::sliding_log(2, Duration::from_secs(60)).unwrap(),
        Quota::sliding_window(2, Duration::from_secs(60)).unwrap(),
        Quota::leaky_bucket(2, "1/min".parse().unwrap()).unwrap(),
    ];
    for i in 0..300 {
        let quota = &quotas[i % quotas.len()];
        let key = format!("user:{i}");
        for expected in [true, true, false] {
            let d = limiter
                .decide(quota, &key, 1)
                .await
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(d.allowed, expected, "{key} {quota:?}: {d:?}");
        }
    }
    for master in cluster.masters() {
        assert!(
            cluster.dbsize(master) > 50,
            "master {master} holds {} keys",
            cluster.dbsize(master)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_holds_within_a_slot_and_across_slots() {
    let cluster = RedisCluster::start(3, 1);
    let limiter = limiter(&cluster, FailurePolicy::Closed);
    let per_user = Quota::new(10, "10/min".parse().unwrap()).unwrap();
    let per_ip = Quota::sliding_log(1, Duration::from_secs(60)).unwrap();
    // A common hash tag: one slot, one script call.
    let tagged = |ip: &'static str| {
        [
            Dimension::new(&per_user, "{u7}:user"),
            Dimension::new(&per_ip, ip),
        ]
    };
    limiter.check_all(&tagged("{u7}:ip:a")).await.unwrap();
    let denied = limiter.check_all(&tagged("{u7}:ip:a")).await.unwrap_err();
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
            Dimension::new(&per_user, "user:8"),
            Dimension::new(&global, "global"),
            Dimension::new(&per_ip, ip),
        ]
    };
    limiter.check_all(&spread("ip:b")).await.unwrap();
    let denied = limiter.check_all(&spread("ip:b")).await.unwrap_err();
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_fails_over_and_limiting_continues() {
    let mut cluster = RedisCluster::start(3, 1);
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
                    let decision = limiter
                        .acquire(&quota, &format!("k:{t}:{}", i % 50), 1)
                        .await
                        .unwrap();
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_across_slots_removes_exactly_its_own_sliding_log_admissions() {
    use ratelimit::ManualClock;
    use redis::AsyncCommands as _;
    let cluster = RedisCluster::start(3, 0);
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
            .check_all(&[
                Dimension::new(&log, log_key),
                Dimension::new(&spent, window_key),
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
}
