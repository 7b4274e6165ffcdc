//! Where a request's key comes from: the peer, the client behind trusted
//! proxies, a header, a bearer token or a closure.

use std::fmt::{self, Write as _};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::ConnectInfo;
use axum::http::header::{AUTHORIZATION, FORWARDED};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName};
use ipnet::{IpNet, Ipv6Net};
use sha2::{Digest, Sha256};

use crate::KeyBuilder;

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
/// use ratelimit::http::{ClientAddr, TrustedProxies};
///
/// let proxies = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"])?;
/// let mut headers = HeaderMap::new();
/// // A client claiming to be 1.1.1.1, seen by our proxies as 203.0.113.7:
/// headers.insert("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.2".parse()?);
///
/// let via_proxy: IpAddr = "10.0.0.1".parse()?;
/// let client = proxies.client(via_proxy, &headers);
/// assert_eq!(client, ClientAddr::Ip("203.0.113.7".parse()?));
///
/// // Straight from the internet, the header is not believed:
/// let direct: IpAddr = "198.51.100.9".parse()?;
/// assert_eq!(proxies.client(direct, &headers), ClientAddr::Ip(direct));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
    header: ForwardedHeader,
}

/// The client [`TrustedProxies::client`] finds for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientAddr {
    /// The client's address.
    Ip(IpAddr),
    /// The hop where the walk stopped holds bytes outside visible ASCII, so
    /// it is no address: its raw bytes, without surrounding blanks. A layer
    /// keys such a client by these bytes, escaped, in a bucket of its own.
    Unreadable(Vec<u8>),
}

impl TrustedProxies {
    /// Trusts each of `ranges`: an address (`"10.0.0.1"`, `"::1"`) or a CIDR
    /// range (`"10.0.0.0/8"`, `"fd00::/8"`). Reads `X-Forwarded-For`.
    pub fn new<I>(ranges: I) -> Result<Self, InvalidAddressRange>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Ok(Self {
            nets: parse_ranges(ranges, "trusted proxy")?,
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
        in_ranges(&self.nets, ip)
    }

    /// The client of a request from `peer` with `headers`.
    ///
    /// When the peer is trusted, the forwarding header's hops are walked
    /// from the right, past trusted proxies, to the first one that is not
    /// trusted. If every address is trusted, the left-most is the client; if
    /// a hop is visible ASCII but not an address (`unknown`, an obfuscated
    /// node such as `_hidden`), the walk stops at the last address it had,
    /// the proxy that wrote it. A hop with bytes outside visible ASCII is
    /// [`ClientAddr::Unreadable`]: see below. Hops are read one by one, so
    /// such bytes in one hop never hide the others of the same line.
    ///
    /// Why an unreadable hop is the client, in a bucket of its own: it can
    /// only be reached when every hop to its right is a trusted proxy, so a
    /// trusted proxy passed it on as the client it saw (or appended nothing,
    /// and then the client could forge any address anyway). Stopping at the
    /// proxy instead, as an `unknown` hop does, would put every client who
    /// sends such bytes in the proxy's own bucket, which all the traffic
    /// the proxy sends in its own name shares: any client could spend it.
    /// Keyed by its raw bytes, the hop can only reach buckets of such bytes,
    /// never an address's (an escaped address has no `%80`..`%FF`) nor the
    /// proxy's. Answering `400 Bad Request` was not chosen: a rate limit is
    /// no place to reject requests a proxy chose to forward.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> ClientAddr {
        let mut client = peer.to_canonical();
        if !self.is_trusted(client) {
            return ClientAddr::Ip(client);
        }
        let hops = match self.header {
            ForwardedHeader::XForwardedFor => x_forwarded_for(headers),
            ForwardedHeader::Forwarded => forwarded_for(headers),
        };
        for hop in hops.into_iter().rev() {
            match hop {
                Hop::Ip(ip) => {
                    client = ip.to_canonical();
                    if !self.is_trusted(client) {
                        break;
                    }
                }
                Hop::NotAnAddress => break,
                Hop::Unreadable(raw) => return ClientAddr::Unreadable(raw),
            }
        }
        ClientAddr::Ip(client)
    }
}

/// One hop of a forwarding header.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hop {
    Ip(IpAddr),
    /// Visible ASCII, but no address: `unknown`, `_hidden`, garbage.
    NotAnAddress,
    /// Bytes outside visible ASCII, as they were.
    Unreadable(Vec<u8>),
}

impl Hop {
    /// Reads a node such as `192.0.2.1:8080` from raw bytes; `quoted`: a
    /// `Forwarded` value, which may be a quoted string.
    fn read(raw: &[u8], quoted: bool) -> Hop {
        let raw = raw.trim_ascii();
        let node = if quoted { unquote(raw) } else { raw.to_vec() };
        // What `HeaderValue::to_str` accepts; anything else is no address.
        let visible = |b: &u8| *b == b'\t' || (0x20..0x7F).contains(b);
        match std::str::from_utf8(&node) {
            Ok(text) if node.iter().all(visible) => {
                parse_node(text).map_or(Hop::NotAnAddress, Hop::Ip)
            }
            _ => Hop::Unreadable(node),
        }
    }
}

/// A trusted proxy or an exempt range that is neither an IP address nor a
/// CIDR range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidAddressRange {
    what: &'static str,
    range: String,
}

impl fmt::Display for InvalidAddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {} `{}`; expected an IP address such as `10.0.0.1` \
             or a CIDR range such as `10.0.0.0/8`",
            self.what, self.range
        )
    }
}

impl std::error::Error for InvalidAddressRange {}

/// Each of `ranges`, an address or a CIDR range; `what` names them in the
/// error.
pub(crate) fn parse_ranges<I>(
    ranges: I,
    what: &'static str,
) -> Result<Vec<IpNet>, InvalidAddressRange>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    ranges
        .into_iter()
        .map(|range| {
            let range = range.as_ref().trim();
            IpNet::from_str(range)
                .or_else(|_| IpAddr::from_str(range).map(IpNet::from))
                .map(canonical_net)
                .map_err(|_| InvalidAddressRange {
                    what,
                    range: range.to_owned(),
                })
        })
        .collect()
}

/// A range of IPv4-mapped IPv6 addresses (`::ffff:10.0.0.5`, as a
/// dual-stack server logs an IPv4 peer) as the IPv4 range it maps: peers
/// are compared in their canonical form, where such an address is IPv4.
fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, IpNet::V4),
            None => net,
        },
        _ => net,
    }
}

/// Whether `ip` (an IPv4-mapped IPv6 address as IPv4) is in one of `nets`.
pub(crate) fn in_ranges(nets: &[IpNet], ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    nets.iter().any(|net| net.contains(&ip))
}

/// The hops of `X-Forwarded-For`, left to right, read from the raw bytes.
fn x_forwarded_for(headers: &HeaderMap) -> Vec<Hop> {
    headers
        .get_all(HeaderName::from_static("x-forwarded-for"))
        .iter()
        .flat_map(|line| line.as_bytes().split(|&b| b == b','))
        .filter(|entry| !entry.trim_ascii().is_empty())
        .map(|entry| Hop::read(entry, false))
        .collect()
}

/// The `for=` nodes of `Forwarded`, left to right, read from the raw bytes;
/// an element with no `for=` is not an address.
fn forwarded_for(headers: &HeaderMap) -> Vec<Hop> {
    let mut hops = Vec::new();
    for line in headers.get_all(FORWARDED) {
        for element in split_unquoted(line.as_bytes(), b',') {
            if element.trim_ascii().is_empty() {
                continue;
            }
            let node = split_unquoted(element, b';')
                .into_iter()
                .filter_map(|pair| {
                    let at = pair.iter().position(|&b| b == b'=')?;
                    Some((&pair[..at], &pair[at + 1..]))
                })
                .find(|(name, _)| name.trim_ascii().eq_ignore_ascii_case(b"for"))
                .map_or(Hop::NotAnAddress, |(_, value)| Hop::read(value, true));
            hops.push(node);
        }
    }
    hops
}

/// Splits at `separator` outside quoted strings. Quotes, backslashes and
/// separators are ASCII, so bytes of other characters never match them.
///
/// A text whose last quoted string is never closed is split at every
/// separator: a client that sends `for="x` would otherwise, once a proxy
/// appends `, for=<the client's address>` to its line, have the proxy's
/// element read as part of its own, and choose its key.
fn split_unquoted(text: &[u8], separator: u8) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, &b) in text.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b if b == separator && !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return text.split(|&b| b == separator).collect();
    }
    parts.push(&text[start..]);
    parts
}

/// A quoted string's content, or the token as it is.
fn unquote(value: &[u8]) -> Vec<u8> {
    match value
        .strip_prefix(b"\"")
        .and_then(|rest| rest.strip_suffix(b"\""))
    {
        Some(inner) => {
            let mut out = Vec::with_capacity(inner.len());
            let mut bytes = inner.iter();
            while let Some(&b) = bytes.next() {
                out.push(if b == b'\\' {
                    bytes.next().copied().unwrap_or(b)
                } else {
                    b
                });
            }
            out
        }
        None => value.to_vec(),
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
/// Its absence is the server's mistake, the same for every request, which
/// the layer logs (see [`NoPeerAddress`]).
pub(crate) fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// A layer's log of requests with no peer address, at error level and once
/// a second at most.
#[derive(Debug)]
pub(crate) struct NoPeerAddress {
    start: Instant,
    /// Microseconds after `start` (plus a second, so that the first is
    /// logged) of the last line.
    last_us: AtomicU64,
}

impl NoPeerAddress {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
            last_us: AtomicU64::new(0),
        }
    }

    /// Logs, unless a line went out less than a second ago.
    pub(crate) fn report(&self, layer: &str) {
        let now_us = self.start.elapsed().as_micros() as u64 + 1_000_000;
        let last = self.last_us.load(Ordering::Relaxed);
        if now_us.saturating_sub(last) < 1_000_000
            || self
                .last_us
                .compare_exchange(last, now_us, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        tracing::error!(
            layer,
            "the server records no peer address (`ConnectInfo<SocketAddr>`) for a rate limit or \
             exemption keyed on the client's address; serve the router with \
             `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`: \
             until then, address limits answer 500 (pass, in shadow mode) and address \
             exemptions exempt nothing (logged once a second at most)"
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

/// A key that takes an await to find.
pub(crate) type KeyFuture = Pin<Box<dyn Future<Output = Option<String>> + Send>>;

/// What an async key closure makes of a request.
pub(crate) type AsyncKeyFn = dyn Fn(&Parts) -> KeyFuture + Send + Sync;

/// Where a limit's key comes from.
#[derive(Clone)]
pub(crate) enum KeySource {
    PeerIp,
    ClientIp(TrustedProxies),
    Header(HeaderName),
    BearerToken,
    Custom(Arc<KeyFn>),
    Async(Arc<AsyncKeyFn>),
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
            KeySource::Async(_) => f.write_str("Async(..)"),
            KeySource::Global => f.write_str("Global"),
        }
    }
}

impl KeySource {
    /// The part of the default key prefix that names the source, after
    /// `http:<name>:`; a header's name is escaped like a value.
    pub(crate) fn push_tag(&self, key: &mut KeyBuilder) {
        match self {
            KeySource::PeerIp | KeySource::ClientIp(_) => key.push_literal("ip:"),
            KeySource::Header(name) => {
                key.push_literal("header:");
                key.push_value(name.as_str());
                key.push_literal(":");
            }
            KeySource::BearerToken => key.push_literal("token:"),
            // One namespace for closures, synchronous or not: the same
            // values are the same clients.
            KeySource::Custom(_) | KeySource::Async(_) => key.push_literal("key:"),
            KeySource::Global => key.push_literal("global"),
        }
    }

    /// Appends the request's value to `key`, escaped, or says why it
    /// cannot (and appends nothing). The global source appends nothing: its
    /// key is the prefix alone. Only an async closure awaits.
    pub(crate) async fn push_value(
        &self,
        parts: &Parts,
        ipv6_prefix_len: u8,
        key: &mut KeyBuilder,
    ) -> Pushed {
        match self {
            KeySource::PeerIp => match peer_ip(parts) {
                Some(ip) => key.push_value(ip_value(ip, ipv6_prefix_len).as_str()),
                None => return Pushed::NoPeerAddress,
            },
            KeySource::ClientIp(proxies) => match peer_ip(parts) {
                Some(peer) => match proxies.client(peer, &parts.headers) {
                    ClientAddr::Ip(ip) => key.push_value(ip_value(ip, ipv6_prefix_len).as_str()),
                    ClientAddr::Unreadable(raw) => push_raw_value(key, &raw),
                },
                None => return Pushed::NoPeerAddress,
            },
            KeySource::Header(name) => {
                let Some(value) = parts.headers.get(name) else {
                    return Pushed::Missing;
                };
                let value = value.as_bytes().trim_ascii();
                if value.is_empty() {
                    return Pushed::Missing;
                }
                // A header keyed on is most often a credential (an API
                // key, `Authorization`): keys end up in Redis and in logs.
                key.push_value(hex_digest(value).as_str());
            }
            KeySource::BearerToken => match bearer_token(&parts.headers) {
                Some(token) => key.push_value(token_digest(token).as_str()),
                None => return Pushed::Missing,
            },
            KeySource::Custom(value) => match value(parts) {
                Some(value) => key.push_value(value.as_str()),
                None => return Pushed::Missing,
            },
            KeySource::Async(value) => match value(parts).await {
                Some(value) => key.push_value(value.as_str()),
                None => return Pushed::Missing,
            },
            KeySource::Global => {}
        }
        Pushed::Value
    }
}

/// What [`KeySource::push_value`] did.
pub(crate) enum Pushed {
    /// The request's value is in the key.
    Value,
    /// The request has none (no such header, no token, a closure's `None`):
    /// [`MissingKey`](super::MissingKey) says what to do.
    Missing,
    /// The server records no peer address, which no request can mend.
    NoPeerAddress,
}

/// Appends raw bytes (a header value, which need not be UTF-8) escaped as
/// [`KeyBuilder::push_value`] escapes text, so that two different byte
/// strings never make one key, and a string and its UTF-8 bytes make the
/// same. Text is escaped one byte of its UTF-8 form at a time, every byte
/// outside the value characters becoming `%XX`; bytes that are not UTF-8
/// are escaped the same way here. No text escapes to a lone `%FF` or to
/// `%C3` before a byte that cannot follow it, so these keys never meet the
/// key of any text. Past [`MAX_VALUE_LEN`](ratelimit_core::key::MAX_VALUE_LEN)
/// escaped bytes the value is its digest, `%_` and 128 bits of the bytes'
/// SHA-256, as text's is.
fn push_raw_value(key: &mut KeyBuilder, raw: &[u8]) {
    match std::str::from_utf8(raw) {
        // The runtime owns the escaping of text.
        Ok(text) => key.push_value(text),
        Err(_) => key.push_literal(&escape_bytes(raw)),
    }
}

/// Escapes bytes one by one as the runtime escapes UTF-8 text (see
/// [`push_raw_value`]).
fn escape_bytes(raw: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(raw.len());
    for &b in raw {
        if b.is_ascii() && ratelimit_core::key::is_value_char(char::from(b)) {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xF)]));
        }
        if out.len() > ratelimit_core::key::MAX_VALUE_LEN {
            return format!("%_{}", hex_digest(raw));
        }
    }
    out
}

/// The token of `Authorization: Bearer <token>` (the scheme is
/// case-insensitive, RFC 9110 section 11.1), as raw bytes: a token with bytes
/// outside visible ASCII is still a token of its own, not a missing one.
fn bearer_token(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(AUTHORIZATION)?.as_bytes().trim_ascii();
    let at = value.iter().position(|&b| b == b' ')?;
    let (scheme, token) = (&value[..at], value[at + 1..].trim_ascii());
    (scheme.eq_ignore_ascii_case(b"bearer") && !token.is_empty()).then_some(token)
}

/// 128 bits of the SHA-256 of `bytes`, in lowercase hex.
fn hex_digest(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut hex = String::with_capacity(32);
    for b in &digest[..16] {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// 128 bits of the token's SHA-256, in hex: bearer tokens are secrets, and
/// keys end up in Redis and in logs.
fn token_digest(token: &[u8]) -> String {
    hex_digest(token)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

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

    fn client_ip(proxies: &TrustedProxies, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        match proxies.client(peer, headers) {
            ClientAddr::Ip(ip) => ip,
            other => panic!("expected an address, got {other:?}"),
        }
    }

    #[test]
    fn forwarded_for_is_ignored_unless_the_peer_is_trusted() {
        let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let h = headers("x-forwarded-for", &["203.0.113.7"]);
        assert_eq!(client_ip(&proxies, ip("192.0.2.1"), &h), ip("192.0.2.1"));
        assert_eq!(client_ip(&proxies, ip("10.1.2.3"), &h), ip("203.0.113.7"));
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client() {
        let proxies = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"]).unwrap();
        // Spoofed entries to the left of what our proxies appended are skipped.
        let h = headers(
            "x-forwarded-for",
            &["6.6.6.6, 1.1.1.1", "203.0.113.7, 10.0.0.9"],
        );
        assert_eq!(client_ip(&proxies, ip("127.0.0.1"), &h), ip("203.0.113.7"));
        // Every hop trusted: the left-most is the client.
        let h = headers("x-forwarded-for", &["10.0.0.5, 10.0.0.9"]);
        assert_eq!(client_ip(&proxies, ip("127.0.0.1"), &h), ip("10.0.0.5"));
        // No header: the trusted peer itself.
        assert_eq!(
            client_ip(&proxies, ip("127.0.0.1"), &HeaderMap::new()),
            ip("127.0.0.1")
        );
        // Garbage stops the walk at the last address known.
        let h = headers("x-forwarded-for", &["1.1.1.1, unknown, 10.0.0.9"]);
        assert_eq!(client_ip(&proxies, ip("127.0.0.1"), &h), ip("10.0.0.9"));
    }

    #[test]
    fn ports_brackets_and_mapped_addresses_are_understood() {
        let proxies = TrustedProxies::new(["::1", "10.0.0.1"]).unwrap();
        let h = headers("x-forwarded-for", &["[2001:db8::7]:4711, 198.51.100.2:80"]);
        assert_eq!(client_ip(&proxies, ip("::1"), &h), ip("198.51.100.2"));
        let h = headers("x-forwarded-for", &["2001:db8::7"]);
        assert_eq!(
            client_ip(&proxies, ip("::ffff:10.0.0.1"), &h),
            ip("2001:db8::7")
        );
        let h = headers("x-forwarded-for", &["::ffff:192.0.2.4"]);
        assert_eq!(client_ip(&proxies, ip("::1"), &h), ip("192.0.2.4"));
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
            client_ip(&proxies, ip("10.0.0.2"), &h),
            ip("2001:db8:cafe::17")
        );
        // X-Forwarded-For is not read when Forwarded is configured.
        let h = headers("x-forwarded-for", &["203.0.113.7"]);
        assert_eq!(client_ip(&proxies, ip("10.0.0.2"), &h), ip("10.0.0.2"));
        // `unknown` and obfuscated nodes stop the walk.
        let h = headers("forwarded", &["for=1.1.1.1, for=unknown, for=10.0.0.4"]);
        assert_eq!(client_ip(&proxies, ip("10.0.0.2"), &h), ip("10.0.0.4"));
        let h = headers("forwarded", &["for=1.1.1.1, for=_hidden"]);
        assert_eq!(client_ip(&proxies, ip("10.0.0.2"), &h), ip("10.0.0.2"));
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

    fn raw_headers(name: &'static str, values: &[&[u8]]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(name, HeaderValue::from_bytes(value).unwrap());
        }
        headers
    }

    #[test]
    fn bytes_outside_visible_ascii_spoil_one_hop_not_the_line() {
        let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        // The client wrote the first hop; our proxy appended what it saw.
        let h = raw_headers("x-forwarded-for", &[b"\xff\xfe, 203.0.113.7"]);
        assert_eq!(client_ip(&proxies, ip("10.0.0.1"), &h), ip("203.0.113.7"));
        // Reached past trusted proxies, such a hop is the client.
        let h = raw_headers("x-forwarded-for", &[b" caf\xc3\xa9 , 10.0.0.2"]);
        assert_eq!(
            proxies.client(ip("10.0.0.1"), &h),
            ClientAddr::Unreadable(b"caf\xc3\xa9".to_vec())
        );
        let proxies = proxies.header(ForwardedHeader::Forwarded);
        let h = raw_headers(
            "forwarded",
            &[b"for=\"\xff\";proto=http, for=192.0.2.9;host=\"\xfe\""],
        );
        assert_eq!(client_ip(&proxies, ip("10.0.0.1"), &h), ip("192.0.2.9"));
        let h = raw_headers("forwarded", &[b"for=192.0.2.9, for=\"\xff\xff\""]);
        assert_eq!(
            proxies.client(ip("10.0.0.1"), &h),
            ClientAddr::Unreadable(b"\xff\xff".to_vec()),
            "the value inside the quotes, as it came"
        );
    }

    #[test]
    fn an_unclosed_quote_never_takes_in_the_element_a_proxy_appends() {
        let proxies = TrustedProxies::new(["10.0.0.0/8"])
            .unwrap()
            .header(ForwardedHeader::Forwarded);
        // The client sent `for="...` with no closing quote; the proxy
        // appended what it saw to the same line.
        for sent in [
            &b"for=\"\x80nonce-1"[..],
            b"for=\"x",
            b"for=\"1.1.1.1\\\"",
            b"for=1.1.1.1;host=\"a",
        ] {
            let mut line = sent.to_vec();
            line.extend_from_slice(b", for=203.0.113.5");
            let h = raw_headers("forwarded", &[&line]);
            assert_eq!(
                proxies.client(ip("10.0.0.1"), &h),
                ClientAddr::Ip(ip("203.0.113.5")),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
            let mut line = sent.to_vec();
            line.extend_from_slice(b", for=\"[2001:db8::5]:80\"");
            let h = raw_headers("forwarded", &[&line]);
            assert_eq!(
                proxies.client(ip("10.0.0.1"), &h),
                ClientAddr::Ip(ip("2001:db8::5")),
                "{:?}",
                String::from_utf8_lossy(&line)
            );
        }
    }

    #[test]
    fn ranges_written_as_ipv4_mapped_addresses_hold_ipv4_peers() {
        let proxies = TrustedProxies::new(["::ffff:10.0.0.5", "::ffff:192.0.2.0/120"]).unwrap();
        for peer in ["10.0.0.5", "::ffff:10.0.0.5", "192.0.2.77"] {
            assert!(proxies.is_trusted(ip(peer)), "{peer}");
        }
        assert!(!proxies.is_trusted(ip("10.0.0.6")));
        assert!(!proxies.is_trusted(ip("192.0.3.1")));
        let h = headers("x-forwarded-for", &["203.0.113.8"]);
        assert_eq!(client_ip(&proxies, ip("10.0.0.5"), &h), ip("203.0.113.8"));
        // A range wider than the mapped addresses stays as written.
        let proxies = TrustedProxies::new(["::/0"]).unwrap();
        assert!(proxies.is_trusted(ip("2001:db8::1")));
    }

    fn raw_key(raw: &[u8]) -> String {
        let mut key = KeyBuilder::new();
        push_raw_value(&mut key, raw);
        key.finish()
    }

    #[test]
    fn raw_values_escape_byte_by_byte_as_text_does() {
        assert_ne!(raw_key(b"\xff"), raw_key(b"\xfe"));
        assert_eq!(raw_key(b"\xff"), "%FF");
        assert_eq!(raw_key(b"a\xc3"), "a%C3");
        // Text escapes to the same key as its bytes would.
        for text in [
            "alice",
            "alice:{x}",
            "caf\u{e9}",
            "\u{1F600}",
            &"\u{e9}".repeat(40),
        ] {
            let mut key = KeyBuilder::new();
            key.push_value(text);
            assert_eq!(escape_bytes(text.as_bytes()), key.finish(), "{text:?}");
        }
        // Long: the digest of the bytes, never the escaped prefix.
        let long = [0xffu8; 30];
        let key = raw_key(&long);
        assert!(key.starts_with("%_") && key.len() == 34, "{key}");
        let mut other = long;
        other[29] = 0xfe;
        assert_ne!(raw_key(&other), key);
    }

    #[test]
    fn bearer_tokens_are_digested() {
        let h = headers("authorization", &["bearer  s3cret "]);
        let token = bearer_token(&h).unwrap();
        assert_eq!(token, b"s3cret");
        let digest = token_digest(token);
        assert_eq!(digest.len(), 32);
        assert!(!digest.contains("s3cret"));
        assert_ne!(digest, token_digest(b"s3cres"));
        assert!(bearer_token(&headers("authorization", &["Basic abc"])).is_none());
        assert!(bearer_token(&headers("authorization", &["Bearer "])).is_none());
    }
}
