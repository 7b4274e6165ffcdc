use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = "partner", algorithm = leaky_bucket, capacity = 20, rate = 5, lease = 10)]
async fn call_partner() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
