// `refund_on` keeps the body as written: `?`, early `return`, arguments the
// body moves, methods, a limiter from a field, `impl Trait` in the output,
// async-trait methods, and a future that stays `Send`.
use std::fmt::Display;

use ratelimit::{rate_limit, Limiter, RateLimited};

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

#[rate_limit(key = "parse:<user>", capacity = 3, rate = "1/min", refund_on = err)]
async fn parse(user: String, text: String) -> Result<u64, AppError> {
    let owned = user;
    if text.is_empty() {
        return Ok(owned.len() as u64);
    }
    let n: u64 = text.parse()?;
    Ok(n)
}

#[rate_limit(key = "shown", capacity = 3, rate = "1/min", refund_on = ok)]
async fn shown(n: u32) -> Result<impl Display, AppError> {
    Ok(n)
}

struct Service {
    limiter: Limiter,
    calls: u64,
}

impl Service {
    #[rate_limit(key = "svc:<id>", capacity = 2, rate = "1/min", limiter = self.limiter, refund_on = err)]
    async fn call(&self, id: u64) -> Result<u64, AppError> {
        Ok(id)
    }

    fn count(&mut self) {
        self.calls += 1;
    }

    // The limiter is a field of `self`, which the body borrows mutably.
    #[rate_limit(key = "bump", capacity = 2, rate = "1/min", limiter = self.limiter, refund_on = err)]
    async fn bump(&mut self) -> Result<u64, AppError> {
        self.count();
        Ok(self.calls)
    }
}

// The limiter comes from an argument the body moves.
#[rate_limit(key = "owned", capacity = 2, rate = "1/min", limiter = &limiter, refund_on = ok)]
async fn owned(limiter: Limiter) -> Result<(), AppError> {
    drop(limiter);
    Ok(())
}

#[async_trait::async_trait]
trait Store {
    async fn put(&self, key: u64) -> Result<(), AppError>;
}

struct Memory;

#[async_trait::async_trait]
impl Store for Memory {
    #[rate_limit(key = "put:<key>", capacity = 2, rate = "1/min", refund_on = err)]
    async fn put(&self, key: u64) -> Result<(), AppError> {
        let _ = key;
        Ok(())
    }
}

fn is_send<T: Send>(_: &T) {}

#[tokio::main]
async fn main() {
    assert_eq!(parse("ann".into(), "".into()).await, Ok(3));
    // A failure is given back: three more calls succeed.
    for _ in 0..5 {
        assert!(matches!(parse("ann".into(), "x".into()).await, Err(AppError::Parse(_))));
    }
    assert_eq!(parse("ann".into(), "1".into()).await, Ok(1));
    assert_eq!(parse("ann".into(), "2".into()).await, Ok(2));
    assert_eq!(parse("ann".into(), "3".into()).await, Err(AppError::Limited));
    assert!(shown(1).await.is_ok());
    let mut service = Service { limiter: Limiter::memory(), calls: 0 };
    let call = service.call(7);
    is_send(&call);
    assert_eq!(call.await, Ok(7));
    assert_eq!(service.bump().await, Ok(1));
    assert_eq!(owned(Limiter::memory()).await, Ok(()));
    assert!(Memory.put(1).await.is_ok());
}
