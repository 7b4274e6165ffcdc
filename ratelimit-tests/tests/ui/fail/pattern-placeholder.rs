use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = "pair:<a>", capacity = 10, rate = 2)]
async fn submit_pair((a, b): (u64, u64)) -> Result<u64, AppError> {
    Ok(a + b)
}

fn main() {}
