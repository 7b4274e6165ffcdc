use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = "order:submit:<user>", capacity = 10, rate = 2)]
async fn submit_order(user_id: u64, item: String) -> Result<String, AppError> {
    Ok(format!("{item} for {user_id}"))
}

fn main() {}
