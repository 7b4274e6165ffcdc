// `quota = <expression>` gives a `Quota` or a `&Quota` per call; `exempt =
// <expression>` skips the limit. Neither moves an argument.
use std::sync::LazyLock;

use ratelimit::{rate_limit, Limiter, Quota, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

struct User {
    id: u32,
    tier: Tier,
}

enum Tier {
    Free,
    Pro,
    Staff,
}

static FREE: LazyLock<Quota> = LazyLock::new(|| Quota::per_hour(1).unwrap());
static PRO: LazyLock<Quota> = LazyLock::new(|| Quota::per_hour(3).unwrap());

fn tier_quota(user: &User) -> &'static Quota {
    match user.tier {
        Tier::Pro => &PRO,
        _ => &FREE,
    }
}

// A reference, an `exempt` flag over the argument, and the body moves it.
#[rate_limit(key = "api:<user.id>", quota = tier_quota(&user), exempt = matches!(user.tier, Tier::Staff), limiter = l)]
async fn call_api(l: &Limiter, user: User) -> Result<u32, Limited> {
    let owned = user;
    Ok(owned.id)
}

// A value, of any algorithm; stacked with a fixed limit.
#[rate_limit(key = "upload:<user>", quota = Quota::sliding_log(size.max(1), std::time::Duration::from_secs(60)).unwrap(), limiter = l)]
#[rate_limit(key = "upload", capacity = 100, rate = 10, exempt = user == 0, limiter = l)]
async fn upload(l: &Limiter, user: u32, size: u64) -> Result<(), Limited> {
    Ok(())
}

#[tokio::main]
async fn main() {
    let l = Limiter::memory();
    let user = |id, tier| User { id, tier };
    assert!(call_api(&l, user(1, Tier::Free)).await.is_ok());
    assert!(call_api(&l, user(1, Tier::Free)).await.is_err());
    for _ in 0..3 {
        assert!(call_api(&l, user(2, Tier::Pro)).await.is_ok());
    }
    assert!(call_api(&l, user(2, Tier::Pro)).await.is_err());
    for _ in 0..10 {
        assert!(call_api(&l, user(3, Tier::Staff)).await.is_ok());
    }
    assert!(upload(&l, 0, 2).await.is_ok());
    assert!(upload(&l, 0, 2).await.is_ok());
    assert!(upload(&l, 0, 2).await.is_err());
}
