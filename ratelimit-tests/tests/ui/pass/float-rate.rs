// `rate = 2.5` is 2.5 tokens per second, exactly: 25 every 10 s.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

#[rate_limit(key = "float", capacity = 1, rate = 2.5)]
async fn float() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "half", capacity = 1, rate = 0.5)]
async fn half() -> Result<(), Limited> {
    Ok(())
}

#[tokio::main]
async fn main() {
    assert!(float().await.is_ok());
    let denied = float().await.unwrap_err().0;
    assert!(
        denied.retry_after <= std::time::Duration::from_millis(400),
        "one token every 400 ms, not {:?}",
        denied.retry_after
    );
    assert!(half().await.is_ok());
    let denied = half().await.unwrap_err().0;
    assert!(
        denied.retry_after > std::time::Duration::from_millis(1500),
        "{:?}",
        denied.retry_after
    );
}
