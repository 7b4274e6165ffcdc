use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

trait Orders {
    #[rate_limit(key = "order:<user_id>", capacity = 10, rate = 2)]
    async fn submit_order(&self, user_id: u64) -> Result<(), AppError>;
}

fn main() {}
