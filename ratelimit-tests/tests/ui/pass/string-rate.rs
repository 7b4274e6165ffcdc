// Every form of rate string the runtime accepts.
use ratelimit::{rate_limit, RateLimited};

#[derive(Debug)]
struct Limited(RateLimited);

impl From<RateLimited> for Limited {
    fn from(denied: RateLimited) -> Self {
        Limited(denied)
    }
}

macro_rules! limited {
    ($($name:ident = $rate:literal),* $(,)?) => {$(
        #[rate_limit(key = "rate", capacity = 1, rate = $rate)]
        async fn $name() -> Result<(), Limited> {
            Ok(())
        }
    )*};
}

limited! {
    per_second = "5/s",
    per_sec = "5/sec",
    per_minute = "100/min",
    per_m = "100/m",
    per_minutes = "100/minutes",
    per_hour = "3600/h",
    per_hr = "3600/hr",
    per_day = "1000/d",
    per_days = "1000/days",
    per_30s = "10/30s",
    per_500ms = "1/500ms",
    per_us = "1/1000000us",
    decimal = "2.5/s",
    spaced = " 1 / 2 hours ",
}

#[tokio::main]
async fn main() {
    assert!(per_minute().await.is_ok());
    let denied = per_minute().await.unwrap_err().0;
    assert!(
        denied.retry_after <= std::time::Duration::from_millis(600),
        "100/min is a token every 600 ms, not {:?}",
        denied.retry_after
    );
    let _ = (
        per_second,
        per_sec,
        per_m,
        per_minutes,
        per_hour,
        per_hr,
        per_day,
        per_days,
    );
    let _ = (per_30s, per_500ms, per_us, decimal, spaced);
}
