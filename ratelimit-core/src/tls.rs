//! TLS for `rediss://` connections, through redis-rs's rustls support.

use std::fmt;

/// Certificates for `rediss://` connections, given to
/// [`LimiterBuilder::tls`](crate::LimiterBuilder::tls) and
/// `RedisRuleSourceBuilder::tls` (feature `redis`).
///
/// With none given, a `rediss://` URL trusts the platform's root
/// certificates (read by rustls-native-certs, which honours
/// `SSL_CERT_FILE`). A certificate the client cannot verify is an error,
/// never a fallback to plaintext. redis-rs's `#insecure` URL fragment
/// (`rediss://host:6380/#insecure`) still turns verification off, for tests.
///
/// ```
/// use ratelimit_core::{Limiter, TlsConfig};
///
/// # fn pem(_: &str) -> Vec<u8> { Vec::new() }
/// let tls = TlsConfig::new()
///     .root_certificate(pem("ca.pem"))                            // a private CA
///     .client_certificate(pem("client.pem"), pem("client.key")); // mutual TLS
/// let limiter = Limiter::builder()
///     .redis("rediss://redis.internal:6380")
///     .tls(tls)
///     .build();
/// ```
#[derive(Clone, Default)]
pub struct TlsConfig {
    root_certificate: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsConfig {
    /// No certificates: the platform's roots, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificate(s) in `pem` instead of the platform's
    /// roots, as redis-rs does (to trust both, add the CA to the file
    /// `SSL_CERT_FILE` names).
    pub fn root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// Presents this certificate chain and its private key (both PEM) to the
    /// server, for servers that require client certificates (mutual TLS).
    pub fn client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Whether any certificate was given.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn is_set(&self) -> bool {
        self.root_certificate.is_some() || self.client.is_some()
    }

    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_certificate.clone(),
        }
    }
}

impl fmt::Debug for TlsConfig {
    // Certificates are long and a key is a secret: say only what is set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("root_certificate", &self.root_certificate.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

/// rustls needs a process-wide crypto provider; redis-rs leaves the choice
/// to the application. Installs ring's unless one is installed already.
#[cfg(feature = "tls")]
pub(crate) fn ensure_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Another thread may install one first; either is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}
