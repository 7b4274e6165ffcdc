// `crate = <path>` for a facade under another name.
extern crate ratelimit as rl;

#[derive(Debug)]
struct Limited;

impl From<rl::RateLimited> for Limited {
    fn from(_: rl::RateLimited) -> Self {
        Limited
    }
}

#[rl::rate_limit(key = "renamed", capacity = 1, rate = 1, crate = rl)]
async fn renamed() -> Result<(), Limited> {
    Ok(())
}

#[rl::rate_limit(key = "absolute", capacity = 1, rate = 1, crate = ::rl)]
async fn absolute() -> Result<(), Limited> {
    Ok(())
}

#[tokio::main]
async fn main() {
    assert!(renamed().await.is_ok());
    assert!(absolute().await.is_ok());
}
