//! A service that sets `REDIS_URL` and forgets `ratelimit::install`: the
//! attribute decides on that Redis, never silently in process memory.
//! (A binary of its own: the global limiter is set once per process.)

mod support;

use ratelimit::{rate_limit, RateLimited};
use support::RedisServer;

#[rate_limit(key = "forgotten:<user>", capacity = 1, rate = "1/h")]
async fn call(user: u64) -> Result<u64, RateLimited> {
    Ok(user)
}

#[tokio::test]
async fn without_install_the_attribute_uses_the_redis_the_environment_names() {
    let server = RedisServer::start();
    // The environment's limiter has the default timeout (100 ms), and a
    // call it times out is admitted without a write. Load the function
    // library with a patient limiter and connect the global one first, so
    // that its calls are a round trip each.
    let patient = ratelimit::Limiter::builder()
        .redis(server.url())
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap();
    let warm = ratelimit::Quota::per_second(1).unwrap();
    patient.inspect(&warm, "warm-up", 1).await.unwrap();
    std::env::set_var("REDIS_URL", server.url());
    ratelimit::global().ping().await.unwrap();
    assert_eq!(call(7).await.unwrap(), 7);
    assert!(call(7).await.is_err(), "the quota of one is spent");
    assert_eq!(ratelimit::global().backend_name(), "redis");
    let mut connection = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("rl:*forgotten*")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert!(!keys.is_empty(), "the decision was written to Redis");
}
