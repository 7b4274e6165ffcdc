// Every algorithm, with its options; the leaky bucket paces the body.
use ratelimit::{rate_limit, Limiter, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

#[rate_limit(key = "tb:<id>", algorithm = token_bucket, capacity = 2, rate = "1/min", lease = 2, limiter = l)]
async fn token_bucket(l: &Limiter, id: u8) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "gcra:<id>", algorithm = gcra, capacity = 2, rate = 0.5, limiter = l)]
async fn gcra(l: &Limiter, id: u8) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "lb:<id>", algorithm = leaky_bucket, capacity = 2, rate = "100/s", limiter = l)]
async fn leaky_bucket(l: &Limiter, id: u8) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "fw:<id>", algorithm = fixed_window, limit = 2, window = "1h", limiter = l)]
async fn fixed_window(l: &Limiter, id: u8) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "sl:<id>", algorithm = sliding_log, limit = 2, window = "1d", limiter = l)]
async fn sliding_log(l: &Limiter, id: u8) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "sw:<id>", algorithm = sliding_window, limit = 2, window = "10m", cost = 2, limiter = l)]
async fn sliding_window(l: &Limiter, id: u8) -> Result<(), Limited> {
    Ok(())
}

#[tokio::main]
async fn main() {
    let l = Limiter::memory();
    for id in 0..3 {
        assert!(token_bucket(&l, id).await.is_ok());
        assert!(gcra(&l, id).await.is_ok());
        assert!(leaky_bucket(&l, id).await.is_ok());
        assert!(fixed_window(&l, id).await.is_ok());
        assert!(sliding_log(&l, id).await.is_ok());
        assert!(sliding_window(&l, id).await.is_ok());
    }
    assert!(token_bucket(&l, 0).await.is_ok());
    assert!(token_bucket(&l, 0).await.is_err());
    assert!(sliding_window(&l, 0).await.is_err(), "cost 2 spent the limit of 2");
    let Err(Limited(denied)) = fixed_window(&l, 0).await.and(fixed_window(&l, 0).await) else {
        panic!("a third call in the hour");
    };
    assert_eq!(denied.limit, 2);
}
