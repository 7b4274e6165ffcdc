use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

// Leases never taken: not above the call's cost, and on the sliding log.
#[rate_limit(key = "upload", capacity = 20, rate = 5, cost = 4, lease = 4)]
async fn upload() -> Result<(), AppError> {
    Ok(())
}

#[rate_limit(key = "log", algorithm = sliding_log, limit = 20, window = "1s", lease = 10)]
async fn logged() -> Result<(), AppError> {
    Ok(())
}

fn main() {}
