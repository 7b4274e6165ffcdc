//! The runtime of the `ratelimit` framework: quotas, decisions and denials, the
//! [`Limiter`] and its backends (the embedded memory backend and Redis).
//!
//! Most users depend on the `ratelimit` facade and its `#[rate_limit]`
//! attribute; this crate is what the attribute calls, and what direct callers
//! use.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod algorithm;
mod backend;
mod breaker;
mod clock;
mod decision;
mod denial;
mod deny_cache;
mod error;
mod global;
pub mod key;
mod lease;
mod limiter;
mod metrics;
// The native module's crate uses it; the limiter only sends its wire version.
#[cfg(feature = "native")]
#[doc(hidden)]
pub mod native;
mod quota;
#[cfg(feature = "redis")]
mod rule_source;
mod rules;
mod sharded;
mod tls;
// The version the limiter sends with each call of its function.
#[cfg(any(feature = "redis", feature = "native"))]
mod wire_version;

pub use breaker::{BreakerConfig, CircuitState};
pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use decision::Decision;
pub use denial::{DenialCause, RateLimited};
pub use error::{ConfigError, Error, ErrorKind};
pub use global::{global, install};
pub use key::KeyBuilder;
#[doc(hidden)]
pub use limiter::OwnedAdmitted;
pub use limiter::{
    Admitted, FailurePolicy, Limiter, LimiterBuilder, Request, DEFAULT_MEMORY_MAX_KEYS,
    DEFAULT_PREFIX, DEFAULT_TIMEOUT,
};
pub use metrics::StatsSnapshot;
#[doc(hidden)]
pub use quota::__span_micros;
pub use quota::{Algorithm, Quota, QuotaBuilder, QuotaError, QuotaPolicy, Rate};
#[cfg(feature = "redis")]
pub use rule_source::{
    PublishError, RedisRuleSource, RedisRuleSourceBuilder, DEFAULT_RELOAD_EVERY,
    DEFAULT_RULES_CHANNEL, DEFAULT_RULES_HASH,
};
pub use rules::{RuleError, Rules};
pub use tls::TlsConfig;
