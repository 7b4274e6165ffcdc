use ratelimit::{rate_limit, Quota, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

fn tier_quota(user_id: &u64) -> Quota {
    Quota::per_minute(if *user_id < 100 { 100 } else { 10 }).unwrap()
}

#[rate_limit(key = "order:<user_id>", quota = tier_quota(&user_id), capacity = 10)]
async fn submit_order(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

fn main() {}
