//! Where the limiter's Redis is: a URL (with TLS for `rediss://`), or the
//! master a set of Sentinels names; and how addresses are shown without
//! their passwords.

use std::time::Duration;

use crate::error::{ConfigError, Error};

/// The keys a backend names and the instant it decides at: the limiter's
/// prefix before each key, and the caller's clock when one is configured
/// (Redis `TIME` otherwise).
pub(crate) struct KeySpace {
    pub(crate) prefix: String,
    pub(crate) clock: Option<std::sync::Arc<dyn crate::clock::Clock>>,
}

impl KeySpace {
    /// `key` under the prefix.
    pub(crate) fn full_key(&self, key: &str) -> String {
        let mut full = String::with_capacity(self.prefix.len() + key.len());
        full.push_str(&self.prefix);
        full.push_str(key);
        full
    }

    /// The caller's clock's instant, or `None` for Redis `TIME`.
    pub(crate) fn now(&self) -> Option<u64> {
        self.clock.as_ref().map(|clock| clock.now_micros())
    }
}

/// `url` with any password replaced by `***`, for errors and logs: a Redis
/// URL carries the password of its user (`redis://user:secret@host`), or in
/// its query (`redis+unix:///tmp/redis.sock?pass=secret`).
pub(crate) fn redacted(url: &str) -> String {
    let url = &hidden_in_query(url);
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[scheme_end..];
    // A URL that parses with a user part ends it where the URL's syntax
    // says (before any `/`, `?` or `#`). One that does not parse, or parses
    // with none though it holds an `@` (a password beginning with digits
    // and a `/` reads as a port and a path), may hold a password with any
    // of those in it: all up to its last `@` is hidden.
    let parsed = redis::parse_redis_url(url);
    let parses = parsed.is_some();
    let parsed =
        parsed.filter(|parsed| !parsed.username().is_empty() || parsed.password().is_some());
    let (at, user) = if parsed.is_some() {
        let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
        let Some(at) = authority.rfind('@') else {
            return url.to_owned();
        };
        let user = authority[..at]
            .split_once(':')
            .map(|(user, _)| format!("{user}:"));
        (at, user)
    } else {
        match rest.rfind('@') {
            Some(at) => (at, None),
            None if parses => return url.to_owned(),
            // Not a URL, with no `@`: it may be a password alone (given
            // where the URL goes), or a user and password with the host
            // left out (`redis://user:secret`). A host shows up to its
            // first `:`; the rest is hidden.
            None => {
                let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
                // An IPv6 host is written in brackets, with `:` inside.
                let host_end = match authority.strip_prefix('[') {
                    Some(inside) => inside.find(']').map(|end| end + 2),
                    None => authority.find(':'),
                };
                return match host_end.filter(|&end| authority[end..].starts_with(':')) {
                    Some(end) if scheme_end > 0 => {
                        format!("{}{}:***", &url[..scheme_end], &authority[..end])
                    }
                    _ => format!("{}***", &url[..scheme_end]),
                };
            }
        }
    };
    format!(
        "{}{}***{}",
        &url[..scheme_end],
        user.unwrap_or_default(),
        &rest[at..]
    )
}

/// `url` with the values of its query's `pass` and `password` replaced by
/// `***`, those names read as redis-rs reads them: percent-decoded, so
/// `p%61ss` is `pass`.
fn hidden_in_query(url: &str) -> String {
    let Some((head, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let (query, fragment) = query
        .split_once('#')
        .map_or((query, None), |(q, f)| (q, Some(f)));
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _))
                if ["pass", "password"]
                    .iter()
                    .any(|secret| decoded(name).eq_ignore_ascii_case(secret.as_bytes())) =>
            {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    let mut shown = format!("{head}?{}", pairs.join("&"));
    if let Some(fragment) = fragment {
        shown.push('#');
        shown.push_str(fragment);
    }
    shown
}

/// A query name as a form decodes it: `%XX` is the byte `XX`, `+` a space.
fn decoded(name: &str) -> Vec<u8> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| bytes.get(at).and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(high), Some(low)) => {
                out.push((high * 16 + low) as u8);
                i += 3;
            }
            (b'+', ..) => {
                out.push(b' ');
                i += 1;
            }
            (byte, ..) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

/// How long data sent to Redis may go unacknowledged at the TCP level before
/// the connection is given up, and how soon an idle connection is probed.
const TCP_GIVE_UP: Duration = Duration::from_secs(10);
const TCP_IDLE_PROBE: Duration = Duration::from_secs(10);

/// The TCP settings of every connection to Redis: a peer that stops
/// answering at the TCP level (a host gone, a network cut, a DNS name that
/// now points elsewhere) fails the connection within [`TCP_GIVE_UP`], which
/// is then made anew. Without them the kernel retransmits for some fifteen
/// minutes, and every call meanwhile times out on the dead connection,
/// however healthy the Redis the address now reaches.
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
    let keepalive = TcpKeepalive::new()
        .with_time(TCP_IDLE_PROBE)
        .with_interval(TCP_IDLE_PROBE / 2);
    // `TCP_NODELAY` stays off, as measured busiest (see the batcher).
    let settings = TcpSettings::default().set_keepalive(keepalive);
    #[cfg(any(target_os = "android", target_os = "fuchsia", target_os = "linux"))]
    let settings = settings.set_user_timeout(TCP_GIVE_UP);
    settings
}

/// The connection information of each of `urls` (the `what` of a limiter);
/// an invalid one is a configuration error that names it alone, without its
/// password, rather than the whole list.
pub(crate) fn parse_each(
    urls: &[String],
    what: &'static str,
) -> Result<Vec<redis::ConnectionInfo>, Error> {
    urls.iter()
        .map(|url| connection_info(url, what, cfg!(feature = "tls")))
        .collect()
}

/// `url`'s connection information (`what` names it in errors). A TLS URL
/// (`rediss://`, `valkeys://`) without the `tls` feature (`tls_feature`
/// false) is the error that names the feature, which redis-rs's own would
/// not.
fn connection_info(
    url: &str,
    what: &'static str,
    tls_feature: bool,
) -> Result<redis::ConnectionInfo, Error> {
    use redis::IntoConnectionInfo as _;
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let secure = [("rediss", "`rediss://`"), ("valkeys", "`valkeys://`")]
        .into_iter()
        .find(|(tls, _)| scheme.eq_ignore_ascii_case(tls));
    if let (Some((_, shown)), false) = (secure, tls_feature) {
        return Err(ConfigError::FeatureOff {
            what: shown,
            feature: "tls",
        }
        .into());
    }
    url.into_connection_info().map_err(|source| {
        ConfigError::InvalidUrl {
            what,
            urls: vec![redacted(url)],
            source,
        }
        .into()
    })
}

/// A client for `url`, with `tls`'s certificates for a `rediss://` URL; an
/// invalid URL is a configuration error that names the URL without its
/// password.
pub(crate) fn open_client(url: &str, tls: &crate::tls::TlsConfig) -> Result<redis::Client, Error> {
    let invalid = |source| {
        Error::from(ConfigError::InvalidUrl {
            what: "Redis URL",
            urls: vec![redacted(url)],
            source,
        })
    };
    let info =
        connection_info(url, "Redis URL", cfg!(feature = "tls"))?.set_tcp_settings(tcp_settings());
    if uses_tls(over_tls(&info), tls, "a URL")? && tls.is_set() {
        #[cfg(feature = "tls")]
        return redis::Client::build_with_tls(info, tls.certificates()).map_err(invalid);
    }
    redis::Client::open(info).map_err(invalid)
}

/// Whether `info` is reached over TLS, as redis-rs reads its URL
/// (`rediss://`, `valkeys://`, in any case).
pub(crate) fn over_tls(info: &redis::ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

/// Whether addresses that are `secure` (`rediss://`) use TLS, checked
/// against the certificates given (`what` names the addresses) and the `tls`
/// feature; the crypto provider is installed for them.
pub(crate) fn uses_tls(
    secure: bool,
    tls: &crate::tls::TlsConfig,
    what: &'static str,
) -> Result<bool, Error> {
    if tls.is_set() && !secure {
        return Err(ConfigError::TlsWithoutRediss { what }.into());
    }
    if secure {
        #[cfg(not(feature = "tls"))]
        return Err(ConfigError::FeatureOff {
            what: "`rediss://`",
            feature: "tls",
        }
        .into());
        #[cfg(feature = "tls")]
        crate::tls::ensure_crypto_provider();
    }
    Ok(secure)
}

/// Where the Redis to decide on is: one address, or the master a set of
/// Sentinels name (asked again after a failure, to follow a failover).
pub(crate) enum Endpoint {
    Fixed(redis::Client),
    Sentinel {
        client: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
        /// The master's name, and a client of each Sentinel, whose
        /// `+switch-master` announcements a watcher follows.
        master: String,
        sentinels: Vec<redis::Client>,
    },
}

impl Endpoint {
    /// The endpoint for `sentinels` (their URLs), serving `master`. The
    /// master's connections take the first URL's user, password and
    /// database; each Sentinel its own URL's user and password (every URL
    /// the same, when certificates are given). Over TLS when the URLs are
    /// `rediss://` (all of them), with `tls`'s certificates for the
    /// Sentinels and the master alike.
    pub(crate) fn sentinel(
        master: &str,
        sentinels: &[String],
        tls: &crate::tls::TlsConfig,
    ) -> Result<Self, Error> {
        use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
        let invalid = |source| {
            Error::from(ConfigError::InvalidUrl {
                what: "Redis Sentinel URLs",
                urls: sentinels.iter().map(|u| redacted(u)).collect(),
                source,
            })
        };
        if master.is_empty() || sentinels.is_empty() {
            return Err(ConfigError::MissingAddress {
                what: "Redis Sentinel",
                needs: "the master's name and at least one Sentinel URL",
                example: ".sentinel(\"mymaster\", [\"redis://10.0.0.1:26379\"])",
            }
            .into());
        }
        let infos = parse_each(sentinels, "Redis Sentinel URL")?;
        let secure = infos.iter().filter(|info| over_tls(info)).count();
        if secure != 0 && secure != infos.len() {
            return Err(ConfigError::Unsupported {
                what: "Redis Sentinel URLs mixing TLS (`rediss://`) and plain connections",
                instead: "reach every Sentinel the same way: `rediss://` for all of them when \
                          they serve TLS (the master is then reached over TLS too)",
            }
            .into());
        }
        let secure = uses_tls(secure != 0, tls, "Redis Sentinel URLs")?;
        let settings = infos[0].redis_settings();
        // A Sentinel has no database but 0; each is reached with its URL's
        // user and password.
        let infos: Vec<redis::ConnectionInfo> = infos
            .iter()
            .map(|info| {
                let on_sentinel = info.redis_settings().clone().set_db(0);
                info.clone().set_redis_settings(on_sentinel)
            })
            .collect();
        // `rediss://...#insecure` skips the master's certificate check too.
        let tls_mode = match infos[0].addr() {
            redis::ConnectionAddr::TcpTls { insecure: true, .. } => redis::TlsMode::Insecure,
            _ => redis::TlsMode::Secure,
        };
        let certified = secure && tls.is_set();
        let client = if certified {
            Self::certified(master, sentinels, &infos, settings, tls_mode, tls)?
        } else {
            let mut node = SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(settings.clone())
                .set_tcp_settings(tcp_settings());
            if secure {
                node = node.set_tls_mode(tls_mode);
            }
            // redis-rs takes a `String` without its TLS feature and any
            // `AsRef<str>` with it: an owned name suits both.
            #[allow(clippy::unnecessary_to_owned)]
            SentinelClient::build(
                infos.clone(),
                master.to_owned(),
                Some(node),
                SentinelServerType::Master,
            )
            .map_err(invalid)?
        };
        let watched = infos
            .into_iter()
            .map(|info| {
                #[cfg(feature = "tls")]
                if certified {
                    return redis::Client::build_with_tls(info, tls.certificates());
                }
                redis::Client::open(info)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        Ok(Endpoint::Sentinel {
            client: tokio::sync::Mutex::new(client),
            master: master.to_owned(),
            sentinels: watched,
        })
    }

    /// The Sentinel client for certificates given to `tls`: they reach the
    /// master's connections only through redis-rs's builder, which gives
    /// every Sentinel the same user and password.
    #[cfg_attr(not(feature = "tls"), allow(unused_variables, unused_mut))]
    fn certified(
        master: &str,
        urls: &[String],
        infos: &[redis::ConnectionInfo],
        settings: &redis::RedisConnectionInfo,
        tls_mode: redis::TlsMode,
        tls: &crate::tls::TlsConfig,
    ) -> Result<redis::sentinel::SentinelClient, Error> {
        use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
        fn credentials(info: &redis::ConnectionInfo) -> (Option<&str>, Option<&str>) {
            let settings = info.redis_settings();
            (settings.username(), settings.password())
        }
        if infos
            .iter()
            .any(|info| credentials(info) != credentials(&infos[0]))
        {
            return Err(ConfigError::Unsupported {
                what: "Redis Sentinel URLs with different users or passwords, with certificates",
                instead: "give every Sentinel URL the same user and password",
            }
            .into());
        }
        let invalid = |source| {
            Error::from(ConfigError::InvalidUrl {
                what: "Redis Sentinel URLs",
                urls: urls.iter().map(|u| redacted(u)).collect(),
                source,
            })
        };
        let mut builder = SentinelClientBuilder::new(
            infos.iter().map(|info| info.addr().clone()),
            master,
            SentinelServerType::Master,
        )
        .map_err(invalid)?
        .set_client_to_redis_db(settings.db())
        .set_client_to_redis_protocol(settings.protocol())
        .set_client_to_sentinel_protocol(settings.protocol())
        .set_client_to_redis_tls_mode(tls_mode)
        .set_client_to_redis_tcp_settings(tcp_settings())
        .set_client_to_sentinel_tcp_settings(tcp_settings());
        if let Some(username) = settings.username() {
            builder = builder
                .set_client_to_redis_username(username)
                .set_client_to_sentinel_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder
                .set_client_to_redis_password(password)
                .set_client_to_sentinel_password(password);
        }
        #[cfg(feature = "tls")]
        {
            builder = builder
                .set_client_to_redis_certificates(tls.certificates())
                .set_client_to_sentinel_certificates(tls.certificates());
        }
        builder.build().map_err(invalid)
    }

    /// A client for the Redis to use now; with Sentinel, the master they
    /// name now.
    pub(crate) async fn client(&self, timeout: Duration) -> Result<redis::Client, Error> {
        match self {
            Endpoint::Fixed(client) => Ok(client.clone()),
            Endpoint::Sentinel {
                client: sentinel, ..
            } => {
                let ask = async { sentinel.lock().await.async_get_client().await };
                Ok(tokio::time::timeout(timeout, ask)
                    .await
                    .map_err(|_| Error::Timeout(timeout))??)
            }
        }
    }

    pub(super) fn follows_failovers(&self) -> bool {
        matches!(self, Endpoint::Sentinel { .. })
    }
}

#[cfg(test)]
mod url_tests {
    use super::redacted;

    #[test]
    fn passwords_never_appear_in_a_redacted_url() {
        for (url, shown) in [
            (
                "rediss://svc:s3cret@127.0.0.1:7411",
                "rediss://svc:***@127.0.0.1:7411",
            ),
            ("redis://:s3cret@host/0", "redis://:***@host/0"),
            ("redis://token@host", "redis://***@host"),
            ("redis://host:6379/2", "redis://host:6379/2"),
            ("redis+unix:///tmp/r.sock", "redis+unix:///tmp/r.sock"),
            ("redis://u:p@ss@host", "redis://u:***@host"),
            (
                "redis+unix:///tmp/r.sock?db=2&pass=s3cret",
                "redis+unix:///tmp/r.sock?db=2&pass=***",
            ),
            (
                "redis+unix:///tmp/r.sock?user=svc&password=s3cret&x",
                "redis+unix:///tmp/r.sock?user=svc&password=***&x",
            ),
            (
                "redis://host/0?protocol=resp3",
                "redis://host/0?protocol=resp3",
            ),
            // Not a URL: no password shows, even with no `@` to end it.
            ("not a url", "***"),
            ("s3cret", "***"),
            ("redis://user:s3cret", "redis://user:***"),
            ("redis://127.0.0.1:99999", "redis://127.0.0.1:***"),
            ("redis://:s3cret", "redis://:***"),
            ("redis://[::1]:99999", "redis://[::1]:***"),
            // Unparsable, a password holding a `/`, `#` or `?` would be cut
            // where a URL's user part ends.
            ("redis://:ab/cd@host:6379", "redis://***@host:6379"),
            ("redis://u:p#ss@h", "redis://***@h"),
            ("redis://:p?ss@h", "redis://***@h"),
            ("u:s3cret@host:6379", "***@host:6379"),
            // Parsed as a host and a port, the password as a path.
            ("redis://default:/s3cret@host:6379", "redis://***@host:6379"),
            ("redis://u:12#s3cret@h", "redis://***@h"),
            ("redis://:/s3cret@h", "redis://***@h"),
            ("redis://u:#s3cret@h", "redis://***@h"),
            // An `@` anywhere hides what comes before it, in case.
            ("redis://host/0?x=a@b", "redis://***@b"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }

    /// Without the `tls` feature a TLS URL is refused naming the feature, in
    /// any case of its scheme; with it, it is parsed.
    #[test]
    fn a_tls_url_without_the_tls_feature_names_the_feature() {
        use crate::error::{ConfigError, Error};
        for url in [
            "rediss://127.0.0.1:6380",
            "REDISS://u:s3cret@host/0",
            "valkeys://127.0.0.1:6380",
        ] {
            match super::connection_info(url, "Redis URL", false) {
                Err(Error::Config(ConfigError::FeatureOff { feature: "tls", .. })) => {}
                other => panic!("{url}: {other:?}"),
            }
        }
        assert!(super::connection_info("redis://127.0.0.1:6379", "Redis URL", false).is_ok());
        // A URL that does not parse is told how one is written.
        let error = super::connection_info("http://127.0.0.1:6379", "Redis URL", true)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("write redis://[user:password@]host[:port][/db]"),
            "{error}"
        );
    }

    /// redis-rs reads a query's names percent-decoded: `p%61ss` is `pass`,
    /// the password of a Unix socket's URL, and the last of several wins.
    #[test]
    fn a_query_password_is_hidden_however_its_name_is_encoded() {
        use redis::IntoConnectionInfo as _;
        for url in [
            "redis+unix:///tmp/r.sock?p%61ss=s3cretPW",
            "redis+unix:///tmp/r.sock?%70ass=s3cretPW&db=2",
            "redis+unix:///tmp/r.sock?pass=decoy&pas%73=s3cretPW",
            "unix:///tmp/r.sock?%70%61%73%73=s3cretPW",
        ] {
            let info = url.into_connection_info().unwrap();
            assert_eq!(
                info.redis_settings().password(),
                Some("s3cretPW"),
                "redis-rs reads the password of {url}"
            );
            let shown = redacted(url);
            assert!(!shown.contains("s3cretPW"), "{url} shown as {shown}");
        }
        assert_eq!(
            redacted("redis+unix:///tmp/r.sock?db=2&p%61ss=s3cretPW"),
            "redis+unix:///tmp/r.sock?db=2&p%61ss=***"
        );
    }
}
