use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

struct User {
    role: &'static str,
}

#[rate_limit(key = "order:<user.role>", capacity = 10, rate = 2, exempt = user.role)]
async fn submit_order(user: User) -> Result<(), AppError> {
    let _ = user;
    Ok(())
}

fn main() {}
