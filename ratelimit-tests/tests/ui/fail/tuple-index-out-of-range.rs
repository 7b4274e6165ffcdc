use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

// Too large for a tuple index: reported at the key, not a panic.
#[rate_limit(key = "pair:<pair.99999999999>", capacity = 10, rate = 2)]
async fn large(pair: (u64, u64)) -> Result<u64, AppError> {
    Ok(pair.0)
}

// `.00` is not `.0`.
#[rate_limit(key = "pair:<pair.00>", capacity = 10, rate = 2)]
async fn leading_zeros(pair: (u64, u64)) -> Result<u64, AppError> {
    Ok(pair.0)
}

fn main() {}
