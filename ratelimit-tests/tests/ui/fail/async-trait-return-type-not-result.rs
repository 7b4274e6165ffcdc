use async_trait::async_trait;
use ratelimit::rate_limit;

#[async_trait]
trait Store {
    async fn get(&self, key: u64) -> Option<u64>;
}

struct Bucket;

#[async_trait]
impl Store for Bucket {
    #[rate_limit(key = "get:<key>", capacity = 10, rate = 2)]
    async fn get(&self, key: u64) -> Option<u64> {
        Some(key)
    }
}

fn main() {}
