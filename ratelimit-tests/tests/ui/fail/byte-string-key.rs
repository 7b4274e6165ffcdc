use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = b"order:<user_id>", capacity = 10, rate = 2)]
async fn submit_order(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

fn main() {}
