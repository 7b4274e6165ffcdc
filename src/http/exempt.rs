//! Allowlists: requests a layer lets through without asking its limits.

use std::fmt;
use std::sync::Arc;

use axum::http::request::Parts;
use ipnet::IpNet;

use super::fields;
use super::key::{
    in_ranges, parse_ranges, peer_ip, ClientAddr, InvalidAddressRange, TrustedProxies,
};

/// Requests a [`RateLimitLayer`](super::RateLimitLayer) lets through without
/// asking its limits (an allowlist): by the peer's address, by the client's
/// address behind trusted proxies, or by a predicate on the request. Each
/// exemption has a name; a request it lets through takes no token, gets no
/// rate limit fields, and is counted with the outcome `exempt` under the
/// `rule` `<layer>.<exemption>` ([`StatsSnapshot::exempt`](crate::StatsSnapshot::exempt)).
///
/// ```
/// use ratelimit::http::{Exemption, Limit, RateLimitLayer, TrustedProxies};
/// use ratelimit::{Limiter, Quota};
///
/// let per_ip = Limit::per_peer_ip(Quota::per_second(10)?);
/// let layer = RateLimitLayer::new(Limiter::memory(), per_ip)
///     .name("api")
///     // The office network, seen directly:
///     .exempt(Exemption::peers("office", ["192.0.2.0/24", "2001:db8::/48"])?)
///     // Monitoring, behind the load balancer:
///     .exempt(Exemption::clients(
///         "monitoring",
///         TrustedProxies::new(["10.0.0.0/8"])?,
///         ["198.51.100.7"],
///     )?)
///     // Health checks, whoever sends them:
///     .exempt(Exemption::when("health", |request| request.uri.path() == "/healthz"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct Exemption {
    pub(crate) name: String,
    test: Test,
}

#[derive(Clone)]
enum Test {
    Peer(Vec<IpNet>),
    Client(TrustedProxies, Vec<IpNet>),
    When(Arc<dyn Fn(&Parts) -> bool + Send + Sync>),
}

impl Exemption {
    /// Requests whose peer address (axum's `ConnectInfo<SocketAddr>`) is one
    /// of `ranges`: addresses (`"192.0.2.7"`) or CIDR ranges
    /// (`"192.0.2.0/24"`). A request with no peer address is not exempt (a
    /// router served without `into_make_service_with_connect_info`, logged
    /// at error level).
    ///
    /// # Panics
    ///
    /// If `name` is empty or not printable ASCII.
    #[track_caller]
    pub fn peers<I>(name: impl Into<String>, ranges: I) -> Result<Self, InvalidAddressRange>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Ok(Self::new(
            name,
            Test::Peer(parse_ranges(ranges, "exempt address")?),
        ))
    }

    /// Requests whose client address, as `proxies` find it (see
    /// [`TrustedProxies::client`]), is one of `ranges`. A client named by
    /// a hop that is no address is not exempt.
    ///
    /// # Panics
    ///
    /// If `name` is empty or not printable ASCII.
    #[track_caller]
    pub fn clients<I>(
        name: impl Into<String>,
        proxies: TrustedProxies,
        ranges: I,
    ) -> Result<Self, InvalidAddressRange>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let ranges = parse_ranges(ranges, "exempt address")?;
        Ok(Self::new(name, Test::Client(proxies, ranges)))
    }

    /// Requests for which `predicate` is true, given the request's head.
    ///
    /// # Panics
    ///
    /// If `name` is empty or not printable ASCII.
    #[track_caller]
    pub fn when<F>(name: impl Into<String>, predicate: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        Self::new(name, Test::When(Arc::new(predicate)))
    }

    #[track_caller]
    fn new(name: impl Into<String>, test: Test) -> Self {
        let name = name.into();
        fields::check_policy_name(&name);
        Self { name, test }
    }

    /// Whether this exemption reads the peer's address.
    pub(crate) fn needs_peer(&self) -> bool {
        matches!(self.test, Test::Peer(_) | Test::Client(..))
    }

    /// Whether `request` is exempt.
    pub(crate) fn covers(&self, request: &Parts) -> bool {
        match &self.test {
            Test::Peer(ranges) => peer_ip(request).is_some_and(|ip| in_ranges(ranges, ip)),
            Test::Client(proxies, ranges) => {
                let Some(peer) = peer_ip(request) else {
                    return false;
                };
                match proxies.client(peer, &request.headers) {
                    ClientAddr::Ip(ip) => in_ranges(ranges, ip),
                    ClientAddr::Unreadable(_) => false,
                }
            }
            Test::When(predicate) => predicate(request),
        }
    }
}

impl fmt::Debug for Exemption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("Exemption");
        out.field("name", &self.name);
        match &self.test {
            Test::Peer(ranges) => out.field("peers", &ranges_text(ranges)),
            Test::Client(proxies, ranges) => out
                .field("proxies", proxies)
                .field("clients", &ranges_text(ranges)),
            Test::When(_) => out.field("when", &"(..)"),
        };
        out.finish()
    }
}

fn ranges_text(ranges: &[IpNet]) -> Vec<String> {
    ranges.iter().map(IpNet::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::ConnectInfo;
    use axum::http::Request;
    use std::net::{IpAddr, SocketAddr};

    fn from(ip: &str, forwarded: Option<&str>) -> Parts {
        let mut request = Request::get("/x");
        if let Some(hops) = forwarded {
            request = request.header("x-forwarded-for", hops);
        }
        let mut request = request.body(()).unwrap();
        let ip: IpAddr = ip.parse().unwrap();
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::new(ip, 4711)));
        request.into_parts().0
    }

    #[test]
    fn address_exemptions_match_ranges_and_only_trusted_forwarding() {
        let office = Exemption::peers("office", ["192.0.2.0/24", "2001:db8::/48"]).unwrap();
        assert!(office.covers(&from("192.0.2.200", None)));
        assert!(
            office.covers(&from("::ffff:192.0.2.1", None)),
            "IPv4-mapped"
        );
        assert!(office.covers(&from("2001:db8:0:1::5", None)));
        assert!(!office.covers(&from("192.0.3.1", None)));
        // A header cannot make a peer exempt.
        assert!(!office.covers(&from("198.51.100.1", Some("192.0.2.1"))));

        let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
        let monitoring = Exemption::clients("monitoring", proxies, ["198.51.100.7"]).unwrap();
        assert!(monitoring.covers(&from("10.1.1.1", Some("198.51.100.7"))));
        assert!(
            !monitoring.covers(&from("203.0.113.9", Some("198.51.100.7"))),
            "untrusted peer"
        );
        assert!(!monitoring.covers(&from("10.1.1.1", Some("198.51.100.8"))));
    }

    #[test]
    fn a_range_that_is_no_address_is_named_in_the_error() {
        let error = Exemption::peers("office", ["192.0.2.0/33"]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid exempt address `192.0.2.0/33`; expected an IP address such as \
             `10.0.0.1` or a CIDR range such as `10.0.0.0/8`"
        );
    }
}
