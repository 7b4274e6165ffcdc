// `refund_on` changes neither what the future is nor what the attribute
// sees: an argument that is `Send` but not `Sync` keeps the future `Send`,
// and an item declared in the body is seen by the attribute's expressions.
use std::cell::Cell;

use ratelimit::{rate_limit, Quota, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

fn assert_send<T: Send>(_: &T) {}

#[rate_limit(key = "hits", capacity = 5, rate = 1, refund_on = err)]
async fn count(hits: Cell<u32>) -> Result<u32, Limited> {
    hits.set(hits.get() + 1);
    tokio::task::yield_now().await;
    Ok(hits.get())
}

#[rate_limit(key = "tiered", quota = tier(), refund_on = err)]
async fn tiered() -> Result<(), Limited> {
    fn tier() -> Quota {
        Quota::per_hour(1).unwrap()
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let future = count(Cell::new(1));
    assert_send(&future);
    assert_eq!(tokio::spawn(future).await.unwrap().unwrap(), 2);
    assert!(tiered().await.is_ok());
    assert!(tiered().await.is_err(), "the body's own quota");
}
