use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

// `~gcra` would be the key of another algorithm's state of `order:<user_id>`.
#[rate_limit(key = "order:<user_id>~gcra", capacity = 10, rate = 2)]
async fn submit_order(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

fn main() {}
