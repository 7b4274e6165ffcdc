use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = "order:<user_id>", capacity = 10, rate = 2, cost = qty)]
async fn submit_order(user_id: u64, qty: i32) -> Result<i32, AppError> {
    Ok(user_id as i32 * qty)
}

fn main() {}
