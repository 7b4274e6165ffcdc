use ratelimit::rate_limit;

#[derive(Debug)]
struct OtherError;

// Reported once, at the error type, as without `refund_on`.
#[rate_limit(key = "order:<user_id>", capacity = 10, rate = 2, refund_on = err)]
async fn submit_order(user_id: u64) -> Result<u64, OtherError> {
    Ok(user_id)
}

fn main() {}
