// The body keeps its `?` and early `return`, and arguments are moved by the
// body only after the key was built from them.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug, PartialEq)]
enum AppError {
    Limited,
    Parse(std::num::ParseIntError),
}

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError::Limited
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(err: std::num::ParseIntError) -> Self {
        AppError::Parse(err)
    }
}

#[rate_limit(key = "parse:<user>", capacity = 3, rate = "1/min")]
async fn parse(user: String, text: String) -> Result<u64, AppError> {
    let owned = user; // moves the argument the key was built from
    if text.is_empty() {
        return Ok(owned.len() as u64);
    }
    let n: u64 = text.parse()?;
    Ok(n)
}

#[tokio::main]
async fn main() {
    assert_eq!(parse("ann".into(), "".into()).await, Ok(3));
    assert_eq!(parse("ann".into(), "42".into()).await, Ok(42));
    assert!(matches!(
        parse("ann".into(), "x".into()).await,
        Err(AppError::Parse(_))
    ));
    assert_eq!(
        parse("ann".into(), "1".into()).await,
        Err(AppError::Limited)
    );
}
