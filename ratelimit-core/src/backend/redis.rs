//! The Redis backend: one atomic Lua script per decision, on one shared,
//! multiplexed, auto-reconnecting connection.

use std::sync::Arc;
use std::time::Duration;

use once_cell::sync::{Lazy, OnceCell};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::{Algorithm, Quota};

macro_rules! script {
    ($file:literal) => {
        Lazy::new(|| {
            redis::Script::new(concat!(
                include_str!("../../scripts/prelude.lua"),
                include_str!(concat!("../../scripts/", $file))
            ))
        })
    };
}

// Built once per process; `Script` sends EVALSHA and, on NOSCRIPT (after a
// restart or `SCRIPT FLUSH`), loads the script and retries once.
static TOKEN_BUCKET: Lazy<redis::Script> = script!("token_bucket.lua");
static GCRA: Lazy<redis::Script> = script!("gcra.lua");
static FIXED_WINDOW: Lazy<redis::Script> = script!("fixed_window.lua");
static SLIDING_LOG: Lazy<redis::Script> = script!("sliding_log.lua");
static SLIDING_WINDOW: Lazy<redis::Script> = script!("sliding_window.lua");

/// The script for `quota` with its arguments after `now` and `cost`.
fn script_for(quota: &Quota, invocation_args: &mut Vec<u64>) -> &'static redis::Script {
    let rate = quota.rate();
    let bucket = [rate.tokens(), rate.period_us(), quota.capacity()];
    let windowed = [quota.capacity(), quota.window_us()];
    match quota.algorithm() {
        Algorithm::TokenBucket => {
            invocation_args.extend(bucket);
            &TOKEN_BUCKET
        }
        Algorithm::Gcra | Algorithm::LeakyBucket => {
            invocation_args.extend(bucket);
            invocation_args.push(u64::from(quota.algorithm() == Algorithm::LeakyBucket));
            &GCRA
        }
        Algorithm::FixedWindow => {
            invocation_args.extend(windowed);
            &FIXED_WINDOW
        }
        Algorithm::SlidingLog => {
            invocation_args.extend(windowed);
            &SLIDING_LOG
        }
        Algorithm::SlidingWindow => {
            invocation_args.extend(windowed);
            &SLIDING_WINDOW
        }
    }
}

pub(crate) struct RedisBackend {
    client: redis::Client,
    /// Created on first use, inside the caller's Tokio runtime, which the
    /// connection manager needs for its background reconnection.
    connection: OnceCell<ConnectionManager>,
    prefix: String,
    timeout: Duration,
    /// The caller's clock, when configured; Redis `TIME` otherwise.
    clock: Option<Arc<dyn Clock>>,
}

impl RedisBackend {
    pub(crate) fn new(
        url: &str,
        prefix: String,
        timeout: Duration,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<Self, Error> {
        let client = redis::Client::open(url)
            .map_err(|e| Error::Config(format!("invalid Redis URL `{url}`: {e}")))?;
        Ok(Self {
            client,
            connection: OnceCell::new(),
            prefix,
            timeout,
            clock,
        })
    }

    fn connection(&self) -> Result<ConnectionManager, Error> {
        self.connection
            .get_or_try_init(|| {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_secs(1));
                ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            })
            .cloned()
            .map_err(Error::from)
    }

    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let mut connection = self.connection()?;
        let mut full_key = String::with_capacity(self.prefix.len() + key.len());
        full_key.push_str(&self.prefix);
        full_key.push_str(key);
        let mut args = Vec::with_capacity(4);
        let script = script_for(quota, &mut args);
        let mut invocation = script.prepare_invoke();
        invocation.key(full_key);
        match &self.clock {
            Some(clock) => invocation.arg(clock.now_micros()),
            None => invocation.arg(""),
        };
        invocation.arg(cost);
        for arg in args {
            invocation.arg(arg);
        }
        let reply: Vec<i64> =
            tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection))
                .await
                .map_err(|_| Error::Timeout(self.timeout))??;
        match reply[..] {
            [allowed, remaining, retry_after, reset_after, delay]
                if remaining >= 0 && retry_after >= 0 && reset_after >= 0 && delay >= 0 =>
            {
                Ok(Decision::from_micros(
                    allowed == 1,
                    quota.capacity(),
                    remaining as u64,
                    retry_after as u64,
                    reset_after as u64,
                    delay as u64,
                ))
            }
            _ => Err(Error::UnexpectedReply(format!("{reply:?}"))),
        }
    }
}
