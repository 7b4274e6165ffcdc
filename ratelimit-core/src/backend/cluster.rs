//! The Redis Cluster backend: the same script, routed by key to the master
//! of its hash slot through redis-rs's async cluster client, which follows
//! MOVED and ASK and refreshes the slot map after a failover.
//!
//! A script call only ever names keys of one slot, so no call can hit
//! CROSSSLOT: single decisions name one key; an all-or-nothing check whose
//! keys share a slot (a common hash tag, such as `"{user:<id>}:..."`) is one
//! script call; across slots, the dimensions consume in order and what was
//! taken is given back when a later one denies.
//!
//! A script call changes state, so it is sent once: the cluster client's own
//! retries are off, since it would send a call again after an I/O error,
//! when Redis may have run it and only the reply was lost (a decision or a
//! refund applied twice). This backend sends a call again only when the
//! node refused it without running it (`MOVED`, `ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`, a write to a demoted master), after the client has begun
//! refreshing its slot map.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use super::redis::{decode_all, decode_one, invocation, invoke, Request};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::Quota;

pub(crate) struct ClusterBackend {
    client: ClusterClient,
    /// Connected on first use; a failed attempt is retried on the next call.
    connection: tokio::sync::OnceCell<ClusterConnection>,
    prefix: String,
    timeout: Duration,
    clock: Option<Arc<dyn Clock>>,
}

/// The Redis Cluster hash slot of `key`: CRC16 of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16_384
}

impl ClusterBackend {
    pub(crate) fn new(
        urls: &[String],
        tls: &crate::tls::TlsConfig,
        prefix: String,
        timeout: Duration,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<Self, Error> {
        if urls.is_empty() {
            return Err(Error::Config(
                "a Redis Cluster needs at least one node URL".into(),
            ));
        }
        let secure = urls.iter().any(|u| u.starts_with("rediss://"));
        if tls.is_set() && !secure {
            return Err(Error::Config(
                "TLS certificates were given for Redis Cluster URLs without TLS; use `rediss://`"
                    .into(),
            ));
        }
        #[cfg(not(feature = "tls"))]
        if secure {
            return Err(Error::Config(
                "`rediss://` needs the `tls` feature of ratelimit; enable it in Cargo.toml".into(),
            ));
        }
        let builder = ClusterClient::builder(urls.to_vec())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // Sent once; see the module's documentation and `call`.
            .retries(0);
        #[cfg(feature = "tls")]
        let builder = if secure {
            crate::tls::ensure_crypto_provider();
            if tls.is_set() {
                builder.certs(tls.certificates())
            } else {
                builder
            }
        } else {
            builder
        };
        let client = builder.build().map_err(|e| {
            let urls: Vec<String> = urls.iter().map(|u| super::redis::redacted(u)).collect();
            Error::Config(format!("invalid Redis Cluster URLs {urls:?}: {e}"))
        })?;
        Ok(Self {
            client,
            connection: tokio::sync::OnceCell::new(),
            prefix,
            timeout,
            clock,
        })
    }

    async fn connection(&self) -> Result<ClusterConnection, Error> {
        self.connection
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
            .map_err(Error::from)
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn now(&self) -> Option<u64> {
        self.clock.as_ref().map(|clock| clock.now_micros())
    }

    /// One script call over keys of one slot, sent again (within the
    /// timeout) only when a node refused it unrun.
    async fn call(
        &self,
        mode: &str,
        keys: &[String],
        requests: &[Request],
    ) -> Result<Vec<i64>, Error> {
        let work = async {
            let mut connection = self.connection().await?;
            let invocation = invocation(mode, keys.iter().zip(requests.iter().copied()));
            let mut wait = Duration::from_millis(2);
            loop {
                match invoke(&invocation, &mut connection).await {
                    Err(error) if refused_unrun(&error) => {
                        // The slot map is being refreshed (the client starts
                        // that on a redirect); give it a moment.
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_millis(50));
                    }
                    result => return Ok::<Vec<i64>, Error>(result?),
                }
            }
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
    }

    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let key = self.full_key(key);
        let reply = self
            .call(
                "each",
                std::slice::from_ref(&key),
                &[Request::new(quota, cost, self.now())],
            )
            .await?;
        decode_one(&reply, quota, cost, &key)
    }

    /// The decision a request of `cost` would get now, with nothing written.
    pub(crate) async fn peek(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let key = self.full_key(key);
        let reply = self
            .call(
                "peek",
                std::slice::from_ref(&key),
                &[Request::new(quota, cost, self.now())],
            )
            .await?;
        decode_one(&reply, quota, cost, &key)
    }

    /// Deletes `key`'s state: its quota is whole again.
    pub(crate) async fn reset(&self, key: &str) -> Result<(), Error> {
        let work = async {
            let mut connection = self.connection().await?;
            redis::cmd("DEL")
                .arg(self.full_key(key))
                .query_async::<i64>(&mut connection)
                .await
                .map_err(Error::from)
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| Error::Timeout(self.timeout))??;
        Ok(())
    }

    /// All or nothing over keys that may live on different slots.
    pub(crate) async fn decide_all(
        &self,
        requests: &[(&Quota, &str, u64)],
    ) -> Result<Vec<Decision>, Error> {
        let now = self.now();
        let keys: Vec<String> = requests
            .iter()
            .map(|(_, key, _)| self.full_key(key))
            .collect();
        // Across slots a dimension may be refunded: its sliding-log
        // admissions carry a tag the refund removes them by.
        let calls: Vec<Request> = requests
            .iter()
            .map(|(q, _, c)| Request::tagged(q, *c, now, refund_tag()))
            .collect();
        let first_slot = keys.first().map(|k| slot(k.as_bytes()));
        if keys.iter().all(|k| Some(slot(k.as_bytes())) == first_slot) {
            let reply = self.call("all", &keys, &calls).await?;
            return decode_all(&reply, requests, &keys);
        }
        // Across slots: consume in order; on a denial (or a failure), give
        // back what the earlier dimensions took.
        let mut decisions = Vec::with_capacity(requests.len());
        for (i, ((quota, _, cost), key)) in requests.iter().zip(&keys).enumerate() {
            let outcome = self
                .call("each", std::slice::from_ref(key), &calls[i..=i])
                .await
                .and_then(|reply| decode_one(&reply, quota, *cost, key));
            let admitted = matches!(&outcome, Ok(d) if d.allowed);
            if !admitted {
                for j in 0..i {
                    if decisions.get(j).is_some_and(|d: &Decision| d.allowed) {
                        // A refund that fails leaves the dimension consumed:
                        // it under-admits, never over-admits.
                        if let Err(error) = self.call("refund", &keys[j..=j], &calls[j..=j]).await {
                            tracing::warn!(key = %keys[j], %error, "could not give back a multi-dimension check's tokens");
                        }
                    }
                }
            }
            let decision = outcome?;
            decisions.push(decision);
            if !admitted {
                // The later dimensions were not asked; report them as not admitted.
                for (quota, _, _) in &requests[i + 1..] {
                    decisions.push(Decision::from_micros(false, quota.capacity(), 0, 0, 0, 0));
                }
                return Ok(decisions);
            }
        }
        Ok(decisions)
    }
}

/// Whether a node refused a call without running it, so that sending it
/// again cannot apply it twice.
fn refused_unrun(error: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as Kind;
    matches!(
        error.kind(),
        redis::ErrorKind::Server(
            Kind::Moved | Kind::Ask | Kind::TryAgain | Kind::ClusterDown | Kind::ReadOnly
        )
    )
}

/// A tag unique to one request, below 2^53 (Lua's doubles hold it exactly)
/// and never 0 (no tag).
fn refund_tag() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: once_cell::sync::Lazy<u64> =
        once_cell::sync::Lazy::new(|| RandomState::new().hash_one(std::process::id()));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (RandomState::new().hash_one((*SEED, n)) & ((1 << 53) - 1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(
            slot(b"foo{}{bar}"),
            slot(b"foo{}{bar}"),
            "an empty tag hashes the whole key"
        );
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }
}
