use ratelimit::rate_limit;

#[derive(Debug)]
struct OtherError;

type OtherResult<T> = Result<T, OtherError>;

#[rate_limit(key = "order:<user_id>", capacity = 10, rate = 2)]
async fn submit_order(user_id: u64) -> OtherResult<u64> {
    Ok(user_id)
}

fn main() {}
