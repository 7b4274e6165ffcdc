//! A misconfigured limiter names its cause: at start-up through
//! `Limiter::ping`, on every call through `Error::kind`, and in the log line
//! the failure policy writes, at error level. An outage stays an outage.
//! Real servers on loopback, each misconfigured as an operator would.

mod support;

use support::{fault, Decide};

use std::time::Duration;

use ratelimit::{ErrorKind, FailurePolicy, Limiter, Quota, Request, TlsConfig};
use support::{logged, RedisCluster, RedisServer, TlsFiles};

fn limiter(url: &str) -> Limiter {
    Limiter::builder()
        .redis(url)
        .timeout(Duration::from_millis(500))
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap()
}

fn quota() -> Quota {
    Quota::per_second(5).unwrap()
}

/// `limiter` fails its ping and its decisions with an error of `kind`
/// whose text contains `says`; a call under the open policy is admitted as
/// a fallback, and the log line names the kind at error level.
async fn named(limiter: &Limiter, kind: ErrorKind, says: &str) {
    let error = limiter.ping().await.expect_err("a misconfiguration");
    assert_eq!(error.kind(), kind, "ping: {error}");
    // Servers word their replies differently (Redis "no permissions",
    // Valkey "No permissions").
    assert!(
        error
            .to_string()
            .to_lowercase()
            .contains(&says.to_lowercase()),
        "ping: {error}"
    );
    for _ in 0..2 {
        let error = limiter.decide(&quota(), "k", 1).await.expect_err("decide");
        assert_eq!(fault(&error), Some(kind), "decide: {error}");
    }
    // Past the once-a-second throttle of the failure policy's log line.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let quota = quota();
    let (admitted, log) = logged(limiter.check(Request::new(&quota, "k"))).await;
    assert!(admitted.is_ok_and(|a| a.decisions()[0].fallback), "{log}");
    assert!(
        log.contains("ERROR") && log.contains(&format!("kind={}", kind.as_str())),
        "the log names the kind at error level: {log}"
    );
    assert!(kind.is_misconfiguration());
}

async fn requiring_password(server: &RedisServer) {
    let mut connection = server.connection().await;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret")
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_wrong_password_or_none_is_an_authentication_error() {
    let server = RedisServer::start();
    requiring_password(&server).await;
    let port = server.port();
    let wrong = limiter(&format!("redis://:nope@127.0.0.1:{port}"));
    named(&wrong, ErrorKind::Authentication, "authentication").await;
    let error = wrong.ping().await.unwrap_err().to_string();
    assert!(
        !error.contains("nope"),
        "the password stays secret: {error}"
    );
    assert!(
        error.contains(&format!("127.0.0.1:{port}")),
        "names the server: {error}"
    );
    let missing = limiter(&format!("redis://127.0.0.1:{port}"));
    named(&missing, ErrorKind::Authentication, "NOAUTH").await;
    let right = limiter(&format!("redis://:s3cret@127.0.0.1:{port}"));
    right.ping().await.unwrap();
    assert!(right.decide(&quota(), "k", 1).await.unwrap().allowed);
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_tls_error() {
    let files = TlsFiles::generate();
    let server = RedisServer::start_tls(&files, false);
    let untrusting = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(500))
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap();
    named(&untrusting, ErrorKind::Tls, "UnknownIssuer").await;
    let trusting = Limiter::builder()
        .redis(server.url())
        .tls(TlsConfig::new().root_certificate(files.read("ca.pem")))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    trusting.ping().await.unwrap();
}

#[tokio::test]
async fn a_user_without_the_keys_is_a_permission_error() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("elsewhere")
        .arg("on")
        .arg(">pw")
        .arg("~other:*")
        .arg("+@all")
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
    let url = server.url().replace("redis://", "redis://elsewhere:pw@");
    named(&limiter(&url), ErrorKind::Permission, "no permissions").await;
}

#[tokio::test]
async fn the_wrong_kind_of_server_is_named() {
    let cluster = RedisCluster::start(3, 0);
    let on_a_node = limiter(&cluster.urls()[0]);
    named(&on_a_node, ErrorKind::WrongServer, "a Redis Cluster node").await;

    let plain = RedisServer::start();
    let as_cluster = Limiter::builder()
        .cluster([plain.url()])
        .timeout(Duration::from_millis(500))
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap();
    let error = as_cluster.ping().await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::WrongServer, "{error}");
    assert!(
        error.to_string().contains("LimiterBuilder::redis"),
        "{error}"
    );

    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &plain.port().to_string()]);
    named(&limiter(&replica.url()), ErrorKind::WrongServer, "replica").await;

    let right = Limiter::builder()
        .cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    right.ping().await.unwrap();
}

/// An unreachable server is an outage, not a misconfiguration: named, fast,
/// and left to the failure policy.
#[tokio::test]
async fn a_refused_connection_or_an_unknown_host_is_unavailable_and_named() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let address = url.trim_start_matches("redis://").to_owned();
    for (url, says, at) in [
        (url.as_str(), "refused", address.as_str()),
        (
            "redis://no-such-host.invalid:6379",
            "lookup",
            "no-such-host.invalid:6379",
        ),
    ] {
        let limiter = limiter(url);
        let error = limiter.ping().await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
        assert!(!error.kind().is_misconfiguration());
        assert!(error.to_string().contains(says), "{error}");
        assert!(error.to_string().contains(at), "names the server: {error}");
        let error = limiter.decide(&quota(), "k", 1).await.unwrap_err();
        assert_eq!(
            fault(&error),
            Some(ErrorKind::Unavailable),
            "named, not a timeout: {error}"
        );
    }
    // A cluster whose first node refuses names that node.
    let as_cluster = Limiter::builder()
        .cluster([url.clone()])
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let error = as_cluster.ping().await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(
        error.to_string().contains(&address),
        "names the node: {error}"
    );
    assert!(Limiter::memory().ping().await.is_ok());
}

/// An invalid URL among several (a Cluster's seeds, a Sentinel set) is
/// named alone, without its password, so the error says which one to fix.
#[test]
fn an_invalid_url_among_several_is_named_alone() {
    let urls = [
        "redis://127.0.0.1:7000".to_owned(),
        "redis://:s3cret@127.0.0.1:99999".to_owned(),
    ];
    for built in [
        Limiter::builder().cluster(urls.clone()).build(),
        Limiter::builder()
            .sentinel("mymaster", urls.clone())
            .build(),
    ] {
        let error = built.expect_err("port 99999 does not parse").to_string();
        assert!(error.contains("127.0.0.1:99999"), "{error}");
        assert!(!error.contains("7000"), "names the valid URL too: {error}");
        assert!(!error.contains("s3cret"), "{error}");
    }
}

/// A user who may read the keys but not run a command the scripts write
/// with (`SET` for the buckets and windows, `ZADD` for the log, `DEL` for
/// resets and refunds) is named by `ping`, with the commands it lacks. The
/// ping's peek runs only reads, and passed: the first admission failed.
#[tokio::test]
async fn a_user_without_a_command_the_script_writes_with_is_named_by_ping() {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    for (user, refused, named) in [
        ("no-set", &["-set", "-psetex"][..], &["SET", "PSETEX"][..]),
        ("no-zadd", &["-zadd"], &["ZADD"]),
        ("no-del", &["-del"], &["DEL"]),
    ] {
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg(&["on", ">pw", "~*", "+@all"])
            .arg(refused)
            .query_async::<()>(&mut connection)
            .await
            .unwrap();
        let url = server
            .url()
            .replace("redis://", &format!("redis://{user}:pw@"));
        let error = limiter(&url).ping().await.expect_err(user);
        assert_eq!(error.kind(), ErrorKind::Permission, "{user}: {error}");
        for command in named {
            assert!(error.to_string().contains(command), "{user}: {error}");
        }
    }
    // The line the setup guide gives passes.
    let url = server.url().replace("redis://", "redis://default@");
    limiter(&url).ping().await.unwrap();
}

#[tokio::test]
async fn a_password_required_after_the_limiter_connected_is_named() {
    // An operator turns on a password, and the connections the limiter
    // holds are closed: it connects again without one.
    let server = RedisServer::start();
    let limiter = limiter(&server.url());
    limiter.decide(&quota(), "k", 1).await.unwrap();
    // Connected before the password: it stays so.
    let mut admin = server.connection().await;
    requiring_password(&server).await;
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut admin)
        .await
        .unwrap();
    named(&limiter, ErrorKind::Authentication, "NOAUTH").await;
}

#[tokio::test]
async fn a_database_the_server_does_not_have_is_named() {
    let server = RedisServer::start_with(&["--databases", "4"]);
    let url = format!("{}/9", server.url());
    named(
        &limiter(&url),
        ErrorKind::Configuration,
        "DB index is out of range",
    )
    .await;
    let error = limiter(&url).ping().await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains(&format!("127.0.0.1:{}", server.port())),
        "names the server: {error}"
    );
}

#[tokio::test]
async fn a_server_that_cannot_run_the_script_is_named_without_the_calls_keys() {
    let server = RedisServer::start_with(&[
        "--rename-command",
        "FCALL",
        "",
        "--rename-command",
        "EVALSHA",
        "",
    ]);
    let limiter = limiter(&server.url());
    named(&limiter, ErrorKind::WrongServer, "unknown command").await;
    // The server's refusal repeats the call's first arguments: its keys,
    // other callers' among them, which the error and the log leave out.
    let fresh = self::limiter(&server.url());
    let error = fresh.inspect(&quota(), "user-4711", 1).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::WrongServer, "{error}");
    assert!(!error.to_string().contains("user-4711"), "{error}");
}

#[tokio::test]
async fn an_open_breaker_still_names_the_misconfiguration_it_opened_on() {
    let master = RedisServer::start();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    // A breaker that probes after a minute: open while this test runs.
    let limiter = Limiter::builder()
        .redis(replica.url())
        .timeout(Duration::from_millis(500))
        .failure_policy(FailurePolicy::Open)
        .breaker({
            let mut breaker = ratelimit::BreakerConfig::default();
            breaker.initial_backoff = Duration::from_secs(60);
            breaker.max_backoff = Duration::from_secs(60);
            breaker
        })
        .build()
        .unwrap();
    let quota = quota();
    // Until the breaker skips the server (it opens after three failures).
    let mut skipped = None;
    for _ in 0..50 {
        let denied = limiter.decide(&quota, "k", 1).await.unwrap_err();
        if fault(&denied) == Some(ErrorKind::CircuitOpen) {
            skipped = Some(denied);
            break;
        }
    }
    assert!(skipped.is_some(), "the breaker never opened");
    // Past the once-a-second throttle of the failure policy's log line,
    // which the breaker answers now: still at error level, with the cause.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (admitted, log) = logged(limiter.check(Request::new(&quota, "k"))).await;
    assert!(admitted.is_ok_and(|a| a.decisions()[0].fallback), "{log}");
    assert!(
        log.contains("ERROR")
            && log.contains("kind=circuit_open")
            && log.contains("cause=wrong_server"),
        "{log}"
    );
}
