//! Rate-limited handlers for this library's users, who depend on it alone.

pub use ratelimit;

/// A handler limited to `capacity` calls an hour per user, costing `cost`.
#[macro_export]
macro_rules! limited_handler {
    ($name:ident, capacity = $capacity:literal, cost = $cost:expr) => {
        #[$crate::ratelimit::rate_limit(
            key = "handler:<user>",
            capacity = $capacity,
            rate = "1/h",
            cost = $cost,
            crate = $crate::ratelimit
        )]
        pub async fn $name(user: u64) -> ::core::result::Result<u64, $crate::ratelimit::RateLimited> {
            ::core::result::Result::Ok(user)
        }
    };
}
