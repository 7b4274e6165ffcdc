// Several attributes: every one must admit the call, checked in the order
// written, whichever path names the attribute.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

#[rate_limit(key = "login:<user>", capacity = 2, rate = "1/h")]
#[ratelimit::rate_limit(key = "login", capacity = 3, rate = "1/h")]
#[inline(never)]
#[rate_limit(key = "login:<user>:slow", capacity = 100, rate = "1/h")]
async fn login(user: &str) -> Result<(), Limited> {
    Ok(())
}

#[tokio::main]
async fn main() {
    assert!(login("ann").await.is_ok());
    assert!(login("ann").await.is_ok());
    // The per-user rule, written first, denies first.
    assert_eq!(login("ann").await.unwrap_err().0.key, "login:ann");
    assert!(login("bob").await.is_ok());
    // Three calls admitted in all: the global rule now denies bob.
    assert_eq!(login("bob").await.unwrap_err().0.key, "login");
}
