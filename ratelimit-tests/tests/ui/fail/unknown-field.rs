use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = "order:<user.name>", capacity = 10, rate = 2)]
async fn submit_order(user: (u64, String)) -> Result<u64, AppError> {
    Ok(user.0)
}

fn main() {}
