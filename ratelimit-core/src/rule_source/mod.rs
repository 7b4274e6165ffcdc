//! Rules kept in Redis, shared by every instance: a hash of rule texts (field
//! = rule name, value = the rule's text form) and a channel on which a change
//! is announced (message = the rule's name, or `*` for all of them).
//!
//! Each instance reads the whole hash when it starts, applies each announced
//! change as it arrives, and reads the whole hash again every
//! [`reload_every`](RedisRuleSourceBuilder::reload_every), so a change whose
//! message was missed (the instance was disconnected, or someone wrote the
//! hash with `HSET` alone) is applied all the same.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::AsyncConnectionConfig;
use tokio::sync::watch;

use crate::error::{ConfigError, Error};
use crate::limiter::Limiter;
use crate::quota::Quota;
use crate::rules::{is_valid_name, RuleError, Rules};

mod follower;

use follower::{within, Follower, Lost};

/// The hash that holds the rules unless [`RedisRuleSourceBuilder::hash`]
/// names another. Outside the limiter's default `rl:` prefix, so no rate
/// limit key can collide with it.
pub const DEFAULT_RULES_HASH: &str = "ratelimit:rules";

/// The channel on which changes are announced unless
/// [`RedisRuleSourceBuilder::channel`] names another.
pub const DEFAULT_RULES_CHANNEL: &str = "ratelimit:rules:changed";

/// How often the whole hash is read again by default.
pub const DEFAULT_RELOAD_EVERY: Duration = Duration::from_secs(10);

/// Keeps a [`Rules`] in step with rules stored in Redis, until dropped.
///
/// Start one per instance, on the limiter whose rules it keeps:
///
/// ```no_run
/// use std::time::Duration;
/// use ratelimit_core::{Limiter, RedisRuleSource};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::builder().redis("redis://10.0.0.5:6379").build()?;
/// let rules = RedisRuleSource::builder("redis://10.0.0.5:6379")
///     .reload_every(Duration::from_secs(10))
///     .start(&limiter)?;
/// rules.ready().await?; // optional: wait for the first read of the hash
///
/// // Anywhere, any instance: validated, stored, announced; every instance
/// // applies it within moments.
/// RedisRuleSource::publish("redis://10.0.0.5:6379", "order_submit", "capacity=20 rate=5/s").await?;
/// # Ok(())
/// # }
/// ```
///
/// What it guarantees:
///
/// - a rule in the hash is applied on every instance as soon as its message
///   arrives, and in any case at the next periodic read;
/// - an invalid rule text is rejected with an error logged (once per text),
///   and the rule it would replace stays in force;
/// - a rule removed from the hash is removed from [`Rules`], so the
///   attribute's own numbers apply again; rules the application set itself
///   under other names are left alone;
/// - when Redis is unreachable the rules in force stay as they are, and the
///   source reconnects with a jittered backoff (up to
///   [`max_backoff`](RedisRuleSourceBuilder::max_backoff)); it logs the
///   outage once, and again when it is over. A read Redis refuses for good
///   (another type at the hash's key, an ACL user without `HGETALL`) is
///   logged as an error and tried again at the next periodic read, one it
///   refuses for a while (still loading) on the backoff; [`ready`](Self::ready)
///   waits for the first read that succeeds. A user not allowed the channel
///   is told so by an error logged, and gets the rules at the periodic reads
///   alone. It never panics;
/// - on Redis Cluster, from any node: the hash is read on the master of its
///   slot, and the channel followed on the node given;
/// - messages cost Redis a read of each rule they name, and a flood of them
///   at most ten reads of the whole hash a second per instance: the
///   messages that arrive meanwhile are answered together.
#[must_use = "the source stops when dropped"]
pub struct RedisRuleSource {
    task: tokio::task::JoinHandle<()>,
    ready: watch::Receiver<bool>,
}

impl RedisRuleSource {
    /// Starts configuring a source reading Redis at `url`.
    pub fn builder(url: impl Into<String>) -> RedisRuleSourceBuilder {
        RedisRuleSourceBuilder {
            url: url.into(),
            hash: DEFAULT_RULES_HASH.to_owned(),
            channel: DEFAULT_RULES_CHANNEL.to_owned(),
            reload_every: DEFAULT_RELOAD_EVERY,
            timeout: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
            tls: crate::tls::TlsConfig::default(),
            sentinel: None,
        }
    }

    /// Starts configuring a source reading the Redis master that Redis
    /// Sentinel names `master`, given any of the Sentinels, as
    /// [`LimiterBuilder::sentinel`](crate::LimiterBuilder::sentinel). The
    /// Sentinels are asked again at each reconnection, so the source follows
    /// a failover.
    pub fn sentinel<I, S>(master: impl Into<String>, sentinels: I) -> RedisRuleSourceBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisRuleSourceBuilder {
            sentinel: Some((
                master.into(),
                sentinels.into_iter().map(Into::into).collect(),
            )),
            ..Self::builder("")
        }
    }

    /// Validates `rule` (the [text form](RuleError)), stores it as the rule
    /// `name` in the default hash and announces it on the default channel,
    /// in one transaction. Returns the quota every instance will apply.
    ///
    /// An invalid name or rule is an error, and nothing is written.
    pub async fn publish(url: &str, name: &str, rule: &str) -> Result<Quota, PublishError> {
        Self::builder(url).publish(name, rule).await
    }

    /// Removes the rule `name` from the default hash and announces it: every
    /// instance goes back to the attribute's own numbers. Returns whether the
    /// rule was there.
    pub async fn remove(url: &str, name: &str) -> Result<bool, PublishError> {
        Self::builder(url).remove(name).await
    }

    /// Waits until the whole hash has been read once: until then, only the
    /// rules set before the source started are in force. An error when the
    /// source stopped before that, its runtime having shut down
    /// ([`Error::NoRuntime`]): it will read nothing more.
    pub async fn ready(&self) -> Result<(), Error> {
        let mut ready = self.ready.clone();
        // An error: the task ended, as its runtime shut down (`stop` and
        // drop take `self`).
        let read = ready.wait_for(|ready| *ready).await.is_ok();
        if read {
            Ok(())
        } else {
            Err(Error::NoRuntime {
                what: "a rule source (its runtime shut down before it read the rules)",
            })
        }
    }

    /// Whether the whole hash has been read at least once.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Stops following Redis. The rules in force stay as they are.
    pub fn stop(self) {}
}

impl Drop for RedisRuleSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl fmt::Debug for RedisRuleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisRuleSource")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

/// Configures a [`RedisRuleSource`], and publishes rules to the same hash
/// and channel.
#[derive(Clone)]
#[must_use]
pub struct RedisRuleSourceBuilder {
    url: String,
    hash: String,
    channel: String,
    reload_every: Duration,
    timeout: Duration,
    max_backoff: Duration,
    tls: crate::tls::TlsConfig,
    /// The master's name and the Sentinels' URLs, when Redis Sentinel names
    /// the Redis to read (then `url` is unused).
    sentinel: Option<(String, Vec<String>)>,
}

/// The URLs without their passwords.
impl fmt::Debug for RedisRuleSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::backend::redis::redacted;
        let sentinel = self.sentinel.as_ref().map(|(master, urls)| {
            (
                master,
                urls.iter().map(|url| redacted(url)).collect::<Vec<_>>(),
            )
        });
        f.debug_struct("RedisRuleSourceBuilder")
            .field("url", &redacted(&self.url))
            .field("hash", &self.hash)
            .field("channel", &self.channel)
            .field("reload_every", &self.reload_every)
            .field("timeout", &self.timeout)
            .field("max_backoff", &self.max_backoff)
            .field("tls", &self.tls)
            .field("sentinel", &sentinel)
            .finish()
    }
}

impl RedisRuleSourceBuilder {
    /// The hash holding the rules (default [`DEFAULT_RULES_HASH`]).
    pub fn hash(mut self, hash: impl Into<String>) -> Self {
        self.hash = hash.into();
        self
    }

    /// The channel announcing changes (default [`DEFAULT_RULES_CHANNEL`]).
    pub fn channel(mut self, channel: impl Into<String>) -> Self {
        self.channel = channel.into();
        self
    }

    /// How often the whole hash is read again, in case a message was missed
    /// (default [`DEFAULT_RELOAD_EVERY`], 10 s). A period over a year is
    /// taken for a year.
    pub fn reload_every(mut self, every: Duration) -> Self {
        self.reload_every = every;
        self
    }

    /// The bound on connecting and on every command (default 1 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest wait between two reconnection attempts (default 1 s):
    /// attempts start 50 ms apart and double up to this.
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max;
        self
    }

    /// Certificates for a `rediss://` URL, as [`LimiterBuilder::tls`](crate::LimiterBuilder::tls).
    pub fn tls(mut self, tls: crate::tls::TlsConfig) -> Self {
        self.tls = tls;
        self
    }

    /// Starts keeping `limiter`'s [rules](Limiter::rules) in step with Redis.
    pub fn start(self, limiter: &Limiter) -> Result<RedisRuleSource, Error> {
        self.spawn(limiter.rules())
    }

    /// Starts keeping `rules` in step with Redis, on the current Tokio
    /// runtime. Fails on an invalid URL or configuration, or outside a
    /// runtime; never because Redis is unreachable, which the source waits
    /// out.
    ///
    /// ```
    /// use ratelimit_core::{Error, RedisRuleSource, Rules};
    ///
    /// let rules = Rules::new();
    /// let outside = RedisRuleSource::builder("redis://127.0.0.1:6379").spawn(&rules);
    /// assert!(matches!(outside, Err(Error::NoRuntime { .. })), "no runtime to run on");
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// // Nothing listens on port 1: the source keeps trying, the rules stay.
    /// let source = RedisRuleSource::builder("redis://127.0.0.1:1").spawn(&rules)?;
    /// tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    /// assert!(!source.is_ready());
    /// drop(source); // stops it
    /// # Ok::<(), Error>(())
    /// # }).unwrap();
    /// ```
    pub fn spawn(self, rules: &Rules) -> Result<RedisRuleSource, Error> {
        let endpoint = self.endpoint()?;
        for (setting, value) in [
            ("reload_every", self.reload_every),
            ("timeout", self.timeout),
            ("max_backoff", self.max_backoff),
        ] {
            if value.is_zero() {
                return Err(ConfigError::NotPositive { setting }.into());
            }
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime {
            what: "a rule source",
        })?;
        let (ready_tx, ready) = watch::channel(false);
        let follower = Follower {
            endpoint,
            config: self,
            rules: rules.clone(),
            loaded: HashSet::new(),
            rejected: HashMap::new(),
            announced_read_at: None,
            unread_logged: None,
            ready: ready_tx,
        };
        Ok(RedisRuleSource {
            task: runtime.spawn(follower.run()),
            ready,
        })
    }

    /// [`RedisRuleSource::publish`] to this builder's hash and channel.
    ///
    /// The rule is checked before anything is sent:
    ///
    /// ```
    /// use ratelimit_core::{PublishError, RedisRuleSource};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let rules = RedisRuleSource::builder("redis://127.0.0.1:6379").hash("shop:rules");
    /// let err = rules.publish("checkout", "capacity=10 rate=10/fortnight").await.unwrap_err();
    /// assert!(matches!(err, PublishError::InvalidRule { .. }));
    /// assert_eq!(
    ///     err.to_string(),
    ///     "invalid rule `checkout`: invalid rate `10/fortnight`; expected a form such as \
    ///      \"5/s\", \"100/min\", \"3600/h\" or \"1000/d\""
    /// );
    /// let err = rules.publish("*", "capacity=10 rate=10/s").await.unwrap_err();
    /// assert!(matches!(err, PublishError::InvalidName(_)));
    /// # });
    /// ```
    pub async fn publish(&self, name: &str, rule: &str) -> Result<Quota, PublishError> {
        validate(name, rule)?;
        let mut connection = self.connect().await?;
        self.publish_on(&mut connection, name, rule).await
    }

    /// [`RedisRuleSource::remove`] from this builder's hash.
    pub async fn remove(&self, name: &str) -> Result<bool, PublishError> {
        check_name(name)?;
        let mut connection = self.connect().await?;
        self.remove_on(&mut connection, name).await
    }

    /// [`publish`](Self::publish) on a connection the caller already has.
    pub async fn publish_on<C: ConnectionLike + Send>(
        &self,
        connection: &mut C,
        name: &str,
        rule: &str,
    ) -> Result<Quota, PublishError> {
        let quota = validate(name, rule)?;
        let write = redis::pipe()
            .atomic()
            .hset(&self.hash, name, rule.trim())
            .ignore()
            .publish(&self.channel, name)
            .ignore()
            .to_owned();
        within(self.timeout, write.query_async::<()>(connection))
            .await
            .map_err(Lost::into_error)?;
        Ok(quota)
    }

    /// [`remove`](Self::remove) on a connection the caller already has.
    pub async fn remove_on<C: ConnectionLike + Send>(
        &self,
        connection: &mut C,
        name: &str,
    ) -> Result<bool, PublishError> {
        check_name(name)?;
        let write = redis::pipe()
            .atomic()
            .hdel(&self.hash, name)
            .publish(&self.channel, name)
            .ignore()
            .to_owned();
        let (removed,): (u64,) = within(self.timeout, write.query_async(connection))
            .await
            .map_err(Lost::into_error)?;
        Ok(removed > 0)
    }

    /// Where the rules are: the URL, or the master the Sentinels name.
    fn endpoint(&self) -> Result<crate::backend::redis::Endpoint, Error> {
        use crate::backend::redis::{open_client, Endpoint};
        match &self.sentinel {
            Some((master, sentinels)) => Endpoint::sentinel(master, sentinels, &self.tls),
            None => Ok(Endpoint::Fixed(open_client(&self.url, &self.tls)?)),
        }
    }

    async fn connect(&self) -> Result<redis::aio::MultiplexedConnection, Error> {
        let client = self.endpoint()?.client(self.timeout).await?;
        self.connect_to_hash(&client)
            .await
            .map_err(Lost::into_error)
    }

    /// A connection to the node that serves the hash: on a Redis Cluster,
    /// the master of its slot, which an `HGET` of the hash sent first names
    /// with `MOVED` (a command the source needs anyway, so an ACL user
    /// allowed the source's commands is allowed it; messages reach every
    /// node of a cluster, so the channel is followed on any); elsewhere,
    /// the server `client` reaches.
    async fn connect_to_hash(
        &self,
        client: &redis::Client,
    ) -> Result<redis::aio::MultiplexedConnection, Lost> {
        let config = self.connection_config();
        let mut connection = within(
            self.timeout,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        // The empty field is never a rule's name.
        let mut probe = redis::cmd("HGET");
        probe.arg(&self.hash).arg("");
        let asked = probe.query_async::<Option<Vec<u8>>>(&mut connection);
        let moved = match within(self.timeout, asked).await {
            Err(Lost::Redis(error))
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) =>
            {
                error
            }
            // Any other refusal is the reads' own to report.
            _ => return Ok(connection),
        };
        let Some(owner) = moved
            .redirect_node()
            .and_then(|(address, _)| moved_to(client, address))
        else {
            return Err(Lost::Redis(moved));
        };
        within(
            self.timeout,
            owner.get_multiplexed_async_connection_with_config(&config),
        )
        .await
    }

    fn connection_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
    }
}

/// A client of the node at `address` (`host:port`, from a `MOVED`), with
/// `client`'s credentials and TLS settings.
fn moved_to(client: &redis::Client, address: &str) -> Option<redis::Client> {
    let (host, port) = address.rsplit_once(':')?;
    let (host, port) = (host.to_owned(), port.parse().ok()?);
    let info = client.get_connection_info().clone();
    let addr = match info.addr().clone() {
        redis::ConnectionAddr::Tcp(..) => redis::ConnectionAddr::Tcp(host, port),
        redis::ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => redis::ConnectionAddr::TcpTls {
            host,
            port,
            insecure,
            tls_params,
        },
        _ => return None,
    };
    redis::Client::open(info.set_addr(addr)).ok()
}

fn validate(name: &str, rule: &str) -> Result<Quota, PublishError> {
    check_name(name)?;
    rule.parse().map_err(|error| PublishError::InvalidRule {
        name: name.to_owned(),
        error,
    })
}

fn check_name(name: &str) -> Result<(), PublishError> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(PublishError::InvalidName(name.to_owned()))
    }
}

/// Why a rule could not be published or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// A name the attribute could not use.
    #[error(
        "invalid rule name `{0}`; use 1 to 128 letters, digits and `_`, `-`, `.`, `:`, `/`, \
         as in `rule = \"order_submit\"`"
    )]
    InvalidName(String),
    /// A rule text that does not parse; nothing was written.
    #[error("invalid rule `{name}`: {error}")]
    InvalidRule {
        /// The rule's name.
        name: String,
        /// What is wrong with its text.
        #[source]
        error: RuleError,
    },
    /// Redis failed or did not answer in time.
    #[error(transparent)]
    Redis(#[from] Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sentinel URLs are reached all over TLS or none, for the limiter and
    /// the rule source alike: half of them over TLS, or certificates for
    /// plain URLs, are refused when built; all of them over TLS build.
    // TLS URLs build only with the `tls` feature.
    #[cfg(feature = "tls")]
    #[test]
    fn sentinel_urls_are_all_over_tls_or_none() {
        let ca = crate::TlsConfig::new().root_certificate(b"-----BEGIN CERTIFICATE-----".to_vec());
        let half = ["rediss://127.0.0.1:26379", "redis://127.0.0.1:26380"];
        assert!(matches!(
            Limiter::builder().sentinel("main", half).build(),
            Err(Error::Config(ConfigError::Unsupported { .. }))
        ));
        assert!(matches!(
            RedisRuleSource::sentinel("main", half).endpoint(),
            Err(Error::Config(ConfigError::Unsupported { .. }))
        ));
        assert!(matches!(
            Limiter::builder()
                .sentinel("main", ["redis://127.0.0.1:26379"])
                .tls(ca)
                .build(),
            Err(Error::Config(ConfigError::TlsWithoutRediss { .. }))
        ));
        let all = ["rediss://127.0.0.1:26379", "rediss://127.0.0.1:26380"];
        assert!(Limiter::builder().sentinel("main", all).build().is_ok());
        assert!(RedisRuleSource::sentinel("main", all).endpoint().is_ok());
    }

    /// A source whose runtime shut down before it read the rules says so
    /// when waited on, rather than seem ready.
    #[test]
    fn ready_says_when_the_source_stopped_unread() {
        let rules = Rules::new();
        let other = tokio::runtime::Runtime::new().unwrap();
        let source = {
            let _on = other.enter();
            RedisRuleSource::builder("redis://127.0.0.1:1")
                .spawn(&rules)
                .unwrap()
        };
        drop(other);
        let here = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ready = here.block_on(source.ready());
        assert!(matches!(ready, Err(Error::NoRuntime { .. })), "{ready:?}");
        assert!(!source.is_ready());
    }

    /// Each Sentinel is reached with its own URL's user and password, but
    /// certificates (which reach the master only through one set of
    /// credentials for every Sentinel) ask the same of every URL; a URL's
    /// TLS is read as redis-rs reads it, whatever the scheme's spelling.
    // TLS URLs build only with the `tls` feature.
    #[cfg(feature = "tls")]
    #[test]
    fn sentinel_credentials_and_tls_schemes() {
        let ca = crate::TlsConfig::new().root_certificate(b"-----BEGIN CERTIFICATE-----".to_vec());
        let plain = ["redis://:a@127.0.0.1:26379", "redis://127.0.0.1:26380"];
        assert!(Limiter::builder().sentinel("main", plain).build().is_ok());
        let certified = Limiter::builder()
            .sentinel(
                "main",
                ["rediss://:a@127.0.0.1:26379", "rediss://:b@127.0.0.1:26380"],
            )
            .tls(ca.clone())
            .build();
        let Err(Error::Config(refused @ ConfigError::Unsupported { .. })) = certified else {
            panic!("{certified:?}");
        };
        assert!(!refused.to_string().contains(":a@"), "{refused}");
        #[cfg(feature = "cluster")]
        for url in ["valkeys://127.0.0.1:7000", "REDISS://127.0.0.1:7000"] {
            let built = Limiter::builder().cluster([url]).tls(ca.clone()).build();
            assert!(
                !matches!(
                    built,
                    Err(Error::Config(ConfigError::TlsWithoutRediss { .. }))
                ),
                "{url}: {built:?}"
            );
        }
        for half in [
            ["valkeys://127.0.0.1:26379", "redis://127.0.0.1:26380"],
            ["REDISS://127.0.0.1:26379", "redis://127.0.0.1:26380"],
        ] {
            assert!(
                matches!(
                    Limiter::builder().sentinel("main", half).build(),
                    Err(Error::Config(ConfigError::Unsupported { .. }))
                ),
                "{half:?}"
            );
        }
    }

    #[test]
    fn a_builder_shows_its_urls_without_their_passwords() {
        for builder in [
            RedisRuleSource::builder("redis://svc:s3cret@127.0.0.1:6390/0"),
            RedisRuleSource::builder("redis+unix:///tmp/r.sock?pass=s3cret"),
            RedisRuleSource::sentinel("main", ["redis://:s3cret@127.0.0.1:26379"]),
        ] {
            let shown = format!("{builder:?}");
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
    }
}
