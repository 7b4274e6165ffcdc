//! The `#[rate_limit]` attribute of the `ratelimit` crate.
//!
//! Use it through `ratelimit::rate_limit`: the code it writes calls into
//! `ratelimit`, which this crate cannot name on its own. Its documentation is
//! on [`macro@rate_limit`].
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod attr;
mod body;
mod expand;
mod key;
mod valid;

use proc_macro::TokenStream;

/// Limits how often an `async fn` runs, per key.
///
/// ```
/// use std::time::Duration;
/// use ratelimit::{rate_limit, RateLimited};
/// # struct Item;
/// # #[derive(Debug)]
/// # struct Order;
///
/// #[derive(Debug)]
/// enum AppError {
///     TooManyRequests { retry_after: Duration },
/// }
///
/// #[rate_limit(key = "order:submit:<user_id>", capacity = 10, rate = "2/s")]
/// async fn submit_order(user_id: u64, item: Item) -> Result<Order, AppError> {
///     // runs only when `user_id` has a token left
/// #   Ok(Order)
/// }
///
/// impl From<RateLimited> for AppError {
///     fn from(denied: RateLimited) -> Self {
///         AppError::TooManyRequests { retry_after: denied.retry_after }
///     }
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// for _ in 0..10 {
///     submit_order(42, Item).await.unwrap();
/// }
/// let Err(AppError::TooManyRequests { retry_after }) = submit_order(42, Item).await else {
///     panic!("the eleventh order in a burst was admitted");
/// };
/// assert!(retry_after <= Duration::from_millis(500), "one token comes back every 500 ms");
/// # });
/// ```
///
/// The examples below leave out the error type and the return values; each is
/// as above.
///
/// Before the body runs, each call builds its key from the arguments and asks
/// the limiter for tokens from that key's quota: by default a token bucket
/// holding at most `capacity` tokens, refilled at `rate` (see
/// [Algorithms](#algorithms) for the others). When the quota is spent, the
/// body does not run and the function returns `Err(From::from(denied))`, where
/// `denied` is a `ratelimit::RateLimited` carrying the key, the rule and
/// `retry_after`.
///
/// The rule, which denials and metrics report, is the name given by
/// `rule = "..."`, else the module path and the function's name, such as
/// `shop::orders::submit_order`. The attribute cannot see the type of an
/// impl it is in, so methods of one name in one module (`A::get` and
/// `B::get`, or two impls of a trait) share the default `shop::orders::get`:
/// give each a `rule = "..."` to tell them apart.
///
/// # Requirements
///
/// - An `async fn` with a body: a free function, an inherent method or a
///   trait-impl method (`self`, `&self`, `&mut self`), generic or not.
/// - Or a method of an `#[async_trait]` impl or trait, written `async fn`. The
///   impl's attribute expands first, whatever the order of the method's
///   attributes, and leaves a `fn` returning `Box::pin(async move { .. })`;
///   the checks go first inside that block, so they run when the future is
///   polled. Any `fn` whose only expression is `async move { .. }` or
///   `Box::pin(async move { .. })`, with `Future<Output = ..>` in its return
///   type, is taken the same way, and its `Output` is the return type below.
///   A statement before that expression would run on every call, even a
///   denied one, and does not compile: it belongs inside the block.
/// - A return type that is `Result<T, E>` where
///   `E: From<ratelimit::RateLimited>`, under any name: written out, an alias
///   such as `type ApiResult<T> = Result<T, ApiError>`, or a crate's own
///   `Result<T>`. The attribute cannot see through an alias, so the compiler
///   checks this, and reports a type that cannot carry the denial at the
///   return type.
///
/// The body is left as written: `return`, `?`, borrows and lifetimes behave as
/// without the attribute, and the future is `Send` whenever it was. The key
/// and the cost are computed from references to the arguments before the body
/// runs, so no argument is moved.
///
/// # Options
///
/// | option | value | default |
/// | --- | --- | --- |
/// | `key` | a template such as `"order:submit:<user_id>"`, or any expression whose value is `Display` | required |
/// | `rule` | a rule name such as `"order_submit"`: the limiter's rule of that name (see [Named rules](#named-rules)) decides when one is set, the attribute's numbers otherwise; denials and metrics report it | none: denials and metrics report the module path and the function's name, shared by methods of one name in one module |
/// | `capacity` | an integer literal greater than 0: the largest burst (bucket algorithms) | required, unless `quota` |
/// | `rate` | tokens per second as an integer (`2`) or decimal (`2.5`) literal, or a string such as `"100/min"` (bucket algorithms) | required, unless `quota` |
/// | `algorithm` | `token_bucket`, `gcra`, `leaky_bucket`, `fixed_window`, `sliding_log` or `sliding_window` | `token_bucket` |
/// | `limit` | an integer literal greater than 0: calls per window (window algorithms) | required, unless `quota` |
/// | `window` | a string such as `"1s"`, `"1m"`, `"1h"`, `"1d"` or `"500ms"`, whole milliseconds (window algorithms) | required, unless `quota` |
/// | `quota` | an expression over the arguments giving a `ratelimit::Quota` or `&Quota`, evaluated at each call, in place of `algorithm`, `capacity`, `rate`, `limit` and `window` (see [Per-call quotas](#per-call-quotas-and-exemptions)) | none |
/// | `cost` | tokens one call takes: an integer literal, or an expression over the arguments of any unsigned integer type | `1` |
/// | `exempt` | a `bool` expression over the arguments: when true the call skips this limit, with no backend call | `false` |
/// | `on_error` | `open`, `closed` or `local`: what to do when the backend fails (see `ratelimit::FailurePolicy`) | the limiter's policy (`open` unless configured) |
/// | `on_limit` | `deny`, or `wait(max = "2s")`: sleep for `retry_after` and try again while the call can still be admitted within `max` | `deny` |
/// | `refund_on` | `err`: give the call's tokens back when the body returns `Err` (only successes count); `ok`: when it returns `Ok` (only failures count). Stacked attributes must agree | none |
/// | `mode` | `enforce`, or `shadow`: decide and record as usual, but never deny | `enforce` |
/// | `lease` | an integer literal: take up to this many tokens per backend call and serve them in process until they run out or the lease expires (the global bound holds; unused leased tokens are lost at expiry) | none |
/// | `limiter` | an expression giving a `Limiter`, `&Limiter`, `Arc<Limiter>` or anything that derefs to a `Limiter` | the limiter installed with `ratelimit::install` |
/// | `crate` | the path of the `ratelimit` crate, for a crate that re-exports it (a dependency renamed in `Cargo.toml` is found by itself) | the name `Cargo.toml` gives it |
///
/// Quotas are checked at compile time: a zero or negative capacity or rate,
/// a malformed rate and a literal `cost` above `capacity` are errors at the
/// offending token, as is a quota the runtime could not compute exactly
/// (`capacity` times the rate's period, in microseconds, must stay under
/// 2^52).
///
/// # Algorithms
///
/// | `algorithm =` | takes | admits | Redis state per key |
/// | --- | --- | --- | --- |
/// | `token_bucket` | `capacity`, `rate` | bursts up to `capacity`, refilled continuously at `rate` | one number: when the bucket is full again |
/// | `gcra` | `capacity`, `rate` | exactly what the token bucket admits (the same algorithm) | one number |
/// | `leaky_bucket` | `capacity`, `rate` | a queue of `capacity` drained at `rate`: a call waits its turn, then runs | one number |
/// | `fixed_window` | `limit`, `window` | `limit` per window aligned to the epoch; up to twice the limit across a boundary | one string |
/// | `sliding_log` | `limit`, `window` | exactly `limit` in any window of length `window` | a sorted set of up to `limit` members (`limit` at most 10,000) |
/// | `sliding_window` | `limit`, `window` | the previous window's count weighted by its overlap, plus the current one's: at most `limit` plus the previous window's count times the share of the current window elapsed | one string |
///
/// ```
/// # use ratelimit::{rate_limit, RateLimited};
/// # #[derive(Default)] struct Report;
/// # #[derive(Default)] struct Request;
/// # #[derive(Default)] struct Response;
/// # struct AppError;
/// # impl From<RateLimited> for AppError { fn from(_: RateLimited) -> Self { AppError } }
/// #[rate_limit(key = "report:<user>", algorithm = sliding_log, limit = 3, window = "1h")]
/// async fn report(user: u64) -> Result<Report, AppError> {
///     // ...
/// #   Ok(Report)
/// }
///
/// // Calls reach the partner API at a steady 5 per second; up to 20 wait in line.
/// #[rate_limit(key = "partner", algorithm = leaky_bucket, capacity = 20, rate = 5)]
/// async fn call_partner(req: Request) -> Result<Response, AppError> {
///     // ...
/// #   Ok(Response)
/// }
/// ```
///
/// With `leaky_bucket`, an admitted call sleeps until its turn before the body
/// runs; dropping the future cancels the wait and gives the turn back.
/// An option of the other family (`window` with `gcra`, `capacity` with
/// `fixed_window`) is a compile error.
///
/// # Failures, waiting and shadow mode
///
/// ```
/// # use ratelimit::{rate_limit, RateLimited};
/// # #[derive(Default)] struct Receipt;
/// # #[derive(Default)] struct Hits;
/// # struct AppError;
/// # impl From<RateLimited> for AppError { fn from(_: RateLimited) -> Self { AppError } }
/// // Never flood the payment provider, even while Redis is down.
/// #[rate_limit(key = "pay:<merchant>", capacity = 50, rate = 10, on_error = closed)]
/// async fn charge(merchant: u64, amount: u64) -> Result<Receipt, AppError> {
///     // ...
/// #   Ok(Receipt)
/// }
///
/// // A background job may wait up to 2 s for a token rather than fail.
/// #[rate_limit(key = "sync:<tenant>", capacity = 5, rate = 1, on_limit = wait(max = "2s"))]
/// async fn sync(tenant: u64) -> Result<(), AppError> {
///     // ...
/// #   Ok(())
/// }
///
/// // Roll a new limit out: count and log would-be denials, deny nothing.
/// #[rate_limit(key = "search:<user>", capacity = 20, rate = 5, mode = shadow)]
/// async fn search(user: u64, q: &str) -> Result<Hits, AppError> {
///     // ...
/// #   Ok(Hits)
/// }
/// ```
///
/// A waiting call gives up (returning the denial) as soon as its next chance
/// would come after `max`; dropping its future cancels the wait. Only a denial
/// by a quota waits: the limit's, or, while the backend is down under
/// `on_error = local`, its share of it. A denial by `on_error = closed`
/// returns at once.
///
/// # Named rules
///
/// `rule = "name"` lets the running service change the quota. At each call
/// the attribute asks its limiter's rules (`Limiter::rules()`) for `name`:
/// the rule's quota decides when one is set, of any algorithm; the
/// attribute's own numbers decide otherwise, and again once the rule is
/// removed. A change applies from the next call, and a call sees the old
/// quota or the new one, never a mix.
///
/// ```no_run
/// # use ratelimit::{rate_limit, RateLimited};
/// # #[derive(Default)] struct Item;
/// # #[derive(Default)] struct Order;
/// # struct AppError;
/// # impl From<RateLimited> for AppError { fn from(_: RateLimited) -> Self { AppError } }
/// use ratelimit::RedisRuleSource;
///
/// #[rate_limit(rule = "order_submit", key = "order:submit:<user_id>", capacity = 10, rate = 2)]
/// async fn submit_order(user_id: u64, item: Item) -> Result<Order, AppError> {
///     // ...
/// #   Ok(Order)
/// }
///
/// # async fn configure(url: &str) -> Result<(), Box<dyn std::error::Error>> {
/// // In process:
/// ratelimit::global().rules().set_text("order_submit", "capacity=20 rate=5/s")?;
/// // Or for every instance, through Redis (each runs a `RedisRuleSource`):
/// RedisRuleSource::publish(url, "order_submit", "algorithm=gcra capacity=20 rate=5/s").await?;
/// # Ok(())
/// # }
/// ```
///
/// Denials and metrics name the rule (rather than the function), so several
/// functions may share one rule. A rule name is 1 to 128 letters, digits and
/// `_`, `-`, `.`, `:`, `/`. When a rule's algorithm is not the attribute's
/// own, its state is kept under `key~<algorithm>`, so a rule can change
/// algorithm while keys hold the other one's state; denials report the key
/// as the attribute built it.
///
/// # Per-call quotas and exemptions
///
/// `quota = <expression>` chooses the quota at each call, such as a tier's;
/// it replaces the attribute's numbers, so it cannot be combined with
/// `algorithm`, `capacity`, `rate`, `limit`, `window` or `rule` (the
/// expression can look a rule up itself). `exempt = <expression>` skips the
/// limit entirely when true: no key is built and the limiter is not asked
/// (the `limiter` expression is still evaluated).
///
/// ```
/// # use ratelimit::{rate_limit, RateLimited};
/// # #[derive(Default)] struct Request;
/// # #[derive(Default)] struct Response;
/// # struct AppError;
/// # impl From<RateLimited> for AppError { fn from(_: RateLimited) -> Self { AppError } }
/// # struct User { id: u64, pro: bool, staff: bool }
/// # impl User { fn is_staff(&self) -> bool { self.staff } }
/// use std::sync::LazyLock;
/// use ratelimit::Quota;
///
/// static FREE: LazyLock<Quota> = LazyLock::new(|| Quota::per_minute(10).unwrap());
/// static PRO: LazyLock<Quota> = LazyLock::new(|| Quota::per_minute(100).unwrap());
///
/// fn tier_quota(user: &User) -> &'static Quota {
///     if user.pro { &PRO } else { &FREE }
/// }
///
/// #[rate_limit(key = "api:<user.id>", quota = tier_quota(&user), exempt = user.is_staff())]
/// async fn call_api(user: User, req: Request) -> Result<Response, AppError> {
///     // ...
/// #   Ok(Response)
/// }
/// ```
///
/// Both are evaluated before the body runs (`exempt` first), so write them
/// over references (`&user`, `user.is_staff()`) to leave the arguments to
/// the body. A quota whose algorithm is not the token
/// bucket keeps its state under `key~<algorithm>`, as for named rules.
///
/// # Rates
///
/// A number is tokens per second: `rate = 2`, `rate = 0.5`. A string is
/// `"<amount>/<period>"`, where the amount may be a decimal and the period is
/// a unit with an optional integer multiple:
///
/// | unit | written |
/// | --- | --- |
/// | microsecond | `us`, `µs` |
/// | millisecond | `ms` |
/// | second | `s`, `sec`, `second`, `seconds` |
/// | minute | `m`, `min`, `minute`, `minutes` |
/// | hour | `h`, `hr`, `hour`, `hours` |
/// | day (86,400 s) | `d`, `day`, `days` |
///
/// For example `"5/s"`, `"100/min"`, `"3600/h"`, `"1000/d"`, `"10/30s"`,
/// `"1/500ms"` or `"2.5/s"`. Rates are kept as exact fractions: `"100/min"`
/// is one token every 600,000 µs, and `2.5` is 25 tokens every 10 s, with no
/// rounding drift.
///
/// # Keys
///
/// A template is literal text with placeholders. `<param>` is the value of a
/// parameter; `<param.field.path>` a field of it (`<pair.0>` for a tuple);
/// `<self>` and `<self.field>` work in methods. A placeholder's value must
/// implement `Display`. Every key is built the same way, so the literal text
/// can name the operation and keep rules apart: `"order:submit:<user_id>"`.
///
/// Values are escaped, so that no value can forge another key:
///
/// - characters in `[A-Za-z0-9_.-]` stand for themselves; any other byte
///   becomes `%XX` (so `alice:{admin}` becomes `alice%3A%7Badmin%7D`);
/// - a value whose escaped form is longer than 64 bytes is replaced by `%_`
///   and 32 hex digits of its SHA-256, so keys stay short whatever the input;
/// - literal text is kept as written, including a Redis Cluster hash tag
///   such as `"{tenant:7}:<user_id>"`: no value can add or change one.
///
/// Two placeholders must be separated by at least one literal character that
/// is not in `[A-Za-z0-9_.-%]`, such as `:` or `/`: otherwise two different
/// pairs of values could build the same key (`<a>-<b>` gives `x-y-z` for both
/// `("x-y", "z")` and `("x", "y-z")`), and the template is rejected. `<` always
/// opens a placeholder, and a template cannot be empty.
///
/// `key = <expression>` (anything but a string literal) uses the expression's
/// `Display` value as the whole key, for keys a template cannot express. It is
/// taken as written except that `%`, `{`, `}` and `~` are escaped (a value
/// cannot choose a hash tag, nor spell the suffixes that keep stacked checks
/// apart), and so are control characters (`char::is_control`, NEL among
/// them) and the line and paragraph separators U+2028 and U+2029 (a key
/// cannot write a log line of its own); an empty value is written `%_`, as
/// an empty placeholder value is, and a value longer than 256 bytes is
/// replaced by its digest.
///
/// Placeholders are filled only in a string literal template. A string macro
/// (`concat!`, `format!`, `stringify!`...) whose text holds a `<name>`
/// placeholder is rejected; a `const` cannot be seen into, so the `<user>` of
/// `key = KEY` with `const KEY: &str = "c:<user>"` is text, the same for every
/// call.
///
/// # Cost
///
/// Each call takes `cost` tokens: `cost = 5`, or an expression over the
/// arguments such as `cost = items.len()` (`u8`, `u16`, `u32`, `u64`, `usize`,
/// or a reference to one). A call whose cost exceeds `capacity` is always
/// denied, with `retry_after` of `Duration::MAX`; a literal cost above the
/// capacity does not compile.
///
/// # Limiter
///
/// By default the checks go to the limiter installed with
/// `ratelimit::install`; until one is, the one `Limiter::from_env` gives (Redis
/// when `REDIS_URL` names one, else the memory backend). `limiter = expr`
/// names another, evaluated at each call:
///
/// ```
/// # use ratelimit::{rate_limit, RateLimited};
/// # #[derive(Default)] struct Report;
/// # #[derive(Default)] struct Hits;
/// # struct AppError;
/// # impl From<RateLimited> for AppError { fn from(_: RateLimited) -> Self { AppError } }
/// use std::sync::LazyLock;
/// use ratelimit::Limiter;
///
/// static LIMITER: LazyLock<Limiter> = LazyLock::new(Limiter::memory);
///
/// struct Service {
///     tenant: u64,
///     limiter: Limiter,
/// }
///
/// impl Service {
///     #[rate_limit(key = "export:<self.tenant>", capacity = 1, rate = "1/h", limiter = &*LIMITER)]
///     async fn export(&self) -> Result<Report, AppError> {
///         // ...
/// #       Ok(Report)
///     }
///
///     #[rate_limit(key = "search:<user>", capacity = 20, rate = 5, limiter = self.limiter)]
///     async fn search(&self, user: &str) -> Result<Hits, AppError> {
///         // ...
/// #       Ok(Hits)
///     }
/// }
/// ```
///
/// # Several limits
///
/// Stack attributes to enforce several quotas; every one must admit the call,
/// and they are checked in the order written, the first denial returning:
///
/// ```
/// # use ratelimit::{rate_limit, RateLimited};
/// # #[derive(Default)] struct Session;
/// # struct AppError;
/// # impl From<RateLimited> for AppError { fn from(_: RateLimited) -> Self { AppError } }
/// #[rate_limit(key = "login:<user>", capacity = 5, rate = "5/min")]
/// #[rate_limit(key = "login", capacity = 1000, rate = "1000/min")]
/// async fn login(user: &str, password: &str) -> Result<Session, AppError> {
///     // ...
/// #   Ok(Session)
/// }
/// ```
///
/// On one limiter the check is all or nothing: a denied call takes no token
/// from any of them. Attributes on different limiters, or that wait, are
/// checked one after the other; when a later one denies, or the call is
/// dropped before its body starts, what the earlier ones took is given back,
/// as `Limiter::refund` gives it. An exempt attribute is left out of the
/// check.
///
/// # A renamed crate
///
/// ```
/// extern crate ratelimit as rl;
///
/// #[rl::rate_limit(key = "k", capacity = 1, rate = 1, crate = rl)]
/// async fn f() -> Result<(), rl::RateLimited> {
///     Ok(())
/// }
/// ```
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::rate_limit(args.into(), item.into()).into()
}
