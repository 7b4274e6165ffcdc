use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

#[rate_limit(key = "order:<user_id>", capacity = 10, rate = 2, refund_on = err)]
#[rate_limit(key = "orders", capacity = 100, rate = 20)]
async fn submit(user_id: u64) -> Result<(), AppError> {
    let _ = user_id;
    Ok(())
}

fn main() {}
