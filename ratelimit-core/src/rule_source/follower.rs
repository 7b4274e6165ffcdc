//! Keeping one instance's rules in step: reading the hash, following the
//! channel, reading again on a timer, and backing off while Redis is away.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher as _;
use std::time::Duration;

use futures_util::{FutureExt as _, StreamExt as _};
use redis::RedisError;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use crate::error::Error;
use crate::quota::Quota;
use crate::rules::{is_valid_name, RuleError, Rules, MAX_RULE_TEXT};

use super::RedisRuleSourceBuilder;

/// The most channel messages taken at once, of those already received:
/// each is only noted (a name, or the whole hash), so a flood of them is
/// taken as fast as it arrives and answered by a few reads. The bound keeps
/// a flood faster than that from holding the follower forever.
const MAX_MESSAGES_AT_ONCE: usize = 100_000;

/// Above this many rules named by messages answered together, the whole
/// hash is read once instead of each rule.
const MAX_NAMES_READ_ALONE: usize = 8;

/// How often the subscription's connection is pinged.
const ALIVE_EVERY: Duration = Duration::from_secs(1);

/// The least time between two reads of the whole hash asked for by
/// messages: a flood of `*` costs Redis ten reads a second per instance.
const MIN_ANNOUNCED_READ_GAP: Duration = Duration::from_millis(100);

/// What the channel's messages taken together announce.
#[derive(Default)]
struct Announced {
    /// The rules named, each once; at most `MAX_NAMES_READ_ALONE`.
    names: Vec<String>,
    /// Whether the whole hash is to be read: a message named every rule
    /// (`*`, empty) or none, or more rules were named than are read alone.
    whole: bool,
    /// Messages that named no rule, and the start and length of the first.
    unnamed: usize,
    first_unnamed: Option<(String, usize)>,
}

impl Announced {
    fn note(&mut self, payload: &[u8]) {
        match std::str::from_utf8(payload).map(str::trim) {
            Ok(name) if is_valid_name(name) => {
                if !self.whole && !self.names.iter().any(|n| n == name) {
                    self.names.push(name.to_owned());
                    self.whole = self.names.len() > MAX_NAMES_READ_ALONE;
                }
            }
            Ok(all) if all.is_empty() || all == "*" => self.whole = true,
            _ => {
                self.whole = true;
                self.unnamed += 1;
                // The start of it: a message can be as long as Redis allows.
                self.first_unnamed.get_or_insert_with(|| {
                    let shown = &payload[..payload.len().min(64)];
                    (logged(shown), payload.len())
                });
            }
        }
        // The whole hash is read: no name is read alone.
        if self.whole {
            self.names.clear();
        }
    }
}

/// Notes the messages already received, up to `MAX_MESSAGES_AT_ONCE`.
fn take_waiting<M>(messages: &mut M, announced: &mut Announced) -> Result<(), Lost>
where
    M: futures_util::Stream<Item = redis::Msg> + Unpin,
{
    for _ in 0..MAX_MESSAGES_AT_ONCE {
        match messages.next().now_or_never() {
            Some(Some(message)) => announced.note(message.get_payload_bytes()),
            Some(None) => return Err(Lost::Closed),
            None => break,
        }
    }
    Ok(())
}

/// Why a connection to Redis is given up.
pub(super) enum Lost {
    Redis(RedisError),
    Timeout(Duration),
    /// The whole hash was not read within the timeout, on a connection
    /// that answered the subscription: most likely a hash too large to
    /// read in that time, which reconnecting does not make smaller.
    SlowRead(Duration),
    Closed,
    /// The Redis to read could not be found (no Sentinel answered).
    Endpoint(Error),
}

impl Lost {
    pub(super) fn into_error(self) -> Error {
        match self {
            Lost::Redis(error) => Error::Redis(error),
            Lost::Timeout(timeout) | Lost::SlowRead(timeout) => Error::Timeout(timeout),
            Lost::Closed => Error::UnexpectedReply("the connection was closed".into()),
            Lost::Endpoint(error) => error,
        }
    }

    /// Whether Redis refused the read for good, until someone changes its
    /// data or its users: another type at the hash's key, or a user not
    /// allowed the read.
    fn lasts(&self) -> bool {
        match self {
            Lost::Redis(error) => {
                error.code() == Some("WRONGTYPE")
                    || error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            }
            Lost::SlowRead(_) => true,
            _ => false,
        }
    }

    /// Whether the connection must be replaced, rather than the command
    /// tried again later (a server error such as `WRONGTYPE` does not
    /// improve by reconnecting).
    fn is_connection(&self) -> bool {
        match self {
            Lost::Redis(error) => {
                error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_unrecoverable_error()
                    // The hash's slot moved: to its new master.
                    || matches!(
                        error.kind(),
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::Moved | redis::ServerErrorKind::Ask
                        )
                    )
            }
            Lost::Timeout(_) | Lost::Closed | Lost::Endpoint(_) => true,
            // A server that froze meanwhile fails the subscription's ping,
            // which reconnects.
            Lost::SlowRead(_) => false,
        }
    }
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lost::Redis(error) => write!(f, "{error}"),
            Lost::Timeout(timeout) => write!(f, "no answer within {timeout:?}"),
            Lost::SlowRead(timeout) => write!(
                f,
                "the whole hash was not read within {timeout:?}; a hash this large needs a \
                 longer `RedisRuleSourceBuilder::timeout`, or fewer rules (rules named by \
                 announcements are still read, one by one)"
            ),
            Lost::Closed => f.write_str("the subscription connection was closed"),
            Lost::Endpoint(error) => write!(f, "{error}"),
        }
    }
}

pub(super) async fn within<T>(
    timeout: Duration,
    future: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, Lost> {
    match tokio::time::timeout(timeout, future).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(Lost::Redis(error)),
        Err(_) => Err(Lost::Timeout(timeout)),
    }
}

/// The task behind a [`RedisRuleSource`].
pub(super) struct Follower {
    /// Asked for a client at each (re)connection, so a Sentinel-served
    /// master is followed through a failover.
    pub(super) endpoint: crate::backend::redis::Endpoint,
    pub(super) config: RedisRuleSourceBuilder,
    pub(super) rules: Rules,
    /// The names this source set: a name gone from the hash is removed only
    /// if the source set it, never one the application set on its own.
    pub(super) loaded: HashSet<String>,
    /// The last rejected text of each field (its name as stored, and a
    /// fingerprint of its text), so that an invalid rule is logged, and
    /// read, once rather than at every reload; only fields the hash still
    /// holds are kept.
    pub(super) rejected: HashMap<Vec<u8>, u64>,
    /// When the last read of the whole hash asked for by messages was made.
    pub(super) announced_read_at: Option<Instant>,
    /// The last refused read logged, and when: a refusal that lasts (the
    /// hash replaced by another type, an ACL) is logged again once a second
    /// at most, however many messages name a rule meanwhile.
    pub(super) unread_logged: Option<(Instant, String)>,
    pub(super) ready: watch::Sender<bool>,
}

impl Follower {
    pub(super) async fn run(mut self) {
        let mut attempt = 0u32;
        let mut outage_since: Option<Instant> = None;
        loop {
            let lost = match self.follow(&mut attempt, &mut outage_since).await {
                Err(lost) => lost,
                Ok(never) => match never {},
            };
            if outage_since.is_none() {
                outage_since = Some(Instant::now());
                tracing::warn!(
                    hash = %self.config.hash,
                    error = %lost,
                    "rule source cannot reach Redis; the rules in force stay as they are while it reconnects"
                );
            } else {
                tracing::debug!(error = %lost, attempt, "rule source still cannot reach Redis");
            }
            tokio::time::sleep(self.backoff(attempt)).await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// 50 ms doubling up to `max_backoff`, each wait jittered by ±25% so that
    /// instances do not reconnect in step.
    fn backoff(&self, attempt: u32) -> Duration {
        let base = Duration::from_millis(50)
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.config.max_backoff);
        let jitter = RandomState::new().hash_one(attempt) % 501;
        base.mul_f64(0.75 + jitter as f64 / 1_000.0)
    }

    /// Subscribes, reads the whole hash, then applies announced changes and
    /// reads the hash again periodically, until the connection is lost.
    async fn follow(
        &mut self,
        attempt: &mut u32,
        outage_since: &mut Option<Instant>,
    ) -> Result<Infallible, Lost> {
        let timeout = self.config.timeout;
        let client = self
            .endpoint
            .client(timeout)
            .await
            .map_err(Lost::Endpoint)?;
        let pubsub = within(timeout, client.get_async_pubsub()).await?;
        let (mut sink, mut messages) = pubsub.split();
        // A user the ACL does not allow the channel gets the rules at the
        // periodic reads alone: a misconfiguration, said as one.
        let subscribed = match within(timeout, sink.subscribe(&self.config.channel)).await {
            Ok(()) => true,
            Err(Lost::Redis(error))
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
            {
                tracing::error!(
                    channel = %self.config.channel,
                    %error,
                    every = ?self.config.reload_every,
                    "rule source may not subscribe to its channel (grant the ACL user \
                     `&<channel>`); changes apply at the periodic reads only"
                );
                false
            }
            Err(lost) => return Err(lost),
        };
        let mut connection = self.config.connect_to_hash(&client).await?;
        // Subscribed before reading: a change made in between is in the
        // read, or in a message, or both; never in neither. A refusal that
        // lasts (`WRONGTYPE`, an ACL without `HGETALL`) is logged as what
        // it is, and the read is tried again on the timer, rather than by
        // reconnecting twice a second; one that passes (a server still
        // loading, a script running) is tried again on the backoff.
        let read = match self.reload(&mut connection).await {
            Err(lost) if lost.is_connection() || !lost.lasts() => return Err(lost),
            Err(error) => {
                self.after_slow_read(&error, &client, &mut connection)
                    .await?;
                self.unread(&error);
                false
            }
            Ok(()) => true,
        };
        *attempt = 0;
        if let Some(since) = outage_since.take() {
            tracing::info!(
                hash = %self.config.hash,
                after = ?since.elapsed(),
                read,
                "rule source reached Redis again"
            );
        }
        // A year stands for any longer period ("never"), which would
        // overflow the clock.
        let every = self
            .config
            .reload_every
            .min(Duration::from_secs(365 * 86_400));
        let mut reload = tokio::time::interval_at(Instant::now() + every, every);
        reload.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The subscription's connection can die silently (a peer gone, a
        // NAT that forgets the flow): a ping finds out, however long the
        // reads' period.
        let mut alive = tokio::time::interval_at(Instant::now() + ALIVE_EVERY, ALIVE_EVERY);
        alive.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let result = tokio::select! {
                message = messages.next(), if subscribed => match message {
                    Some(message) => {
                        // Every message already here is answered at once:
                        // a flood of them costs a few reads, not one each.
                        let mut announced = Announced::default();
                        announced.note(message.get_payload_bytes());
                        take_waiting(&mut messages, &mut announced)?;
                        self.on_announced(&mut connection, &mut messages, announced)
                            .await
                    }
                    None => return Err(Lost::Closed),
                },
                _ = reload.tick() => self.reload(&mut connection).await,
                _ = alive.tick() => {
                    // The reads' connection too: pinged, it is never idle
                    // long enough for the server to close it (`timeout` in
                    // redis.conf), which the next read would find.
                    let ping = redis::cmd("PING");
                    let reads = ping.query_async::<redis::Value>(&mut connection);
                    let (subscription, reads) = tokio::join!(
                        within(timeout, sink.ping::<redis::Value>()),
                        within(timeout, reads),
                    );
                    // Any answer, a refusal included (a user the ACL does
                    // not allow `PING`), says a connection lives.
                    match (subscription, reads) {
                        (Err(lost), _) | (_, Err(lost)) if lost.is_connection() => Err(lost),
                        _ => Ok(()),
                    }
                }
            };
            match result {
                Err(lost) if lost.is_connection() => return Err(lost),
                Err(error) => {
                    self.after_slow_read(&error, &client, &mut connection)
                        .await?;
                    self.unread(&error);
                }
                Ok(()) => {}
            }
        }
    }

    /// After a read of the whole hash that took too long, a connection of
    /// its own for the reads to come: the rest of that read's answer still
    /// comes on the old one, ahead of anything asked after it. A server that
    /// does not answer the new one's `PING` either is not slow to read but
    /// gone (frozen, say): that is the error, an outage.
    async fn after_slow_read(
        &self,
        error: &Lost,
        client: &redis::Client,
        connection: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), Lost> {
        if matches!(error, Lost::SlowRead(_)) {
            // Replaced before the ping: the old one goes, with the rest of
            // the slow answer it would still read.
            *connection = self.config.connect_to_hash(client).await?;
            let ping = redis::cmd("PING");
            let pinged = within(
                self.config.timeout,
                ping.query_async::<redis::Value>(connection),
            )
            .await;
            if let Err(lost) = pinged {
                if lost.is_connection() {
                    return Err(lost);
                }
            }
        }
        Ok(())
    }

    /// Logs a read Redis refused (not a lost connection).
    fn unread(&mut self, error: &Lost) {
        let text = error.to_string();
        let now = Instant::now();
        if let Some((at, last)) = &self.unread_logged {
            if *last == text && now.duration_since(*at) < Duration::from_secs(1) {
                return;
            }
        }
        tracing::error!(
            hash = %self.config.hash,
            error = %text,
            "rule source could not read the rules; the rules in force stay as they are \
             (logged at most once a second)"
        );
        self.unread_logged = Some((now, text));
    }

    /// Applies what messages of the channel announced: the rules they
    /// name, each read once, or the whole hash.
    async fn on_announced<M>(
        &mut self,
        connection: &mut redis::aio::MultiplexedConnection,
        messages: &mut M,
        mut announced: Announced,
    ) -> Result<(), Lost>
    where
        M: futures_util::Stream<Item = redis::Msg> + Unpin,
    {
        if announced.whole {
            // However fast they are sent, reads of the whole hash for
            // messages are spaced; the messages that come meanwhile are
            // taken as they come (redis-rs queues them, unbounded, until
            // they are), noted, and answered by the same read.
            if let Some(at) = self.announced_read_at {
                let gap_ends = tokio::time::sleep_until(at + MIN_ANNOUNCED_READ_GAP);
                tokio::pin!(gap_ends);
                loop {
                    tokio::select! {
                        () = &mut gap_ends => break,
                        message = messages.next() => match message {
                            Some(message) => announced.note(message.get_payload_bytes()),
                            None => return Err(Lost::Closed),
                        },
                    }
                }
                take_waiting(messages, &mut announced)?;
            }
            if let Some((start, length)) = &announced.first_unnamed {
                tracing::warn!(
                    channel = %self.config.channel,
                    message = %start,
                    length,
                    count = announced.unnamed,
                    "rule source got messages that name no rule; reading every rule"
                );
            }
            self.announced_read_at = Some(Instant::now());
            return self.reload(connection).await;
        }
        let names = std::mem::take(&mut announced.names);
        for name in &names {
            let text: Option<Vec<u8>> = within(
                self.config.timeout,
                redis::cmd("HGET")
                    .arg(&self.config.hash)
                    .arg(name)
                    .query_async(connection),
            )
            .await?;
            let change = self.change(name, text.as_deref());
            self.rules.apply(change.as_slice());
        }
        Ok(())
    }

    /// Reads the whole hash and applies every difference at once.
    async fn reload(
        &mut self,
        connection: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), Lost> {
        // Bytes, not strings: one field that is not UTF-8 must not stop the
        // others from loading.
        let stored: Vec<(Vec<u8>, Vec<u8>)> = within(
            self.config.timeout,
            redis::cmd("HGETALL")
                .arg(&self.config.hash)
                .query_async(connection),
        )
        .await
        .map_err(|lost| match lost {
            // Ours, or the connection's own response timeout (the same).
            Lost::Timeout(_) => Lost::SlowRead(self.config.timeout),
            Lost::Redis(error) if error.is_timeout() => Lost::SlowRead(self.config.timeout),
            other => other,
        })?;
        let mut changes = Vec::new();
        let mut present = HashSet::new();
        let mut fields: HashSet<&[u8]> = HashSet::new();
        for (name, text) in &stored {
            fields.insert(name);
            match std::str::from_utf8(name) {
                Ok(name) if is_valid_name(name) => {
                    present.insert(name.to_owned());
                    changes.extend(self.change(name, Some(text)));
                }
                _ => {
                    if self.rejected.get(name) != Some(&fingerprint(text)) {
                        tracing::error!(
                            hash = %self.config.hash,
                            rule = %logged(name),
                            "rule source ignores a field that is not a valid rule name; use 1 to \
                             128 letters, digits and `_`, `-`, `.`, `:`, `/`"
                        );
                        self.rejected.insert(name.clone(), fingerprint(text));
                    }
                }
            }
        }
        let gone: Vec<String> = self
            .loaded
            .iter()
            .filter(|name| !present.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            changes.extend(self.change(&name, None));
        }
        self.rejected
            .retain(|name, _| fields.contains(name.as_slice()));
        self.rules.apply(&changes);
        self.ready.send_replace(true);
        Ok(())
    }

    /// What to do to `rules` for the rule `name` now stored as `text`
    /// (`None`: not in the hash): nothing, set it, or remove it. Logs what
    /// it does.
    fn change(&mut self, name: &str, text: Option<&[u8]>) -> Option<(String, Option<Quota>)> {
        let Some(raw) = text else {
            self.rejected.remove(name.as_bytes());
            if !self.loaded.remove(name) {
                return None;
            }
            tracing::info!(
                rule = name,
                "rule removed from Redis; the attribute's own quota applies again"
            );
            return Some((name.to_owned(), None));
        };
        let seen = fingerprint(raw);
        if self.rejected.get(name.as_bytes()) == Some(&seen) {
            // Rejected as it is, and logged.
            return None;
        }
        let parsed = if raw.len() > MAX_RULE_TEXT {
            // Not read whole: no rule is this long.
            Err(RuleError::TooLong(raw.len()))
        } else {
            String::from_utf8_lossy(raw).parse::<Quota>()
        };
        match parsed {
            Ok(quota) => {
                self.rejected.remove(name.as_bytes());
                let fresh = self.loaded.insert(name.to_owned());
                if !fresh && self.rules.get(name) == Some(quota) {
                    return None;
                }
                tracing::info!(rule = name, %quota, "rule changed from Redis");
                Some((name.to_owned(), Some(quota)))
            }
            Err(error) => {
                tracing::error!(
                    rule = name,
                    text = %logged(raw),
                    %error,
                    kept = ?self.rules.get(name),
                    "invalid rule in Redis rejected; the rule in force stays"
                );
                self.rejected.insert(name.as_bytes().to_vec(), seen);
                None
            }
        }
    }
}

/// A fingerprint of a text from the hash: whether a rejected text is
/// stored still, kept without keeping the text (which can be large).
fn fingerprint(text: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// Text from the hash as logged: escaped, so that a newline in it cannot
/// start a log line, and at most 200 bytes of it, with its length when
/// longer (a value of megabytes would be logged by every instance).
fn logged(text: &[u8]) -> String {
    const MAX: usize = 200;
    let escaped: String = String::from_utf8_lossy(&text[..text.len().min(MAX)])
        .escape_debug()
        .collect();
    if text.len() <= MAX {
        escaped
    } else {
        format!("{escaped}… ({} bytes)", text.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value or a field a hostile or careless writer left in the hash is
    /// logged escaped and cut: it cannot forge log lines or flood them.
    #[test]
    fn text_from_the_hash_is_logged_escaped_and_cut() {
        assert_eq!(logged(b"capacity=10 rate=5/s"), "capacity=10 rate=5/s");
        assert_eq!(
            logged(b"capacity=10\n2030-01-01T00:00:00Z INFO admin"),
            "capacity=10\\n2030-01-01T00:00:00Z INFO admin"
        );
        let huge = logged(&vec![b'x'; 5_000_000]);
        assert_eq!(huge, format!("{}… (5000000 bytes)", "x".repeat(200)));
    }
    use crate::rule_source::RedisRuleSource;

    #[test]
    fn backoff_doubles_up_to_the_bound_with_jitter() {
        let (tx, _) = watch::channel(false);
        let follower = Follower {
            endpoint: crate::backend::redis::Endpoint::Fixed(
                redis::Client::open("redis://127.0.0.1:1").unwrap(),
            ),
            config: RedisRuleSource::builder("redis://127.0.0.1:1"),
            rules: Rules::new(),
            loaded: HashSet::new(),
            rejected: HashMap::new(),
            announced_read_at: None,
            unread_logged: None,
            ready: tx,
        };
        for attempt in 0..40 {
            let wait = follower.backoff(attempt);
            let base = Duration::from_millis(50)
                .saturating_mul(1 << attempt.min(16))
                .min(Duration::from_secs(1));
            assert!(
                wait >= base.mul_f64(0.75) && wait <= base.mul_f64(1.25),
                "attempt {attempt}: {wait:?} around {base:?}"
            );
        }
    }

    #[test]
    fn changes_keep_rules_the_application_set_and_reject_invalid_texts() {
        let (tx, _) = watch::channel(false);
        let rules = Rules::new();
        let mine = Quota::per_second(1).unwrap();
        rules.set("mine", mine);
        let mut follower = Follower {
            endpoint: crate::backend::redis::Endpoint::Fixed(
                redis::Client::open("redis://127.0.0.1:1").unwrap(),
            ),
            config: RedisRuleSource::builder("redis://127.0.0.1:1"),
            rules: rules.clone(),
            loaded: HashSet::new(),
            rejected: HashMap::new(),
            announced_read_at: None,
            unread_logged: None,
            ready: tx,
        };
        // Not loaded by the source: not its to remove.
        assert_eq!(follower.change("mine", None), None);
        let set = follower.change("r", Some(b"capacity=5 rate=1/s")).unwrap();
        rules.apply(std::slice::from_ref(&set));
        assert_eq!(rules.get("r").unwrap().capacity(), 5);
        assert_eq!(follower.change("r", Some(b"capacity=5 rate=1/s")), None);
        assert_eq!(follower.change("r", Some(b"capacity=zero")), None);
        assert_eq!(follower.rejected[&b"r"[..]], fingerprint(b"capacity=zero"));
        assert_eq!(
            follower.change("r", None),
            Some(("r".to_owned(), None)),
            "a loaded rule gone from the hash is removed"
        );
        assert_eq!(rules.get("mine"), Some(mine));
    }
}
