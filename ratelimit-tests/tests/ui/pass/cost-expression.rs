// `cost`: a literal, or an expression over the arguments of any unsigned
// integer type, computed before the body moves them.
use ratelimit::{rate_limit, DenialCause, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

#[rate_limit(key = "batch:<user>", capacity = 10, rate = "1/h", cost = items.len())]
async fn batch(user: u32, items: Vec<String>) -> Result<Vec<String>, Limited> {
    Ok(items)
}

#[rate_limit(key = "upload", capacity = 100, rate = "1/h", cost = *size / 1024)]
async fn upload(size: &u64) -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "fixed", capacity = 10, rate = "1/h", cost = 4)]
async fn fixed() -> Result<(), Limited> {
    Ok(())
}

#[rate_limit(key = "small", capacity = 10, rate = "1/h", cost = n)]
async fn small(n: u8) -> Result<(), Limited> {
    Ok(())
}

#[tokio::main]
async fn main() {
    assert_eq!(batch(1, vec!["a".into(); 6]).await.unwrap().len(), 6);
    let denied = batch(1, vec!["a".into(); 5]).await.unwrap_err().0;
    assert_eq!(denied.remaining, 4, "6 of 10 tokens taken");
    let denied = batch(2, vec!["a".into(); 11]).await.unwrap_err().0;
    assert_eq!(denied.cause, DenialCause::CostExceedsCapacity { cost: 11 });

    assert!(upload(&(99 * 1024)).await.is_ok());
    assert!(upload(&(2 * 1024)).await.is_err());

    assert!(fixed().await.is_ok());
    assert!(fixed().await.is_ok());
    assert!(fixed().await.is_err(), "4 + 4 + 4 > 10");

    assert!(small(10).await.is_ok());
    assert!(small(1).await.is_err());
}
