//! `#[rate_limit]` end to end against a private redis-server, including the
//! global limiter installed with `ratelimit::install`.

mod support;

use support::Decide;

use std::time::Duration;

use ratelimit::{rate_limit, Limiter, RateLimited};
use redis::AsyncCommands;
use support::RedisServer;

#[rate_limit(key = "order:submit:<user_id>", capacity = 3, rate = "1/min")]
async fn submit_order(user_id: u64, note: &str) -> Result<String, RateLimited> {
    Ok(format!("{user_id}: {note}"))
}

/// One test in this binary: the global limiter is process-wide.
#[tokio::test]
async fn the_installed_redis_limiter_serves_the_attribute_across_instances() {
    let server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    ratelimit::install(limiter).unwrap();
    assert!(
        matches!(
            ratelimit::install(Limiter::memory()),
            Err(ratelimit::Error::AlreadyInstalled)
        ),
        "a second install must be refused"
    );

    for i in 0..3 {
        submit_order(42, &format!("order {i}")).await.unwrap();
    }
    let denied = submit_order(42, "one too many").await.unwrap_err();
    assert_eq!(denied.key, "order:submit:42");
    assert!(
        denied.retry_after > Duration::from_secs(50)
            && denied.retry_after <= Duration::from_secs(60),
        "one token comes back a minute after the first call (less the calls' own time): {:?}",
        denied.retry_after
    );

    // The state is in Redis, where another instance sees it.
    let mut redis = server.connection().await;
    let pttl: i64 = redis.pttl("rl:order:submit:42").await.unwrap();
    assert!(
        (170_000..=180_000).contains(&pttl),
        "PTTL {pttl}: full again in 3 min"
    );
    // A timeout long enough for Redis's own answer (this instance's first
    // call also loads the function library), not a fail-open guess.
    let other_instance = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let quota = ratelimit::Quota::new(3, "1/min".parse().unwrap()).unwrap();
    let seen = other_instance
        .decide(&quota, "order:submit:42", 0)
        .await
        .unwrap();
    assert_eq!(seen.remaining, 0, "another instance sees the spent quota");
    assert!(submit_order(43, "other user").await.is_ok());
}
