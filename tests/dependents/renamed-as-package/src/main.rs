use distributed_ratelimit::{rate_limit, RateLimited};

#[rate_limit(key = "hello:<user>", capacity = 1, rate = 1)]
async fn hello(user: u64) -> Result<String, RateLimited> {
    Ok(format!("hello, user {user}"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    println!("{}", hello(7).await.expect("the first call is admitted"));
    let denied = hello(7).await.expect_err("the second is denied");
    println!("{denied}");
}
