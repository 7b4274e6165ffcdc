//! Where a request's key comes from: the peer, the client behind trusted
//! proxies, a header, a bearer token or a closure.

use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::http::header::{AUTHORIZATION, FORWARDED};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName};
use ipnet::{IpNet, Ipv6Net};
use sha2::{Digest, Sha256};

/// Which forwarding header a [`TrustedProxies`] list reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: <client>, <proxy1>, <proxy2>` (the default).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=<client>, for=<proxy1>` ([RFC 7239]).
    ///
    /// [RFC 7239]: https://www.rfc-editor.org/rfc/rfc7239
    Forwarded,
}

/// The proxies whose forwarding header is believed, by address or CIDR
/// range.
///
/// The client's address is read from the forwarding header only when the
/// peer (the connection's other end) is in the list; the address is then the
/// right-most one in the header that is not itself a trusted proxy, as every
/// address to its left was written by a party that is not trusted. When the
/// peer is not a trusted proxy, the header is ignored and the peer is the
/// client, so a client cannot choose its own key by sending the header.
///
/// Read only the header your proxies set (see [`header`](Self::header)):
/// most proxies pass a header they do not set through unchanged, so a client
/// could write it freely.
///
/// ```
/// use std::net::IpAddr;
///
/// use axum::http::HeaderMap;
/// use ratelimit::http::TrustedProxies;
///
/// let proxies = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"])?;
/// let mut headers = HeaderMap::new();
/// // A client claiming to be 1.1.1.1, seen by our proxies as 203.0.113.7:
/// headers.insert("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.2".parse()?);
///
/// let via_proxy: IpAddr = "10.0.0.1".parse()?;
/// assert_eq!(proxies.client_ip(via_proxy, &headers), "203.0.113.7".parse::<IpAddr>()?);
///
/// // Straight from the internet, the header is not believed:
/// let direct: IpAddr = "198.51.100.9".parse()?;
/// assert_eq!(proxies.client_ip(direct, &headers), direct);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    header: ForwardedHeader,
}

impl TrustedProxies {
    /// Trusts each of `ranges`: an address (`"10.0.0.1"`, `"::1"`) or a CIDR
    /// range (`"10.0.0.0/8"`, `"fd00::/8"`). Reads `X-Forwarded-For`.
    pub fn new<I>(ranges: I) -> Result<Self, InvalidProxyRange>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let nets = ranges
            .into_iter()
            .map(|range| {
                let range = range.as_ref().trim();
                IpNet::from_str(range)
                    .or_else(|_| IpAddr::from_str(range).map(IpNet::from))
                    .map_err(|_| InvalidProxyRange {
                        range: range.to_owned(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            nets,
            header: ForwardedHeader::default(),
        })
    }

    /// Reads `header` instead of `X-Forwarded-For`.
    #[must_use]
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client's address for a request from `peer` with `headers`.
    ///
    /// When the peer is trusted, the forwarding header's addresses are walked
    /// from the right, past trusted proxies, to the first one that is not
    /// trusted. If every address is trusted, the left-most is the client; if
    /// an entry is not an address (`unknown`, an obfuscated node, garbage),
    /// the walk stops at the last address it had, as nothing further left
    /// can be believed.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer.to_canonical();
        if !self.is_trusted(client) {
            return client;
        }
        let hops = match self.header {
            ForwardedHeader::XForwardedFor => x_forwarded_for(headers),
            ForwardedHeader::Forwarded => forwarded_for(headers),
        };
        for hop in hops.into_iter().rev() {
            let Some(ip) = hop else { break };
            client = ip.to_canonical();
            if !self.is_trusted(client) {
                break;
            }
        }
        client
    }
}

/// A trusted proxy that is neither an IP address nor a CIDR range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidProxyRange {
    range: String,
}

impl fmt::Display for InvalidProxyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid trusted proxy `{}`; expected an IP address such as `10.0.0.1` \
             or a CIDR range such as `10.0.0.0/8`",
            self.range
        )
    }
}

impl std::error::Error for InvalidProxyRange {}

/// The hops of `X-Forwarded-For`, left to right; `None` for an entry that is
/// not an address.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    for line in headers.get_all(HeaderName::from_static("x-forwarded-for")) {
        let Ok(line) = line.to_str() else {
            hops.push(None);
            continue;
        };
        hops.extend(
            line.split(',')
                .map(str::trim)
                .filter(|entry| !entry.is_empty())
                .map(parse_node),
        );
    }
    hops
}

/// The `for=` nodes of `Forwarded`, left to right; `None` for an element with
/// no `for=` or whose node is not an address.
fn forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    for line in headers.get_all(FORWARDED) {
        let Ok(line) = line.to_str() else {
            hops.push(None);
            continue;
        };
        for element in split_unquoted(line, ',') {
            if element.trim().is_empty() {
                continue;
            }
            let node = split_unquoted(element, ';')
                .into_iter()
                .filter_map(|pair| pair.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                .and_then(|(_, value)| parse_node(&unquote(value.trim())));
            hops.push(node);
        }
    }
    hops
}

/// Splits at `separator` outside quoted strings.
fn split_unquoted(text: &str, separator: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == separator && !quoted => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// A quoted string's content, or the token as it is.
fn unquote(value: &str) -> String {
    match value
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.push(if c == '\\' {
                    chars.next().unwrap_or(c)
                } else {
                    c
                });
            }
            out
        }
        None => value.to_owned(),
    }
}

/// A node: `192.0.2.1`, `192.0.2.1:8080`, `2001:db8::1`, `[2001:db8::1]` or
/// `[2001:db8::1]:8080` (the port may be obfuscated, as in `:_abc`).
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim();
    if let Some(rest) = node.strip_prefix('[') {
        let (ip, port) = rest.split_once(']')?;
        if !port.is_empty() && !port.starts_with(':') {
            return None;
        }
        return Ipv6Addr::from_str(ip).ok().map(IpAddr::V6);
    }
    if let Ok(ip) = IpAddr::from_str(node) {
        return Some(ip);
    }
    let (ip, _port) = node.split_once(':')?;
    Ipv4Addr::from_str(ip).ok().map(IpAddr::V4)
}

/// The peer's address, recorded by axum's `into_make_service_with_connect_info`.
fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    if peer.is_none() {
        warn_no_connect_info();
    }
    peer
}

fn warn_no_connect_info() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "a rate limit keyed on the client address found no `ConnectInfo<SocketAddr>`; \
             serve the router with `into_make_service_with_connect_info::<SocketAddr>()`. \
             Until then such requests share one bucket (logged once)"
        );
    }
}

/// The key value for an address: IPv4 as is, IPv6 as its network of
/// `ipv6_prefix_len` bits.
fn ip_value(ip: IpAddr, ipv6_prefix_len: u8) -> String {
    match ip.to_canonical() {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) if ipv6_prefix_len >= 128 => ip.to_string(),
        IpAddr::V6(ip) => {
            let net = Ipv6Net::new(ip, ipv6_prefix_len)
                .expect("the prefix length was checked when the layer was built")
                .trunc();
            net.to_string()
        }
    }
}

/// What a closure makes of a request.
pub(crate) type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Where a layer's key comes from.
#[derive(Clone)]
pub(crate) enum KeySource {
    PeerIp,
    ClientIp(TrustedProxies),
    Header(HeaderName),
    BearerToken,
    Custom(Arc<KeyFn>),
    Global,
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::PeerIp => f.write_str("PeerIp"),
            KeySource::ClientIp(proxies) => f.debug_tuple("ClientIp").field(proxies).finish(),
            KeySource::Header(name) => f.debug_tuple("Header").field(name).finish(),
            KeySource::BearerToken => f.write_str("BearerToken"),
            KeySource::Custom(_) => f.write_str("Custom(..)"),
            KeySource::Global => f.write_str("Global"),
        }
    }
}

impl KeySource {
    /// The part of the default key prefix that names the source, after
    /// `http:<name>:`; a header's name is escaped like a value.
    pub(crate) fn push_tag(&self, key: &mut crate::KeyBuilder) {
        match self {
            KeySource::PeerIp | KeySource::ClientIp(_) => key.push_literal("ip:"),
            KeySource::Header(name) => {
                key.push_literal("header:");
                key.push_value(name.as_str());
                key.push_literal(":");
            }
            KeySource::BearerToken => key.push_literal("token:"),
            KeySource::Custom(_) => key.push_literal("key:"),
            KeySource::Global => key.push_literal("global"),
        }
    }

    /// The request's value, unescaped; `None` when it cannot be determined.
    /// `Some("")` for the global source, whose key is the prefix alone.
    pub(crate) fn value(&self, parts: &Parts, ipv6_prefix_len: u8) -> Option<String> {
        match self {
            KeySource::PeerIp => peer_ip(parts).map(|ip| ip_value(ip, ipv6_prefix_len)),
            KeySource::ClientIp(proxies) => peer_ip(parts)
                .map(|peer| ip_value(proxies.client_ip(peer, &parts.headers), ipv6_prefix_len)),
            KeySource::Header(name) => {
                let value = parts.headers.get(name)?;
                let value = String::from_utf8_lossy(value.as_bytes());
                let value = value.trim();
                (!value.is_empty()).then(|| value.to_owned())
            }
            KeySource::BearerToken => bearer_token(&parts.headers).map(token_digest),
            KeySource::Custom(key) => key(parts),
            KeySource::Global => Some(String::new()),
        }
    }
}

/// The token of `Authorization: Bearer <token>` (the scheme is
/// case-insensitive, RFC 9110 section 11.1).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// 128 bits of the token's SHA-256, in hex: bearer tokens are secrets, and
/// keys end up in Redis, in logs and in the denial's message.
fn token_digest(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let mut hex = String::with_capacity(32);
    for b in &digest[..16] {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(name: &'static str, values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(name, value.parse().unwrap());
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_ignored_unless_the_peer_is_trusted() {
        let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let h = headers("x-forwarded-for", &["203.0.113.7"]);
        assert_eq!(proxies.client_ip(ip("192.0.2.1"), &h), ip("192.0.2.1"));
        assert_eq!(proxies.client_ip(ip("10.1.2.3"), &h), ip("203.0.113.7"));
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let proxies = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"]).unwrap();
        // Spoofed entries to the left of what our proxies appended are skipped.
        let h = headers(
            "x-forwarded-for",
            &["6.6.6.6, 1.1.1.1", "203.0.113.7, 10.0.0.9"],
        );
        assert_eq!(proxies.client_ip(ip("127.0.0.1"), &h), ip("203.0.113.7"));
        // Every hop trusted: the left-most is the client.
        let h = headers("x-forwarded-for", &["10.0.0.5, 10.0.0.9"]);
        assert_eq!(proxies.client_ip(ip("127.0.0.1"), &h), ip("10.0.0.5"));
        // No header: the trusted peer itself.
        assert_eq!(
            proxies.client_ip(ip("127.0.0.1"), &HeaderMap::new()),
            ip("127.0.0.1")
        );
        // Garbage stops the walk at the last address known.
        let h = headers("x-forwarded-for", &["1.1.1.1, unknown, 10.0.0.9"]);
        assert_eq!(proxies.client_ip(ip("127.0.0.1"), &h), ip("10.0.0.9"));
    }

    #[test]
    fn ports_brackets_and_mapped_addresses_are_understood() {
        let proxies = TrustedProxies::new(["::1", "10.0.0.1"]).unwrap();
        let h = headers("x-forwarded-for", &["[2001:db8::7]:4711, 198.51.100.2:80"]);
        assert_eq!(proxies.client_ip(ip("::1"), &h), ip("198.51.100.2"));
        let h = headers("x-forwarded-for", &["2001:db8::7"]);
        assert_eq!(
            proxies.client_ip(ip("::ffff:10.0.0.1"), &h),
            ip("2001:db8::7")
        );
        let h = headers("x-forwarded-for", &["::ffff:192.0.2.4"]);
        assert_eq!(proxies.client_ip(ip("::1"), &h), ip("192.0.2.4"));
    }

    #[test]
    fn rfc_7239_forwarded_is_read_when_configured() {
        let proxies = TrustedProxies::new(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        let h = headers(
            "forwarded",
            &[
                r#"for=6.6.6.6;proto=http, For="[2001:db8:cafe::17]:4711";by=10.0.0.1"#,
                "for=10.0.0.3;host=\"a,b;c\"",
            ],
        );
        assert_eq!(
            proxies.client_ip(ip("10.0.0.2"), &h),
            ip("2001:db8:cafe::17")
        );
        // X-Forwarded-For is not read when Forwarded is configured.
        let h = headers("x-forwarded-for", &["203.0.113.7"]);
        assert_eq!(proxies.client_ip(ip("10.0.0.2"), &h), ip("10.0.0.2"));
        // `unknown` and obfuscated nodes stop the walk.
        let h = headers("forwarded", &["for=1.1.1.1, for=unknown, for=10.0.0.4"]);
        assert_eq!(proxies.client_ip(ip("10.0.0.2"), &h), ip("10.0.0.4"));
        let h = headers("forwarded", &["for=1.1.1.1, for=_hidden"]);
        assert_eq!(proxies.client_ip(ip("10.0.0.2"), &h), ip("10.0.0.2"));
    }

    #[test]
    fn invalid_ranges_are_reported() {
        let err = TrustedProxies::new(["10.0.0.0/8", "10.0.0.0/33"]).unwrap_err();
        assert!(err.to_string().contains("`10.0.0.0/33`"), "{err}");
        assert!(TrustedProxies::new(["proxy.internal"]).is_err());
        let proxies = TrustedProxies::new([" 192.0.2.0/24 ", "2001:db8::1"]).unwrap();
        assert!(proxies.is_trusted(ip("192.0.2.200")));
        assert!(!proxies.is_trusted(ip("192.0.3.1")));
        assert!(proxies.is_trusted(ip("2001:db8::1")));
        assert!(!proxies.is_trusted(ip("2001:db8::2")));
    }

    #[test]
    fn ipv6_clients_are_grouped_by_network() {
        assert_eq!(
            ip_value(ip("2001:db8:1:2:3:4:5:6"), 64),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            ip_value(ip("2001:db8:1:2:3:4:5:6"), 128),
            "2001:db8:1:2:3:4:5:6"
        );
        assert_eq!(ip_value(ip("::ffff:192.0.2.1"), 64), "192.0.2.1");
        assert_eq!(ip_value(ip("192.0.2.1"), 64), "192.0.2.1");
    }

    #[test]
    fn bearer_tokens_are_digested() {
        let h = headers("authorization", &["bearer  s3cret "]);
        let token = bearer_token(&h).unwrap();
        assert_eq!(token, "s3cret");
        let digest = token_digest(token);
        assert_eq!(digest.len(), 32);
        assert!(!digest.contains("s3cret"));
        assert_ne!(digest, token_digest("s3cres"));
        assert!(bearer_token(&headers("authorization", &["Basic abc"])).is_none());
        assert!(bearer_token(&headers("authorization", &["Bearer "])).is_none());
    }
}
