use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = "order", capacity = 10, rate = 2)]
struct Order;

fn main() {}
