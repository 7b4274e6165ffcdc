//! `rediss://` against private TLS-only redis-server processes, with a CA,
//! server and client certificates made by the test.

mod support;

use support::Decide;

use std::time::Duration;

use ratelimit::{Error, Limiter, Quota, RedisRuleSource, Request, TlsConfig};
use support::{RedisServer, TlsFiles};

fn trusting(files: &TlsFiles) -> TlsConfig {
    TlsConfig::new().root_certificate(files.read("ca.pem"))
}

fn limiter(url: String, tls: TlsConfig) -> Limiter {
    Limiter::builder()
        .redis(url)
        .tls(tls)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

#[tokio::test]
async fn rediss_decides_checks_all_or_nothing_and_follows_rules_with_a_private_ca() {
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, false);
    let limiter = limiter(server.url(), trusting(&files));
    let quota = Quota::new(2, "1/min".parse().unwrap()).unwrap();
    for _ in 0..2 {
        let d = limiter.decide(&quota, "tls:user", 1).await.unwrap();
        assert!(d.allowed && !d.fallback, "{d:?}");
    }
    assert!(!limiter.decide(&quota, "tls:user", 1).await.unwrap().allowed);
    let all = limiter
        .decide_all(&[Request::new(&quota, "tls:a"), Request::new(&quota, "tls:b")])
        .await
        .unwrap();
    assert!(all.iter().all(|d| d.allowed));

    let rules = RedisRuleSource::builder(server.url()).tls(trusting(&files));
    let source = rules.clone().start(&limiter).unwrap();
    tokio::time::timeout(Duration::from_secs(5), source.ready())
        .await
        .expect("the rule source reads over TLS");
    rules
        .publish("checkout", "capacity=9 rate=1/s")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while limiter.rules().get("checkout").map(|q| q.capacity()) != Some(9) {
        assert!(
            std::time::Instant::now() < deadline,
            "the rule never arrived over TLS"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, true);
    let quota = Quota::per_second(10).unwrap();
    let without = limiter(server.url(), trusting(&files));
    let refused = without.inspect(&quota, "mtls", 1).await;
    assert!(
        matches!(refused, Err(Error::Redis(_) | Error::Timeout(_))),
        "a server requiring client certificates refused none: {refused:?}"
    );
    let with = limiter(
        server.url(),
        trusting(&files).client_certificate(files.read("client.pem"), files.read("client.key")),
    );
    let d = with.decide(&quota, "mtls", 1).await.unwrap();
    assert!(d.allowed);
}

#[tokio::test]
async fn a_certificate_the_client_cannot_verify_is_an_error_never_plaintext() {
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, false);
    let quota = Quota::per_second(10).unwrap();
    // The platform's roots do not know the test's CA.
    let untrusted = limiter(server.url(), TlsConfig::new());
    match untrusted.inspect(&quota, "k", 1).await {
        Err(Error::Redis(error)) => {
            let text = error.to_string().to_lowercase();
            assert!(
                text.contains("certificate") || text.contains("issuer"),
                "the error must say the certificate was not trusted: {error}"
            );
        }
        other => panic!("an unverifiable certificate: {other:?}"),
    }
    // Certificates for a plaintext URL are a configuration error.
    let plaintext = Limiter::builder()
        .redis(server.url().replace("rediss://", "redis://"))
        .tls(trusting(&files))
        .build();
    assert!(matches!(plaintext, Err(Error::Config(_))), "{plaintext:?}");
    // redis-rs's `#insecure` fragment still turns verification off.
    let insecure = limiter(format!("{}/#insecure", server.url()), TlsConfig::new());
    assert!(insecure.decide(&quota, "k", 1).await.unwrap().allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_redis_cluster_decides_and_checks_all_or_nothing_across_slots() {
    let files = TlsFiles::generate();
    let cluster = support::RedisCluster::start_tls(3, &files);
    let limiter = Limiter::builder()
        .cluster(cluster.urls())
        .tls(trusting(&files))
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let quota = Quota::new(2, "1/min".parse().unwrap()).unwrap();
    for i in 0..30 {
        let key = format!("tls:cluster:{i}");
        for expected in [true, true, false] {
            let d = limiter.decide(&quota, &key, 1).await.unwrap();
            assert_eq!(d.allowed, expected, "{key}: {d:?}");
        }
    }
    // Keys on different slots: consumed in order, given back on a denial.
    let spent = "tls:cluster:0";
    let denied = limiter
        .check([
            Request::new(&quota, "tls:cluster:fresh"),
            Request::new(&quota, spent),
        ])
        .await
        .unwrap_err();
    assert_eq!(denied.key, spent);
    let fresh = limiter
        .decide(&quota, "tls:cluster:fresh", 0)
        .await
        .unwrap();
    assert_eq!(
        fresh.remaining, 2,
        "the denied check gave back what it took"
    );
}
