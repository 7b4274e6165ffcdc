//! The order-submission limit from the README, for several users: each user
//! has a bucket of their own, so one user's flood never blocks another.
//!
//!     cargo run --example order_submit
//!     REDIS_URL=redis://127.0.0.1:6379 cargo run --example order_submit

use ratelimit::{rate_limit, Limiter, RateLimited};

#[derive(Debug, Clone)]
struct Item {
    sku: &'static str,
    quantity: u32,
}

#[derive(Debug)]
struct Order {
    id: u64,
    user_id: u64,
    item: Item,
}

#[derive(Debug)]
enum AppError {
    RateLimited(RateLimited),
}

impl From<RateLimited> for AppError {
    fn from(denied: RateLimited) -> Self {
        AppError::RateLimited(denied)
    }
}

/// At most 10 orders at once per user, refilled at 2 per second.
#[rate_limit(key = "order:submit:<user_id>", capacity = 10, rate = 2)]
async fn submit_order(user_id: u64, item: Item) -> Result<Order, AppError> {
    // The body runs only when the user's quota allows it.
    Ok(Order {
        id: user_id * 1_000 + u64::from(item.quantity),
        user_id,
        item,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    ratelimit::install(Limiter::from_env()?)?;

    // User 1 floods: 15 orders at once. Users 2 and 3 order a little.
    let plan = [(1u64, 15), (2, 3), (3, 1)];
    for (user_id, attempts) in plan {
        let (mut placed, mut denied, mut retry_after) = (0, 0, None);
        for quantity in 1..=attempts {
            let item = Item {
                sku: "sku-42",
                quantity,
            };
            match submit_order(user_id, item).await {
                Ok(order) => {
                    placed += 1;
                    debug_assert_eq!(order.user_id, user_id);
                    if placed == 1 {
                        println!(
                            "user {user_id}: first order #{} for {}",
                            order.id, order.item.sku
                        );
                    }
                }
                Err(AppError::RateLimited(e)) => {
                    denied += 1;
                    retry_after.get_or_insert(e.retry_after);
                }
            }
        }
        println!(
            "user {user_id}: {attempts} attempts, {placed} placed, {denied} denied{}",
            retry_after.map_or(String::new(), |r| format!(
                " (first denial: retry after {r:?})"
            ))
        );
    }
    Ok(())
}
