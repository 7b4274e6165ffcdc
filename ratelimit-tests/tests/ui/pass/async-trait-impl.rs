// Methods of `#[async_trait]` impls. The impl's attribute expands first, so
// `#[rate_limit]` receives what async-trait wrote: a `fn` returning
// `Pin<Box<dyn Future<Output = ...> + Send + 'async_trait>>` whose body is
// `Box::pin(async move { ... })`. The checks go inside that async block.
use std::rc::Rc;
use std::sync::Arc;

use async_trait::async_trait;
use ratelimit::{rate_limit, Limiter, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

#[async_trait]
trait Store {
    async fn put(&self, key: &str, value: Vec<u8>) -> Result<usize, Limited>;
    async fn rename(&mut self, name: String) -> Result<(), Limited>;
    async fn count(self: Arc<Self>, n: u64) -> Result<u64, Limited>;
    async fn sum(&self, pair: (u8, u8), tag: &str) -> Result<u8, Limited>;

    // A provided method of an `#[async_trait]` trait takes the same form.
    #[rate_limit(key = "touch:<who>", capacity = 1, rate = "1/min")]
    async fn touch(&self, who: u32) -> Result<u32, Limited> {
        Ok(who)
    }
}

struct Bucket {
    name: String,
    limiter: Limiter,
}

#[async_trait]
impl Store for Bucket {
    #[rate_limit(key = "put:<self.name>/<key>", capacity = 2, rate = "2/min")]
    async fn put(&self, key: &str, value: Vec<u8>) -> Result<usize, Limited> {
        tokio::task::yield_now().await;
        Ok(value.len())
    }

    #[rate_limit(key = "rename:<name>", capacity = 1, rate = "1/min", limiter = self.limiter)]
    async fn rename(&mut self, name: String) -> Result<(), Limited> {
        self.name = name;
        Ok(())
    }

    // Written below another attribute: the order on the method changes nothing.
    #[allow(unused_mut)]
    #[rate_limit(key = "count:<self.name>", capacity = 3, rate = "1/min", cost = n)]
    async fn count(self: Arc<Self>, mut n: u64) -> Result<u64, Limited> {
        Ok(n)
    }

    // async-trait renames a parameter bound by a pattern; the others keep
    // their names.
    #[rate_limit(key = "sum:<self.name>:<tag>", capacity = 1, rate = "1/min")]
    async fn sum(&self, (a, b): (u8, u8), tag: &str) -> Result<u8, Limited> {
        Ok(a + b)
    }
}

// Futures that need not be `Send`.
#[async_trait(?Send)]
trait Job {
    async fn run(&self, job: Rc<str>) -> Result<usize, Limited>;
}

#[async_trait(?Send)]
impl Job for Bucket {
    #[rate_limit(key = "run:<job>", capacity = 1, rate = "1/min")]
    async fn run(&self, job: Rc<str>) -> Result<usize, Limited> {
        Ok(job.len())
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::main]
async fn main() {
    let mut bucket = Bucket {
        name: "photos".into(),
        limiter: Limiter::memory(),
    };
    let future = bucket.put("a b", vec![1, 2]);
    assert_send(&future);
    assert_eq!(future.await.unwrap(), 2);
    assert!(bucket.put("a b", vec![]).await.is_ok());
    let denied = bucket.put("a b", vec![]).await.unwrap_err().0;
    assert_eq!(
        denied.key, "put:photos/a%20b",
        "the key names the method's receiver and parameter"
    );
    assert!(
        denied.rule.is_some_and(|rule| rule.ends_with("::put")),
        "rule {:?}",
        denied.rule
    );

    bucket.rename("videos".into()).await.unwrap();
    assert_eq!(bucket.name, "videos");
    let denied = bucket.rename("videos".into()).await.unwrap_err().0;
    assert_eq!(denied.key, "rename:videos");

    let bucket = Arc::new(bucket);
    assert_eq!(Arc::clone(&bucket).count(2).await.unwrap(), 2);
    let denied = Arc::clone(&bucket).count(2).await.unwrap_err().0;
    assert_eq!(denied.key, "count:videos", "cost 2 of 3 is spent");

    assert_eq!(bucket.sum((1, 2), "t").await.unwrap(), 3);
    let denied = bucket.sum((1, 2), "t").await.unwrap_err().0;
    assert_eq!(denied.key, "sum:videos:t");

    assert_eq!(bucket.run("abc".into()).await.unwrap(), 3);
    assert!(
        bucket.run("abc".into()).await.is_err(),
        "a `?Send` method is limited too"
    );

    assert_eq!(bucket.touch(7).await.unwrap(), 7);
    assert!(
        bucket.touch(7).await.is_err(),
        "a provided method is limited too"
    );
}
