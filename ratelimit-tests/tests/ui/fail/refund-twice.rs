// An admission is refunded at most once: `Limiter::refund` takes the
// receipt by value, so a second refund of it does not compile.
use ratelimit::{Limiter, Quota, Request};

async fn twice(limiter: &Limiter, quota: &Quota) {
    let admitted = limiter.check(Request::new(quota, "k")).await.unwrap();
    limiter.refund(admitted).await.unwrap();
    limiter.refund(admitted).await.unwrap();
}

fn main() {
    let _ = twice;
}
