use rl::{rate_limit, RateLimited};

#[derive(Debug)]
enum AppError {
    Limited(RateLimited),
}

impl From<RateLimited> for AppError {
    fn from(denied: RateLimited) -> Self {
        AppError::Limited(denied)
    }
}

#[rate_limit(key = "hello:<user>", capacity = 2, rate = 1)]
async fn hello(user: u64) -> Result<String, AppError> {
    Ok(format!("hello, user {user}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    for _ in 0..3 {
        match hello(7).await {
            Ok(greeting) => println!("{greeting}"),
            Err(AppError::Limited(denied)) => println!("{denied}"),
        }
    }
}
