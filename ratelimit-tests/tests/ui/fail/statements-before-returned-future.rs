use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};

use ratelimit::{rate_limit, RateLimited};

struct AppError;

impl From<RateLimited> for AppError {
    fn from(_: RateLimited) -> Self {
        AppError
    }
}

static CALLS: AtomicU32 = AtomicU32::new(0);

// The statement would run on every call, even a denied one.
#[rate_limit(key = "counted", capacity = 1, rate = "1/min")]
fn counted() -> Pin<Box<dyn Future<Output = Result<(), AppError>> + Send>> {
    CALLS.fetch_add(1, Ordering::Relaxed);
    Box::pin(async move { Ok(()) })
}

fn main() {}
