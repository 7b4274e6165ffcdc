//! `rediss://` against private TLS-only redis-server processes, with a CA,
//! server and client certificates made by the test: standalone, Cluster, and
//! Sentinels with their master and replica.

mod support;

use support::Decide;

use std::time::{Duration, Instant};

use ratelimit::{Error, Limiter, Quota, RedisRuleSource, Request, TlsConfig};
use support::{
    master_port, sentinel_command, sentinel_set_with, wait_for, SENTINEL_MASTER as MASTER,
};
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
    support::read_rules(
        &source,
        Duration::from_secs(5),
        "the rule source reads over TLS",
    )
    .await;
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
        matches!(refused, Err(Error::Connect { .. } | Error::Timeout(_))),
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
        Err(Error::Connect { source: error, .. }) => {
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
        .timeout(Duration::from_secs(5))
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

/// Sentinels and a master that serve TLS only, with a private CA: the
/// limiter and the rule source find the master through the Sentinels over
/// TLS and decide on it, and a switchover moves the decisions to the new
/// master. Without the CA, the certificate is named, not a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_over_tls_name_the_master_and_a_switchover_is_followed() {
    use ratelimit::ErrorKind;
    let files = TlsFiles::generate();
    let (master, replica, sentinels) = sentinel_set_with(&[], &[], Some(&files));
    let urls: Vec<String> = sentinels.iter().map(|s| s.url()).collect();
    assert!(
        urls.iter().all(|url| url.starts_with("rediss://")),
        "{urls:?}"
    );
    let trusting = TlsConfig::new().root_certificate(files.read("ca.pem"));
    let limiter = Limiter::builder()
        .sentinel(MASTER, urls.clone())
        .tls(trusting.clone())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    limiter.ping().await.unwrap();
    let quota = Quota::per_hour(3).unwrap();
    let decided = limiter.decide(&quota, "tls:before", 1).await.unwrap();
    assert!(decided.allowed && !decided.fallback, "{decided:?}");
    assert!(
        master.script_calls().await > 0,
        "the TLS master decided nothing"
    );
    let source = RedisRuleSource::sentinel(MASTER, urls.clone())
        .tls(trusting)
        .start(&limiter)
        .unwrap();
    support::read_rules(
        &source,
        Duration::from_secs(5),
        "the rule source reads the master the Sentinels name over TLS",
    )
    .await;

    sentinel_command(&sentinels[0], &["failover", MASTER]);
    wait_for("the switch", Duration::from_secs(20), || {
        master_port(&sentinels[0]) == Some(replica.port())
    });
    let switched = Instant::now();
    loop {
        let decided = limiter.decide(&quota, "tls:after", 1).await;
        if replica.script_calls().await > 0 {
            let decided = decided.unwrap();
            assert!(decided.allowed && !decided.fallback, "{decided:?}");
            break;
        }
        assert!(
            switched.elapsed() < Duration::from_secs(10),
            "decisions did not move to the new master: {decided:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let untrusting = Limiter::builder()
        .sentinel(MASTER, urls)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let refused = untrusting
        .ping()
        .await
        .expect_err("a certificate no CA given signed");
    let text = refused.to_string().to_lowercase();
    assert!(
        !matches!(refused, Error::Timeout(_)) && refused.kind() == ErrorKind::Tls,
        "{:?}: {refused}",
        refused.kind()
    );
    assert!(
        text.contains("certificate") || text.contains("issuer"),
        "the error must say the certificate was not trusted: {refused}"
    );
}
