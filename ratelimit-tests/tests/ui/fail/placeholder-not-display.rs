use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

struct User {
    id: u64,
}

#[rate_limit(key = "order:<user>", capacity = 10, rate = 2)]
async fn submit_order(user: User) -> Result<u64, AppError> {
    Ok(user.id)
}

fn main() {}
