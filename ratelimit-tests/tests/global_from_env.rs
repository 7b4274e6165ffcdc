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

/// A service with no tracing subscriber whose `REDIS_URL` names a Redis that
/// refuses it (a password is required, none given): each call fails open,
/// and standard error says why, rather than nothing at all while no call is
/// limited. Run in a process of its own (this test starts itself again),
/// whose global limiter and subscriber are its own.
#[test]
fn a_misconfigured_environment_is_told_on_standard_error_without_a_subscriber() {
    const CHILD: &str = "RATELIMIT_TEST_MISCONFIGURED_URL";
    if let Ok(url) = std::env::var(CHILD) {
        std::env::set_var("REDIS_URL", url);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        for user in 0..3 {
            let answer = runtime.block_on(call(user));
            eprintln!("call {user}: {answer:?}");
        }
        return;
    }
    let server = RedisServer::start();
    let mut connection = server.client().get_connection().unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query::<()>(&mut connection)
        .unwrap();
    let name = "a_misconfigured_environment_is_told_on_standard_error_without_a_subscriber";
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, server.url())
        .output()
        .expect("run this test again in a process of its own");
    let stderr = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "{stderr}");
    assert!(
        stderr.contains("call 0: Ok(0)"),
        "the call failed open: {stderr}"
    );
    assert!(
        stderr.contains("ratelimit: the redis backend refuses this limiter's configuration")
            && stderr.contains("authentication"),
        "standard error names the misconfiguration: {stderr}"
    );
    assert!(!stderr.contains("s3cret"), "{stderr}");
}
