// A method written as async-trait writes it, by hand: a `fn` returning
// `Box::pin(async move { ... })`, and one returning `impl Future` with an
// `async move` block. The checks run when the future is polled, not when it
// is created.
use std::future::Future;
use std::pin::Pin;

use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

trait Store {
    fn put<'a>(
        &'a self,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<usize, Limited>> + Send + 'a>>;
}

struct Bucket {
    name: &'static str,
}

impl Store for Bucket {
    #[rate_limit(key = "put:<self.name>/<key>", capacity = 1, rate = "1/min")]
    fn put<'a>(
        &'a self,
        key: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<usize, Limited>> + Send + 'a>> {
        ::std::boxed::Box::pin(async move { Ok(key.len()) })
    }
}

#[rate_limit(key = "free:<user>", capacity = 1, rate = "1/min")]
fn free(user: u32) -> impl Future<Output = Result<u32, Limited>> {
    async move { Ok(user) }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let bucket = Bucket { name: "b" };
    let first = bucket.put("k");
    let second = bucket.put("k");
    // Created in this order, polled in the other: the one polled first is
    // admitted.
    assert_eq!(runtime.block_on(second).unwrap(), 1);
    let denied = runtime.block_on(first).unwrap_err().0;
    assert_eq!(denied.key, "put:b/k");

    assert_eq!(runtime.block_on(free(3)).unwrap(), 3);
    assert!(runtime.block_on(free(3)).is_err());
}
