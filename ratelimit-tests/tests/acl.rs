//! The limiter, every algorithm and the rule source as a Redis ACL user with
//! exactly the permissions the guide's `ACL SETUSER` line (docs/setup.md) grants.

mod support;

use support::Decide;

use std::time::Duration;

use ratelimit::{
    Algorithm, DenialCause, Error, ErrorKind, FailurePolicy, Limiter, Quota, Rate, RedisRuleSource,
    Request,
};
use support::RedisServer;

const PASSWORD: &str = "pw-7f3a9c";

/// The guide's line, with the password filled in.
fn acl_line() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/setup.md"))
        .expect("read docs/setup.md");
    let line = readme
        .lines()
        .find(|l| l.starts_with("ACL SETUSER ratelimit "))
        .expect("docs/setup.md gives the `ACL SETUSER ratelimit ...` line");
    line.split_whitespace()
        .map(|word| word.replace(">PASSWORD", &format!(">{PASSWORD}")))
        .collect()
}

/// Creates the guide's user on `server`, without the commands `without`.
async fn set_up_user_without(server: &RedisServer, without: &[&str]) {
    let mut admin = server.connection().await;
    let line: Vec<String> = acl_line()
        .into_iter()
        .filter(|word| !without.contains(&word.as_str()))
        .collect();
    let mut setuser = redis::cmd(&line[0]);
    for word in &line[1..] {
        setuser.arg(word);
    }
    let _: () = setuser
        .query_async(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("the guide's ACL line: {e}"));
}

/// Creates the guide's user on `server`.
async fn set_up_user(server: &RedisServer) {
    set_up_user_without(server, &[]).await;
}

fn as_user(server: &RedisServer, password: &str) -> String {
    format!("redis://ratelimit:{password}@127.0.0.1:{}", server.port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_runs_on_the_least_privileged_acl_user_of_the_readme() {
    let server = RedisServer::start();
    set_up_user(&server).await;
    let mut admin = server.connection().await;
    let url = as_user(&server, PASSWORD);
    let limiter = Limiter::builder()
        .redis(url.clone())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // The start-up check needs nothing the line does not grant. (It asks
    // ACL by a short script of its own, by EVALSHA.)
    limiter.ping().await.unwrap();
    let pinged_by_evalsha = server.command_calls(&["evalsha"]).await;
    // Slow enough that no token comes back and no window turns over while a
    // round runs, however loaded the machine: a fixed window of 10 s once
    // began a new count between the third admission and the denial.
    let rate = Rate::per_hour(1).unwrap();
    let quotas: Vec<Quota> = Algorithm::ALL
        .iter()
        .map(|&algorithm| {
            let builder = Quota::builder(algorithm);
            if algorithm.is_windowed() {
                builder.limit(3).window(Duration::from_secs(3600)).build()
            } else {
                builder.capacity(3).rate(rate).build()
            }
            .unwrap()
        })
        .collect();
    for (round, quota) in quotas.iter().enumerate() {
        let key = format!("acl:{}", quota.algorithm());
        for _ in 0..3 {
            limiter
                .decide(quota, &key, 1)
                .await
                .unwrap_or_else(|e| panic!("{quota}: {e}"));
        }
        let fourth = limiter.decide(quota, &key, 1).await.unwrap();
        assert!(!fourth.allowed, "{quota}: a fourth admitted: {fourth:?}");
        let (other, shared) = (format!("acl:all:{round}"), format!("acl:shared:{round}"));
        limiter
            .decide_all(&[Request::new(quota, &other), Request::new(quota, &shared)])
            .await
            .unwrap_or_else(|e| panic!("{quota}, all or nothing: {e}"));
        limiter.inspect(quota, &key, 1).await.unwrap();
        limiter.reset(&key).await.unwrap();
        let leased = format!("acl:lease:{round}");
        limiter
            .check(Request::new(quota, &leased).rule("acl").lease(2))
            .await
            .unwrap_or_else(|d| panic!("{quota}, leased: {d}"));
    }
    // The library is loaded again by this user after a flush.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .unwrap();
    limiter
        .decide(&quotas[0], "acl:after-flush", 1)
        .await
        .unwrap();
    assert_eq!(
        server.command_calls(&["evalsha"]).await,
        pinged_by_evalsha,
        "the guide's user runs the limiter as a function"
    );

    // The rule source, following and publishing as the same user.
    let source = RedisRuleSource::builder(url.clone())
        .start(&limiter)
        .unwrap();
    support::read_rules(
        &source,
        Duration::from_secs(5),
        "the rule source read the rules as the ACL user",
    )
    .await;
    RedisRuleSource::publish(&url, "checkout", "capacity=7 rate=1/s")
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while limiter.rules().get("checkout").map(|q| q.capacity()) != Some(7) {
        assert!(
            std::time::Instant::now() < deadline,
            "the published rule never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(RedisRuleSource::remove(&url, "checkout").await.unwrap());

    // Keys outside the prefix are refused: the line is least privilege.
    let outside = Limiter::builder()
        .redis(url.clone())
        .timeout(Duration::from_secs(2))
        .prefix("other:")
        .build()
        .unwrap();
    // `inspect` shows the backend's error itself, with no failure policy.
    let refused = outside.inspect(&quotas[0], "k", 1).await.unwrap_err();
    assert!(
        refused.to_string().to_lowercase().contains("noperm"),
        "{refused}"
    );
    assert_eq!(refused.kind(), ratelimit::ErrorKind::Permission);
    let at_start_up = outside.ping().await.unwrap_err();
    assert_eq!(
        at_start_up.kind(),
        ratelimit::ErrorKind::Permission,
        "{at_start_up}"
    );
}

#[tokio::test]
async fn a_user_without_fcall_is_served_by_evalsha() {
    // The guide's line before functions: a service whose user was set up
    // then keeps working, by EVALSHA.
    let server = RedisServer::start();
    set_up_user_without(&server, &["+fcall", "+function|load"]).await;
    let limiter = Limiter::builder()
        .redis(as_user(&server, PASSWORD))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let quota = Quota::new(2, Rate::per_minute(2).unwrap()).unwrap();
    for remaining in [1, 0] {
        let d = limiter.decide(&quota, "acl:old-user", 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, remaining), "{d:?}");
    }
    assert!(
        !limiter
            .decide(&quota, "acl:old-user", 1)
            .await
            .unwrap()
            .allowed
    );
    let check = limiter
        .decide_all(&[
            Request::new(&quota, "acl:old-user:a"),
            Request::new(&quota, "acl:old-user:b"),
        ])
        .await
        .unwrap();
    assert!(check.iter().all(|d| d.allowed), "{check:?}");
    // The FCALLs this user may not run are rejected, and never counted.
    assert!(server.command_calls(&["evalsha"]).await >= 4);
}

/// A call that fails inside the function after it wrote (a command the user
/// may not run: here `PEXPIRE`, which the sliding log needs after the
/// bucket's key was written) is sent once, never again as though the
/// function were missing, which wrote the bucket's key again at each try;
/// its error names a missing permission, not an outage.
#[tokio::test]
async fn a_call_failing_inside_the_function_is_sent_once_and_named_a_permission_fault() {
    let server = RedisServer::start();
    set_up_user_without(&server, &["+pexpire"]).await;
    let limiter = Limiter::builder()
        .redis(as_user(&server, PASSWORD))
        .timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    let bucket = Quota::new(10, Rate::per_minute(10).unwrap()).unwrap();
    let log = Quota::sliding_log(10, Duration::from_secs(60)).unwrap();
    let both = [
        Request::new(&bucket, "acl:bucket"),
        Request::new(&log, "acl:log"),
    ];
    let denied = limiter.check(both).await.unwrap_err();
    assert_eq!(
        denied.cause,
        DenialCause::BackendUnavailable {
            kind: ErrorKind::Permission
        },
        "{denied:?}"
    );
    assert_eq!(
        server.command_calls(&["evalsha"]).await,
        0,
        "the call went again by EVALSHA"
    );
    let admin = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let left = admin.decide(&bucket, "acl:bucket", 0).await.unwrap();
    assert!(
        left.remaining >= 9,
        "the failed call took {} tokens of the bucket",
        10 - left.remaining
    );
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_error_that_never_shows_the_password() {
    let server = RedisServer::start();
    set_up_user(&server).await;
    let wrong = "not-the-password-93c1";
    let limiter = Limiter::builder()
        .redis(as_user(&server, wrong))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let error = limiter
        .inspect(&Quota::per_second(1).unwrap(), "k", 1)
        .await
        .unwrap_err();
    let shown = format!("{error} {error:?}");
    assert!(matches!(error, Error::Connect { .. }), "{shown}");
    assert!(
        shown.contains("WRONGPASS") || shown.to_lowercase().contains("auth"),
        "the error must say the credentials were refused: {shown}"
    );
    assert!(!shown.contains(wrong), "the password leaked: {shown}");
    // And an invalid URL names the URL without its password.
    let invalid = Limiter::builder()
        .redis(format!("rediss://svc:{wrong}@127.0.0.1:1/notadb"))
        .timeout(Duration::from_secs(2))
        .build();
    if let Err(error) = invalid {
        assert!(!error.to_string().contains(wrong), "{error}");
    }
}

/// Keys the user may not touch are each call's own fault: Redis answers
/// them, and the breaker stays closed for the keys the user may touch.
#[tokio::test]
async fn refused_keys_do_not_open_the_breaker_for_the_others() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "limited",
                "on",
                ">pw-limited",
                "~rl:user:*",
                "+@all",
            ][..],
        )
        .query_async(&mut admin)
        .await
        .unwrap();
    let limiter = Limiter::builder()
        .redis(format!(
            "redis://limited:pw-limited@127.0.0.1:{}",
            server.port()
        ))
        .timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    let quota = Quota::new(10, Rate::per_minute(10).unwrap()).unwrap();
    for i in 0..6 {
        let key = format!("other:{i}");
        let denied = limiter.check(Request::new(&quota, &key)).await.unwrap_err();
        assert_eq!(
            denied.cause,
            DenialCause::BackendUnavailable {
                kind: ErrorKind::Permission
            },
            "{denied:?}"
        );
    }
    let admitted = limiter.check(Request::new(&quota, "user:1")).await;
    let admitted = admitted.unwrap_or_else(|denied| panic!("{denied:?}"));
    assert!(!admitted.decisions()[0].fallback);
}

/// A user the guide's line is given without its channel (`&ratelimit:...`)
/// still gets the rules, at the periodic reads, and the source says which
/// permission is missing, rather than reconnecting forever unready. (On
/// one thread: the source's task logs where the test listens.)
#[tokio::test]
async fn a_user_without_the_channel_reads_the_rules_on_the_timer_and_is_told_why() {
    let server = RedisServer::start();
    set_up_user_without(&server, &["&ratelimit:rules:changed"]).await;
    let url = as_user(&server, PASSWORD);
    let mut admin = server.connection().await;
    let _: () = redis::cmd("HSET")
        .arg("ratelimit:rules")
        .arg("checkout")
        .arg("capacity=7 rate=1/s")
        .query_async(&mut admin)
        .await
        .unwrap();
    let limiter = Limiter::memory();
    let (source, logs) = support::logged(async {
        let source = RedisRuleSource::builder(url.clone())
            .reload_every(Duration::from_millis(200))
            .start(&limiter)
            .unwrap();
        support::read_rules(&source, Duration::from_secs(5), "the rules were never read").await;
        source
    })
    .await;
    assert!(source.is_ready());
    assert_eq!(
        limiter.rules().get("checkout").map(|q| q.capacity()),
        Some(7)
    );
    assert!(
        logs.contains("may not subscribe to its channel")
            && logs.contains("channel=ratelimit:rules:changed"),
        "the missing permission is not named: {logs}"
    );
    // A change made with no message reaches it at the next read.
    let _: () = redis::cmd("HSET")
        .arg("ratelimit:rules")
        .arg("checkout")
        .arg("capacity=9 rate=1/s")
        .query_async(&mut admin)
        .await
        .unwrap();
    let changed = std::time::Instant::now();
    while limiter.rules().get("checkout").map(|q| q.capacity()) != Some(9) {
        assert!(
            changed.elapsed() < Duration::from_secs(5),
            "the change never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The guide's user may not `PING`: the source's check of its subscription
/// takes the refusal for the answer it is, with nothing logged as an error.
#[tokio::test]
async fn the_guides_user_follows_the_rules_with_no_error_logged() {
    let server = RedisServer::start();
    set_up_user(&server).await;
    let url = as_user(&server, PASSWORD);
    let limiter = Limiter::memory();
    let ((), logs) = support::logged(async {
        let source = RedisRuleSource::builder(url.clone())
            .start(&limiter)
            .unwrap();
        support::read_rules(&source, Duration::from_secs(5), "the rules were never read").await;
        // Two checks of the subscription.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
    })
    .await;
    assert!(!logs.contains("ERROR") && !logs.contains("WARN"), "{logs}");
}
