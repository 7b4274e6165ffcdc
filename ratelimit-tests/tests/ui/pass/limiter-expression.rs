// `limiter = <expression>`: a `Limiter`, a reference to one, an `Arc` or a
// `LazyLock` of one, or a reference to any of these.
use std::sync::{Arc, LazyLock};

use ratelimit::{rate_limit, Limiter, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

static LIMITER: LazyLock<Limiter> = LazyLock::new(Limiter::memory);

#[rate_limit(key = "k", capacity = 1, rate = "1/h", limiter = &*LIMITER)]
async fn by_static() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "k", capacity = 1, rate = "1/h", limiter = limiter)]
async fn by_argument(limiter: &Limiter) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "k", capacity = 1, rate = "1/h", limiter = Arc::clone(&limiter))]
async fn by_temporary(limiter: Arc<Limiter>) -> Result<(), Limited> {
    drop(limiter);
    Ok(())
}

#[rate_limit(key = "static-ref", capacity = 1, rate = "1/h", limiter = &LIMITER)]
async fn by_static_reference() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "k", capacity = 1, rate = "1/h", limiter = &limiter)]
async fn by_reference_to_argument(limiter: &Limiter) -> Result<(), Limited> {
    Ok(())
}

struct Service {
    limiter: Arc<Limiter>,
}

impl Service {
    #[rate_limit(key = "k", capacity = 1, rate = "1/h", limiter = &self.limiter)]
    async fn by_field_reference(&self) -> Result<(), Limited> {
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    assert!(by_static_reference().await.is_ok());
    assert!(by_static_reference().await.is_err(), "the static's bucket");
    let own = Limiter::memory();
    assert!(by_reference_to_argument(&own).await.is_ok());
    assert!(by_reference_to_argument(&own).await.is_err());
    let service = Service {
        limiter: Arc::new(Limiter::memory()),
    };
    assert!(service.by_field_reference().await.is_ok());
    assert!(service.by_field_reference().await.is_err());

    assert!(by_static().await.is_ok());
    assert!(by_static().await.is_err());

    // Each limiter keeps its own buckets for the same key.
    let own = Limiter::memory();
    assert!(by_argument(&own).await.is_ok());
    assert!(by_argument(&own).await.is_err());
    assert!(by_argument(&Limiter::memory()).await.is_ok());

    let shared = Arc::new(Limiter::memory());
    assert!(by_temporary(Arc::clone(&shared)).await.is_ok());
    assert!(by_temporary(shared).await.is_err());
}
