// The guide's example: one bucket per user, the key built from an argument.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
enum AppError {
    Limited(RateLimited),
}

impl From<RateLimited> for AppError {
    fn from(denied: RateLimited) -> Self {
        AppError::Limited(denied)
    }
}

#[rate_limit(key = "order:submit:<user_id>", capacity = 2, rate = 2)]
async fn submit_order(user_id: u64, item: String) -> Result<String, AppError> {
    Ok(format!("{item} for {user_id}"))
}

#[tokio::main]
async fn main() {
    assert_eq!(submit_order(7, "book".into()).await.unwrap(), "book for 7");
    assert!(submit_order(7, "pen".into()).await.is_ok());
    let Err(AppError::Limited(denied)) = submit_order(7, "ink".into()).await else {
        panic!("the third call within the burst of 2 was admitted");
    };
    assert_eq!(denied.key, "order:submit:7");
    let rule = denied
        .rule
        .expect("denials by the attribute name their rule");
    assert!(rule.ends_with("::submit_order"), "rule {rule}");
    assert!(
        submit_order(8, "book".into()).await.is_ok(),
        "user 8 has a bucket of their own"
    );
}
