// The future stays `Send` (it can be spawned) when the function's was.
use std::sync::Arc;

use ratelimit::{rate_limit, Limiter, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

fn assert_send<T: Send>(_: &T) {}

struct Service {
    limiter: Arc<Limiter>,
    tenant: String,
}

impl Service {
    #[rate_limit(key = "svc:<self.tenant>:<user>", capacity = 5, rate = 5, limiter = self.limiter, cost = items.len())]
    async fn call(&self, user: &str, items: &[u32]) -> Result<u32, Limited> {
        tokio::task::yield_now().await;
        Ok(items.iter().sum())
    }
}

#[rate_limit(key = "free:<user>", capacity = 5, rate = 5)]
async fn free(user: String) -> Result<String, Limited> {
    tokio::task::yield_now().await;
    Ok(user)
}

#[tokio::main]
async fn main() {
    let service = Arc::new(Service {
        limiter: Arc::new(Limiter::memory()),
        tenant: "t".into(),
    });
    let future = free("u".into());
    assert_send(&future);
    assert_eq!(tokio::spawn(future).await.unwrap().unwrap(), "u");

    let task = {
        let service = Arc::clone(&service);
        async move { service.call("u", &[1, 2, 3]).await }
    };
    assert_send(&task);
    assert_eq!(tokio::spawn(task).await.unwrap().unwrap(), 6);
}
