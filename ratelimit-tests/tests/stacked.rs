//! Several `#[rate_limit]` on one function, combined with the other
//! features: the same key template twice, each attribute's own failure
//! policy, and the deny cache in front of an all-or-nothing check.

mod support;

use support::Decide;

use std::time::Duration;

use ratelimit::{rate_limit, DenialCause, FailurePolicy, Limiter, Quota, RateLimited, Request};
use support::RedisServer;

/// The common pair: a burst limit and a sustained limit on one template.
#[rate_limit(key = "api:<user>", capacity = 10, rate = "10/min", limiter = limiter)]
#[rate_limit(key = "api:<user>", algorithm = fixed_window, limit = 1000, window = "1h", limiter = limiter)]
async fn api(limiter: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_burst_and_a_sustained_limit_on_one_template_keep_state_of_their_own() {
    let server = RedisServer::start();
    let redis = Limiter::builder().redis(server.url()).build().unwrap();
    for limiter in [Limiter::memory(), redis] {
        for i in 0..10 {
            api(&limiter, 7)
                .await
                .unwrap_or_else(|e| panic!("{}: call {i}: {e}", limiter.backend_name()));
        }
        let denied = api(&limiter, 7).await.unwrap_err();
        assert_eq!(denied.cause, DenialCause::Quota, "{denied:?}");
        assert_eq!(denied.key, "api:7", "denials report the key as built");
        assert!(denied.retry_after <= Duration::from_secs(6), "{denied:?}");
        // Both limits hold state: the sustained window counted every call.
        let hourly = Quota::fixed_window(1000, Duration::from_secs(3600)).unwrap();
        let sustained = limiter.decide(&hourly, "api:7~2", 0).await.unwrap();
        assert_eq!(sustained.remaining, 990, "{}", limiter.backend_name());
    }
}

#[rate_limit(key = "pay:<user>", capacity = 5, rate = "1/s", on_error = closed, limiter = limiter)]
#[rate_limit(key = "pay:all", capacity = 100, rate = "100/s", limiter = limiter)]
async fn pay(limiter: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn each_stacked_attribute_keeps_its_own_failure_policy() {
    let mut server = RedisServer::start();
    // The limiter fails open; the per-user attribute says closed.
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(100))
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap();
    pay(&limiter, 1).await.unwrap();
    server.kill();
    let denied = pay(&limiter, 1).await.unwrap_err();
    assert!(
        matches!(denied.cause, DenialCause::BackendUnavailable { .. }),
        "the closed attribute must fail closed when stacked: {denied:?}"
    );
    assert_eq!(denied.key, "pay:1");
}

#[tokio::test]
async fn an_all_or_nothing_check_on_a_spent_dimension_is_answered_by_the_deny_cache() {
    let server = RedisServer::start();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let user = Quota::new(2, "1/min".parse().unwrap()).unwrap();
    let global = Quota::new(1_000, "1/h".parse().unwrap()).unwrap();
    let check = [
        Request::new(&user, "user:1"),
        Request::new(&global, "global"),
    ];
    limiter.check(&check[..]).await.unwrap();
    limiter.check(&check[..]).await.unwrap();
    let first = limiter.check(&check[..]).await.unwrap_err();
    assert_eq!(first.key, "user:1");
    let calls = server.script_calls().await;
    for _ in 0..100 {
        let denied = limiter.check(&check[..]).await.unwrap_err();
        assert_eq!(denied.key, "user:1");
        assert!(denied.retry_after <= first.retry_after);
    }
    assert_eq!(
        server.script_calls().await,
        calls,
        "denials of a spent dimension reached Redis"
    );
    // The global dimension was never consumed by the denied checks.
    let seen = limiter.decide(&global, "global", 0).await.unwrap();
    assert_eq!(seen.remaining, 998);
}

/// A cost no dimension's capacity can hold is named after that dimension:
/// its key and its rule, not the first dimension's.
#[tokio::test]
async fn a_cost_above_one_dimensions_capacity_names_that_dimension() {
    let limiter = ratelimit::Limiter::memory();
    let (roomy, small) = (
        ratelimit::Quota::per_minute(100).unwrap(),
        ratelimit::Quota::per_minute(3).unwrap(),
    );
    let denied = limiter
        .check([
            ratelimit::Request::new(&roomy, "user:7")
                .cost(5)
                .rule("user"),
            ratelimit::Request::new(&small, "ip:1").cost(5).rule("ip"),
        ])
        .await
        .unwrap_err();
    assert_eq!((denied.key.as_ref(), denied.rule), ("ip:1", Some("ip")));
    assert_eq!(
        denied.cause,
        ratelimit::DenialCause::CostExceedsCapacity { cost: 5 }
    );
    assert_eq!(denied.retry_after, std::time::Duration::MAX);
}
