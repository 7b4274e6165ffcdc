//! A function returning `std::io::Result` is rate limited: the denial is an
//! `io::Error` carrying the `RateLimited`.

use ratelimit::{rate_limit, Limiter, RateLimited};

#[rate_limit(key = "file:<name>", capacity = 1, rate = "1/h", limiter = limiter)]
async fn read_file(limiter: &Limiter, name: &str) -> std::io::Result<usize> {
    Ok(name.len())
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = Limiter::memory();
        assert_eq!(read_file(&limiter, "a.txt").await.unwrap(), 5);
        let error = read_file(&limiter, "a.txt").await.unwrap_err();
        let denied = error
            .get_ref()
            .and_then(|e| e.downcast_ref::<RateLimited>())
            .expect("the denial inside the io::Error");
        assert_eq!(denied.key, "file:a.txt");
    });
}
