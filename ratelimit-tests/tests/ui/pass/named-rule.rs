// `rule = "..."`: the limiter's rule of that name when set, the attribute's
// numbers (of any algorithm) until then.
use ratelimit::{rate_limit, Limiter, Quota, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

#[rate_limit(rule = "search", key = "search:<user>", capacity = 1, rate = "1/h")]
async fn search(user: u32) -> Result<u32, Limited> {
    Ok(user)
}

#[rate_limit(rule = "api/v1:export", key = "export:<user>", algorithm = fixed_window, limit = 1, window = "1h", limiter = l)]
async fn export(l: &Limiter, user: u32) -> Result<u32, Limited> {
    Ok(user)
}

#[tokio::main]
async fn main() {
    assert!(search(1).await.is_ok());
    assert!(search(1).await.is_err());
    ratelimit::global()
        .rules()
        .set_text("search", "capacity=3 rate=1/h")
        .unwrap();
    for _ in 0..3 {
        assert!(search(2).await.is_ok());
    }
    let Err(Limited(denied)) = search(2).await else {
        panic!("a fourth search");
    };
    assert_eq!(denied.rule, Some("search"));

    let l = Limiter::memory();
    l.rules().set("api/v1:export", Quota::per_hour(2).unwrap());
    assert!(export(&l, 1).await.is_ok());
    assert!(export(&l, 1).await.is_ok());
    assert!(export(&l, 1).await.is_err());
}
