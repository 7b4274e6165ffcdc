// Any return type that is a `Result<T, E>` with `E: From<RateLimited>`,
// however it is named: the attribute cannot see through an alias, and the
// compiler checks it instead.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct ApiError(RateLimited);

impl From<RateLimited> for ApiError {
    fn from(denied: RateLimited) -> Self {
        ApiError(denied)
    }
}

type ApiResult<T> = Result<T, ApiError>;

#[rate_limit(key = "api:<user>", capacity = 1, rate = "1/min")]
async fn api(user: u32) -> ApiResult<u32> {
    Ok(user)
}

// A crate's own `Result<T>`, in scope under the name `Result`.
mod error {
    #[derive(Debug)]
    pub struct Error(pub ratelimit::RateLimited);

    impl From<ratelimit::RateLimited> for Error {
        fn from(denied: ratelimit::RateLimited) -> Self {
            Error(denied)
        }
    }

    pub type Result<T> = std::result::Result<T, Error>;
}

mod service {
    use crate::error::Result;

    #[ratelimit::rate_limit(key = "own:<user>", capacity = 1, rate = "1/min")]
    pub async fn own(user: u32) -> Result<u32> {
        Ok(user)
    }
}

// `RateLimited` is an `Error`, so a boxed error takes it as is.
#[rate_limit(key = "boxed:<user>", capacity = 1, rate = "1/min")]
async fn boxed(user: u32) -> Result<u32, Box<dyn std::error::Error + Send + Sync>> {
    Ok(user)
}

#[tokio::main]
async fn main() {
    assert_eq!(api(1).await.unwrap(), 1);
    let ApiError(denied) = api(1).await.unwrap_err();
    assert_eq!(denied.key, "api:1");

    assert_eq!(service::own(2).await.unwrap(), 2);
    let error::Error(denied) = service::own(2).await.unwrap_err();
    assert_eq!(denied.key, "own:2");

    assert_eq!(boxed(3).await.unwrap(), 3);
    let denied = boxed(3).await.unwrap_err();
    let denied = denied
        .downcast_ref::<RateLimited>()
        .expect("the boxed error is the denial");
    assert_eq!(denied.key, "boxed:3");
}
