//! Allowed and denied calls, with `retry_after`.
//!
//! Runs with no server on the embedded memory backend:
//!     cargo run --example quickstart
//! and on Redis when `REDIS_URL` is set:
//!     REDIS_URL=redis://127.0.0.1:6379 cargo run --example quickstart

use std::time::Duration;

use ratelimit::{rate_limit, Limiter, RateLimited};

#[derive(Debug)]
enum AppError {
    Limited(RateLimited),
}

impl From<RateLimited> for AppError {
    fn from(denied: RateLimited) -> Self {
        AppError::Limited(denied)
    }
}

/// Three calls at once per name, then one more every 500 ms.
#[rate_limit(key = "greet:<name>", capacity = 3, rate = "2/s")]
async fn greet(name: &str) -> Result<String, AppError> {
    Ok(format!("hello, {name}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::from_env()?;
    println!("backend: {}", limiter.backend_name());
    ratelimit::install(limiter)?;

    let mut wait = Duration::ZERO;
    for call in 1..=5 {
        match greet("alice").await {
            Ok(greeting) => println!("call {call}: allowed: {greeting}"),
            Err(AppError::Limited(denied)) => {
                println!("call {call}: denied: {denied}");
                wait = denied.retry_after;
            }
        }
    }

    println!("waiting {wait:?}, as the denial said");
    tokio::time::sleep(wait).await;
    match greet("alice").await {
        Ok(greeting) => println!("after the wait: allowed: {greeting}"),
        Err(AppError::Limited(denied)) => println!("after the wait: still denied: {denied}"),
    }
    match greet("bob").await {
        Ok(greeting) => println!("another name has its own bucket: {greeting}"),
        Err(AppError::Limited(denied)) => println!("bob denied: {denied}"),
    }
    Ok(())
}
