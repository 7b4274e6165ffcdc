//! The operator's view on every backend: `Limiter::inspect` (the decision a
//! call would get, consuming nothing) and `Limiter::reset` (a key's whole
//! quota back), with the deny cache and leases kept consistent.

mod support;

use std::time::Duration;

use ratelimit::{Limiter, Quota, Request};
use support::{RedisCluster, RedisServer};

fn quotas() -> Vec<Quota> {
    let rate = "1/h".parse().unwrap();
    let hour = Duration::from_secs(3600);
    vec![
        Quota::token_bucket(3, rate).unwrap(),
        Quota::gcra(3, rate).unwrap(),
        Quota::leaky_bucket(3, rate).unwrap(),
        Quota::fixed_window(3, hour).unwrap(),
        Quota::sliding_log(3, hour).unwrap(),
        Quota::sliding_window(3, hour).unwrap(),
    ]
}

async fn inspect_and_reset(limiter: &Limiter, name: &str) {
    for quota in quotas() {
        let key = format!("op:{}", quota.algorithm());
        let context = format!("{name}, {quota}");
        let fresh = limiter.inspect(&quota, &key, 1).await.unwrap();
        assert!(
            fresh.allowed && fresh.remaining == 2,
            "{context}: {fresh:?}"
        );
        // Inspecting writes nothing, however often.
        for _ in 0..5 {
            limiter.inspect(&quota, &key, 1).await.unwrap();
        }
        for i in 0..3 {
            limiter
                .check(Request::new(&quota, &key).rule("op").lease(2))
                .await
                .unwrap_or_else(|d| panic!("{context}: call {i}: {d}"));
        }
        // Denied, and the denial is now in the deny cache.
        assert!(
            limiter.check(Request::new(&quota, &key)).await.is_err(),
            "{context}"
        );
        let spent = limiter.inspect(&quota, &key, 1).await.unwrap();
        assert!(!spent.allowed, "{context}: {spent:?}");
        assert_eq!(spent.remaining, 0, "{context}");
        assert!(spent.retry_after > Duration::ZERO, "{context}");

        limiter.reset(&key).await.unwrap();
        let back = limiter.inspect(&quota, &key, 1).await.unwrap();
        assert!(
            back.allowed && back.remaining == 2,
            "{context}: after reset {back:?}"
        );
        // Neither the cached denial nor a lease outlives the reset.
        for i in 0..3 {
            limiter
                .check(Request::new(&quota, &key))
                .await
                .unwrap_or_else(|d| panic!("{context}: after reset, call {i}: {d}"));
        }
        assert!(
            limiter.check(Request::new(&quota, &key)).await.is_err(),
            "{context}"
        );
        let never = limiter.inspect(&quota, &key, 4).await.unwrap();
        assert!(
            !never.allowed && never.retry_after == Duration::MAX,
            "{context}: a cost above the capacity is never admitted: {never:?}"
        );
    }
}

#[tokio::test]
async fn inspect_and_reset_on_the_memory_backend() {
    inspect_and_reset(&Limiter::memory(), "memory").await;
}

#[tokio::test]
async fn inspect_and_reset_on_redis() {
    let server = RedisServer::start();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    inspect_and_reset(&limiter, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_reset_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    inspect_and_reset(&limiter, "cluster").await;
}
