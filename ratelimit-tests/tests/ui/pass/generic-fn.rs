// Generic parameters, `impl Trait` arguments, lifetimes and a where clause.
use std::fmt::Display;

use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

#[rate_limit(key = "get:<id>:<scope>", capacity = 1, rate = 1)]
async fn get<'a, T, E>(id: T, scope: impl Display, data: &'a [u8]) -> Result<&'a [u8], E>
where
    T: Display,
    E: From<RateLimited>,
{
    Ok(data)
}

#[tokio::main]
async fn main() {
    let data = [1u8, 2, 3];
    let first: Result<&[u8], Limited> = get("x", 1, &data).await;
    assert_eq!(first.unwrap(), &data);
    let second: Result<&[u8], Limited> = get("x", 1, &data).await;
    assert_eq!(second.unwrap_err().0.key, "get:x:1");
    let other: Result<&[u8], Limited> = get(String::from("y"), 'z', &data[..1]).await;
    assert_eq!(other.unwrap(), &[1]);
}
