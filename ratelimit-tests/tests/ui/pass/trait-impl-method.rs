// A method of a trait implementation, with native `async fn` in the trait.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

trait Store {
    async fn put(&self, key: &str, value: Vec<u8>) -> Result<usize, Limited>;
}

struct Bucket {
    name: &'static str,
}

impl Store for Bucket {
    #[rate_limit(key = "put:<self.name>/<key>", capacity = 2, rate = "2/min")]
    async fn put(&self, key: &str, value: Vec<u8>) -> Result<usize, Limited> {
        Ok(value.len())
    }
}

#[tokio::main]
async fn main() {
    let bucket = Bucket { name: "photos" };
    assert_eq!(bucket.put("a b", vec![1, 2]).await.unwrap(), 2);
    assert!(bucket.put("a b", vec![]).await.is_ok());
    let denied = bucket.put("a b", vec![]).await.unwrap_err().0;
    assert_eq!(
        denied.key, "put:photos/a%20b",
        "values are escaped, literals are not"
    );
}
