use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

const CAPACITY: u64 = 10;

#[rate_limit(key = "order:<user_id>", capacity = CAPACITY, rate = 2)]
async fn submit_order(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

fn main() {}
