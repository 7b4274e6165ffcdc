use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

fn tier_capacity(user_id: &u64) -> u64 {
    if *user_id < 100 {
        100
    } else {
        10
    }
}

#[rate_limit(key = "order:<user_id>", quota = tier_capacity(&user_id))]
async fn submit_order(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

fn main() {}
