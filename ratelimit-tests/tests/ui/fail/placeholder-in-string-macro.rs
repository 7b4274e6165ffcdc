use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

// Only a string literal is a template: here `<user_id>` would be text, the
// same for every call.
#[rate_limit(key = concat!("order:", "<user_id>"), capacity = 10, rate = 2)]
async fn concatenated(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

#[rate_limit(key = format!("order:<user_id>"), capacity = 10, rate = 2)]
async fn formatted(user_id: u64) -> Result<u64, AppError> {
    Ok(user_id)
}

fn main() {}
