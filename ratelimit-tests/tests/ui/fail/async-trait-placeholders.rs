// Placeholders of a method of an `#[async_trait]` impl name the parameters
// as written, though async-trait renames those bound by a pattern.
use async_trait::async_trait;
use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[async_trait]
trait Store {
    async fn put(&self, key: u64, value: Vec<u8>) -> Result<(), AppError>;
    async fn sum(&self, pair: (u64, u64)) -> Result<u64, AppError>;
}

struct Bucket;

#[async_trait]
impl Store for Bucket {
    #[rate_limit(key = "put:<keys>", capacity = 10, rate = 2)]
    async fn put(&self, key: u64, value: Vec<u8>) -> Result<(), AppError> {
        let _ = (key, value);
        Ok(())
    }

    #[rate_limit(key = "sum:<a>", capacity = 10, rate = 2)]
    async fn sum(&self, (a, b): (u64, u64)) -> Result<u64, AppError> {
        Ok(a + b)
    }
}

fn main() {}
