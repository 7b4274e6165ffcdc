use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

// `#[tokio::main]` expands first and makes `main` a plain `fn`.
#[tokio::main]
#[rate_limit(key = "main", capacity = 10, rate = 2)]
async fn main() -> Result<(), AppError> {
    Ok(())
}
