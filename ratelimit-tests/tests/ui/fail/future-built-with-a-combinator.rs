use futures::future::{BoxFuture, FutureExt};
use ratelimit::{rate_limit, RateLimited};

#[rate_limit(key = "k", capacity = 1, rate = 1)]
fn boxed() -> BoxFuture<'static, Result<(), RateLimited>> {
    async move { Ok(()) }.boxed()
}

fn main() {}
