//! Faults of the backend or of the configuration, by kind. A backend error
//! is never a denial (see `denial.rs`); a failure policy's denial says which
//! kind of fault it answered.

use std::fmt;
use std::time::Duration;

use crate::quota::QuotaError;

/// A fault of the backend or of the configuration. Never a denial.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend did not answer within the limiter's timeout.
    #[error("the rate limit backend did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error or the connection failed.
    #[cfg(feature = "redis")]
    #[error("redis: {}", shown(.0))]
    Redis(#[from] redis::RedisError),
    /// The limiter could not open its first connection to a Redis server
    /// (or to a master the Sentinels name, or `ping`'s to a cluster's first
    /// node): refused, reset, a name that does not resolve, a refused
    /// password or certificate. [`kind`](Self::kind) sorts the cause as for
    /// [`Error::Redis`]. A connection lost later is made again by itself;
    /// a call that meets its failure gets [`Error::Redis`].
    #[cfg(feature = "redis")]
    #[error(
        "could not connect to the Redis at {address} ({}): {}",
        redis_kind(source),
        shown(source)
    )]
    Connect {
        /// The server's address, with no password.
        address: String,
        /// Why the connection failed.
        source: redis::RedisError,
    },
    /// The circuit breaker is open: the backend failed repeatedly and is
    /// skipped until a probe call succeeds.
    #[error("the rate limit backend is failing ({cause}); calls skip it until a probe succeeds")]
    CircuitOpen {
        /// The kind of the last failure that kept the breaker open (the one
        /// that opened it, or a failed probe's since): a misconfiguration
        /// stays named while the breaker skips the backend.
        cause: ErrorKind,
    },
    /// The backend answered something the limiter does not understand.
    #[error("unexpected reply from the rate limit backend: {0}")]
    UnexpectedReply(String),
    /// The key holds a value this quota's algorithm did not write (another
    /// application's key, or another algorithm's state under the same
    /// name). That key alone cannot be decided: nothing was written to it,
    /// the other keys of the same backend call were decided as usual, and
    /// the circuit breaker does not count it, as the backend is healthy.
    /// Give the rule a key of its own, or delete the key.
    #[error(
        "the key `{key}` holds a value `{algorithm}` did not write; another writer or algorithm \
         uses this key; give the limit a key of its own or delete the key"
    )]
    ForeignValue {
        /// The full key, prefix included, as it is named in the backend.
        key: String,
        /// The algorithm that was asked to decide.
        algorithm: crate::quota::Algorithm,
    },
    /// More decisions are waiting for the backend than the limiter queues
    /// (the backend is slower than the calls arrive): this call was not
    /// sent. The failure policy answers it; the circuit breaker does not
    /// count it.
    #[error(
        "{0} decisions are already waiting for the rate limit backend; this call was not sent"
    )]
    Overloaded(usize),
    /// The limiter was configured wrongly: what to change.
    #[error("invalid limiter configuration: {0}")]
    Config(#[from] ConfigError),
    /// The call was made outside a Tokio runtime, or the runtime that ran
    /// the limiter's connection and batching tasks has shut down.
    #[error(
        "{what} runs on a Tokio runtime, which is gone or was never there; call it from within \
         one (`#[tokio::main]`, `Runtime::block_on`) that outlives the calls"
    )]
    NoRuntime {
        /// What needed the runtime.
        what: &'static str,
    },
    /// An invalid quota.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// [`Limiter::refund`](crate::Limiter::refund) was given an admission
    /// that another limiter made (not this one or a clone of it): nothing
    /// was given back, as its tokens were taken elsewhere.
    #[error(
        "this admission was made by another limiter; refund it with the limiter whose check \
         admitted it"
    )]
    OtherLimiter,
    /// The server is not the kind this limiter was configured for: a Redis
    /// Cluster node given as one Redis, one Redis given as a cluster, or a
    /// read-only replica given as the master. With Sentinel, a replica
    /// named as the master while a failover is under way; the next call asks
    /// the Sentinels again.
    #[error("the Redis at {address} is {found}; {fix}")]
    WrongServer {
        /// The server's address, with no password.
        address: String,
        /// What the server is.
        found: &'static str,
        /// What to change.
        fix: &'static str,
    },
    /// [`install`](crate::install) was called after a global limiter was set or used.
    #[error(
        "a global limiter is already in place; call `ratelimit::install` once, at start-up, \
         before the first rate-limited call"
    )]
    AlreadyInstalled,
}

/// A configuration that cannot work, and what to change.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting that must be greater than zero is zero.
    #[error("`{setting}` must be greater than zero")]
    NotPositive {
        /// The setting, as the builder names it.
        setting: &'static str,
    },
    /// A share outside its range.
    #[error("`{setting}` must be in {range}, such as {example}; got {value}")]
    OutOfRange {
        /// The setting, as the builder names it.
        setting: &'static str,
        /// The range it must be in.
        range: &'static str,
        /// A value that would do.
        example: &'static str,
        /// The value given.
        value: f64,
    },
    /// The key prefix holds a hash tag brace, which would send every key to
    /// one Redis Cluster slot.
    #[error(
        "the prefix `{prefix}` contains a hash tag brace; put hash tags in key templates, where \
         they choose a slot per key, not in the prefix"
    )]
    HashTagInPrefix {
        /// The prefix given.
        prefix: String,
    },
    /// A backend or URL scheme whose crate feature is off.
    #[error(
        "{what} needs the `{feature}` feature: `features = [\"{feature}\"]` on \
         distributed-ratelimit in Cargo.toml"
    )]
    FeatureOff {
        /// What was asked for.
        what: &'static str,
        /// The feature that provides it.
        feature: &'static str,
    },
    /// A backend given no address to reach it at.
    #[error("{what} needs {needs}, such as `{example}`")]
    MissingAddress {
        /// The backend.
        what: &'static str,
        /// What it needs.
        needs: &'static str,
        /// A call that gives it.
        example: &'static str,
    },
    /// TLS certificates given for addresses without TLS.
    #[error("TLS certificates were given for {what} without TLS; use `rediss://`")]
    TlsWithoutRediss {
        /// Which addresses.
        what: &'static str,
    },
    /// A combination of settings this version cannot serve.
    #[error("{what} is not supported; {instead}")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// An environment variable needed by another one is not set.
    #[error("{set} is set but {missing} is not; set it to {what}")]
    MissingVariable {
        /// The variable that is set.
        set: &'static str,
        /// The one missing.
        missing: &'static str,
        /// What it should hold.
        what: &'static str,
    },
    /// Addresses that do not parse, shown without their passwords.
    #[cfg(feature = "redis")]
    #[error(
        "invalid {what} {urls:?}: {source}; write redis://[user:password@]host[:port][/db] \
         (rediss:// over TLS, valkey:// and valkeys:// likewise) or redis+unix:///path"
    )]
    InvalidUrl {
        /// Which addresses.
        what: &'static str,
        /// The addresses given, each without its password.
        urls: Vec<String>,
        /// Why they do not parse.
        source: redis::RedisError,
    },
}

/// What kind of fault an [`Error`] is: what to tell an operator, and
/// whether it is an outage to ride out ([`FailurePolicy`](crate::FailurePolicy)
/// answers meanwhile) or a misconfiguration to fix
/// ([`is_misconfiguration`](Self::is_misconfiguration)). Redis errors are
/// sorted by redis-rs's error kinds and Redis's error codes.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::{Error, ErrorKind};
///
/// let error = Error::Timeout(Duration::from_millis(100));
/// assert_eq!(error.kind(), ErrorKind::Timeout);
/// assert!(!error.kind().is_misconfiguration());
/// assert_eq!(error.kind().as_str(), "timeout");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The backend could not be reached, or the connection broke: refused,
    /// reset, a host name that does not resolve, a cluster without a master
    /// for a slot.
    Unavailable,
    /// No answer within the limiter's timeout.
    Timeout,
    /// The server refused the credentials (`WRONGPASS`, `NOAUTH`).
    Authentication,
    /// The TLS handshake failed: a certificate not trusted, for another name,
    /// or expired (the error says which).
    Tls,
    /// The ACL user may not run a command or touch a key (`NOPERM`; the
    /// error names which).
    Permission,
    /// The server is not the kind the limiter was configured for (see
    /// [`Error::WrongServer`]; `MOVED` and `READONLY` replies too).
    WrongServer,
    /// The backend answered something the limiter does not understand.
    Protocol,
    /// A key holds a value its algorithm did not write.
    ForeignValue,
    /// More decisions wait for the backend than the limiter queues.
    Overloaded,
    /// The circuit breaker skips the failing backend for now.
    CircuitOpen,
    /// The limiter's own configuration is invalid, or it runs outside a
    /// Tokio runtime.
    Configuration,
}

impl ErrorKind {
    /// Whether fixing the deployment, not waiting, ends the fault:
    /// credentials, certificates, permissions, the kind of server, the
    /// limiter's configuration.
    pub fn is_misconfiguration(self) -> bool {
        matches!(
            self,
            ErrorKind::Authentication
                | ErrorKind::Tls
                | ErrorKind::Permission
                | ErrorKind::WrongServer
                | ErrorKind::Configuration
        )
    }

    /// The kind as a metric label or log field: `unavailable`, `timeout`,
    /// `authentication`, `tls`, `permission`, `wrong_server`, `protocol`,
    /// `foreign_value`, `overloaded`, `circuit_open` or `configuration`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Authentication => "authentication",
            ErrorKind::Tls => "tls",
            ErrorKind::Permission => "permission",
            ErrorKind::WrongServer => "wrong_server",
            ErrorKind::Protocol => "protocol",
            ErrorKind::ForeignValue => "foreign_value",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::CircuitOpen => "circuit_open",
            ErrorKind::Configuration => "configuration",
        }
    }
}

impl ErrorKind {
    const ALL: [ErrorKind; 11] = [
        ErrorKind::Unavailable,
        ErrorKind::Timeout,
        ErrorKind::Authentication,
        ErrorKind::Tls,
        ErrorKind::Permission,
        ErrorKind::WrongServer,
        ErrorKind::Protocol,
        ErrorKind::ForeignValue,
        ErrorKind::Overloaded,
        ErrorKind::CircuitOpen,
        ErrorKind::Configuration,
    ];

    /// The kind as a small number, for an atomic (see [`from_index`](Self::from_index)).
    pub(crate) fn index(self) -> u8 {
        Self::ALL.iter().position(|&k| k == self).unwrap_or(0) as u8
    }

    /// The kind [`index`](Self::index) gave `index`.
    pub(crate) fn from_index(index: u8) -> Self {
        Self::ALL
            .get(usize::from(index))
            .copied()
            .unwrap_or(ErrorKind::Unavailable)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether Redis refused `error`'s call because it takes no writes now,
/// while it still runs reads: over `maxmemory` (`OOM`), too few replicas to
/// write to (`NOREPLICAS`, `min-replicas-to-write`), or a failed save
/// (`MISCONF`, `stop-writes-on-bgsave-error`). Redis refuses a function or a
/// module command that may write before it runs, and a plain script at its
/// first write: such a call wrote nothing, and a denial, which writes
/// nothing, is still answered by the plain script.
#[cfg(feature = "redis")]
pub(crate) fn refuses_writes(error: &redis::RedisError) -> bool {
    matches!(error.code(), Some("OOM" | "NOREPLICAS" | "MISCONF"))
}

/// Whether `error`, met by a connection speaking RESP3, is its server's
/// refusal of the `HELLO 3` such a connection sends first: a server that
/// does not know `HELLO` (before 6.0, or with the command renamed away), in
/// redis-rs's words for that or in the server's own, or one that knows no
/// protocol 3.
#[cfg(feature = "redis")]
pub(crate) fn is_resp3_refusal(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::RESP3NotSupported
        || error.code() == Some("NOPROTO")
        || (error.code() == Some("ERR")
            && error.detail().is_some_and(|detail| {
                let detail = detail.trim_start().to_ascii_lowercase();
                detail.starts_with("unknown command") && detail.contains("hello")
            }))
}

/// `error` as text, without the arguments Redis repeats after an unknown
/// command ("with args beginning with: ..."): the keys of a call, which are
/// other callers' too, and which a log must not collect.
#[cfg(feature = "redis")]
fn shown(error: &redis::RedisError) -> String {
    let mut text = error.to_string();
    if let Some(end) = text.find(", with args beginning with:") {
        text.truncate(end);
    }
    text
}

/// Whether `error` is a server's refusal of a command it does not know (a
/// command renamed away in its configuration, or one it is too old for).
#[cfg(feature = "redis")]
fn is_unknown_command(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.trim_start().starts_with("unknown command"))
}

/// The kind of a Redis error, from redis-rs's kind and the server's code.
#[cfg(feature = "redis")]
fn redis_kind(error: &redis::RedisError) -> ErrorKind {
    use redis::{ErrorKind as Redis, ServerErrorKind as Server};
    match error.code() {
        Some("NOAUTH" | "WRONGPASS") => return ErrorKind::Authentication,
        // A command the script ran that the user may not run (as Redis 7.0
        // says it, and as later servers do).
        Some("ERR")
            if error.detail().is_some_and(|detail| {
                let detail = detail.trim_start();
                detail.starts_with("The user executing the script can't run")
                    || detail.starts_with("ACL failure in script")
            }) =>
        {
            return ErrorKind::Permission
        }
        // Writes refused until memory is freed, replicas are back or a
        // save succeeds; every call refused while a script runs too long
        // (`BUSY`, which redis-rs has no kind for).
        _ if refuses_writes(error) => return ErrorKind::Unavailable,
        Some("BUSY") => return ErrorKind::Unavailable,
        // A server that cannot run the limiter's script: `FCALL` and
        // `EVALSHA` (or `SCRIPT`) renamed away.
        _ if is_unknown_command(error) => return ErrorKind::WrongServer,
        // The URL names a database the server does not have.
        _ if error.to_string().contains("DB index is out of range") => {
            return ErrorKind::Configuration
        }
        _ => {}
    }
    match error.kind() {
        Redis::AuthenticationFailed => ErrorKind::Authentication,
        Redis::Server(Server::NoPerm) => ErrorKind::Permission,
        Redis::Server(Server::Moved | Server::Ask | Server::CrossSlot | Server::ReadOnly)
        | Redis::RESP3NotSupported => ErrorKind::WrongServer,
        Redis::Server(
            Server::ClusterDown | Server::MasterDown | Server::TryAgain | Server::BusyLoading,
        )
        | Redis::ClusterConnectionNotFound
        | Redis::NoValidReplicasFoundBySentinel => ErrorKind::Unavailable,
        Redis::Io if is_tls(error) => ErrorKind::Tls,
        // redis-rs's own response timeout, which can fire before ours.
        _ if error.is_timeout() => ErrorKind::Timeout,
        Redis::Io => ErrorKind::Unavailable,
        Redis::InvalidClientConfig
        | Redis::EmptySentinelList
        | Redis::MasterNameNotFoundBySentinel => ErrorKind::Configuration,
        _ => ErrorKind::Protocol,
    }
}

/// Whether a TLS library error is among `error`'s causes.
#[cfg(feature = "redis")]
fn is_tls(error: &redis::RedisError) -> bool {
    #[cfg(feature = "tls")]
    {
        type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = cause {
            // redis-rs keeps its cause behind an `Arc`.
            let e: &(dyn std::error::Error + 'static) = match e.downcast_ref::<Shared>() {
                Some(shared) => &**shared,
                None => e,
            };
            let inner = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .map(|inner| inner as &(dyn std::error::Error + 'static));
            if e.downcast_ref::<rustls::Error>().is_some()
                || inner.is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
            {
                return true;
            }
            cause = e.source();
        }
    }
    let _ = error;
    false
}

impl Error {
    /// What kind of fault this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Timeout(_) => ErrorKind::Timeout,
            #[cfg(feature = "redis")]
            Error::Redis(error) | Error::Connect { source: error, .. } => redis_kind(error),
            Error::CircuitOpen { .. } => ErrorKind::CircuitOpen,
            Error::UnexpectedReply(_) => ErrorKind::Protocol,
            Error::ForeignValue { .. } => ErrorKind::ForeignValue,
            Error::Overloaded(_) => ErrorKind::Overloaded,
            Error::WrongServer { .. } => ErrorKind::WrongServer,
            Error::Config(_)
            | Error::Quota(_)
            | Error::AlreadyInstalled
            | Error::NoRuntime { .. }
            | Error::OtherLimiter => ErrorKind::Configuration,
        }
    }

    /// Whether the backend refused the connection: nothing was sent, and
    /// asking again costs next to nothing.
    pub(crate) fn is_refusal(&self) -> bool {
        match self {
            #[cfg(feature = "redis")]
            Error::Redis(error) | Error::Connect { source: error, .. } => {
                error.is_connection_refusal()
            }
            _ => false,
        }
    }

    /// Whether the fault came from the backend (and so a failure policy applies),
    /// rather than from the request or the configuration.
    pub(crate) fn is_backend(&self) -> bool {
        match self {
            Error::Timeout(_)
            | Error::UnexpectedReply(_)
            | Error::CircuitOpen { .. }
            | Error::ForeignValue { .. }
            | Error::WrongServer { .. }
            | Error::Overloaded(_) => true,
            #[cfg(feature = "redis")]
            Error::Redis(_) | Error::Connect { .. } => true,
            _ => false,
        }
    }

    /// Whether the fault says the backend itself is failing (it timed out,
    /// the connection broke, it answered an error or nonsense), which is
    /// what the circuit breaker counts. A foreign value at one key, a full
    /// queue or a configuration error says nothing about the backend's
    /// health.
    pub(crate) fn is_backend_failure(&self) -> bool {
        match self {
            Error::Timeout(_) | Error::UnexpectedReply(_) | Error::WrongServer { .. } => true,
            #[cfg(feature = "redis")]
            Error::Redis(_) | Error::Connect { .. } => true,
            _ => false,
        }
    }

    /// Whether this is a server's refusal of RESP3 (see
    /// [`is_resp3_refusal`]).
    #[cfg(feature = "redis")]
    pub(crate) fn is_resp3_refusal(&self) -> bool {
        matches!(self, Error::Redis(source) if is_resp3_refusal(source))
    }

    /// `self`, naming `address` if it is a Redis error met while
    /// connecting there.
    #[cfg(feature = "redis")]
    pub(crate) fn connecting_to(self, address: impl fmt::Display) -> Self {
        match self {
            Error::Redis(source) => Error::Connect {
                address: address.to_string(),
                source,
            },
            other => other,
        }
    }
}

#[cfg(all(test, feature = "redis"))]
pub(crate) mod tests {
    use super::*;

    /// The error a server answers `line` with, as redis-rs reads it.
    pub(crate) fn server_error(line: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn every_kind_has_an_index_of_its_own() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_index(kind.index()), kind);
        }
        let names: std::collections::BTreeSet<_> =
            ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), ErrorKind::ALL.len());
    }

    #[test]
    fn a_refusal_of_resp3_is_known_in_each_wording() {
        for line in [
            "ERR unknown command 'HELLO', with args beginning with: '3' ",
            "ERR unknown command `HELLO`, with args beginning with: `3`, ",
            "NOPROTO unsupported protocol version",
        ] {
            assert!(is_resp3_refusal(&server_error(line)), "{line}");
        }
        for line in [
            "ERR unknown command 'FCALL', with args beginning with: ",
            "ERR DB index is out of range",
        ] {
            assert!(!is_resp3_refusal(&server_error(line)), "{line}");
        }
    }

    /// A server that cannot serve for now is `Unavailable`, whatever it
    /// calls it. (`BUSY`, a script running past its limit, was a protocol
    /// fault in denials and metrics.)
    #[test]
    fn a_server_busy_for_now_is_unavailable() {
        for line in [
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOREPLICAS Not enough good replicas to write.",
        ] {
            assert_eq!(redis_kind(&server_error(line)), ErrorKind::Unavailable, "{line}");
        }
    }
}
