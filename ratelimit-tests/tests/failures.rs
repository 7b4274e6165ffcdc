//! Fault injection: under concurrent load, Redis is killed, frozen, restarted,
//! flushed of its scripts, disconnected and made to answer errors. For every
//! failure policy: nothing panics, no call waits much longer than the
//! timeout, every fallback is counted, and limiting returns to Redis by itself.

mod support;

use support::{fault, Decide};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit::{DenialCause, ErrorKind, FailurePolicy, Limiter, Quota, Request};
use support::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(100);
/// A hang would be unbounded; this bound only absorbs a loaded machine's
/// scheduling delays on top of the timeout.
const NO_HANG: Duration = Duration::from_secs(1);
const POLICIES: [FailurePolicy; 3] = [
    FailurePolicy::Open,
    FailurePolicy::Closed,
    FailurePolicy::Local,
];

fn limiter(server: &RedisServer, policy: FailurePolicy) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(TIMEOUT)
        .failure_policy(policy)
        .local_share(0.5)
        .build()
        .unwrap()
}

fn quota() -> Quota {
    Quota::new(1_000_000, "1000000/s".parse().unwrap()).unwrap()
}

/// Concurrent callers of `acquire`, counting what they saw.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    seen: Arc<Seen>,
}

#[derive(Default)]
struct Seen {
    calls: AtomicU64,
    from_redis: AtomicU64,
    fallbacks: AtomicU64,
    slowest_us: AtomicU64,
}

impl Load {
    fn start(limiter: &Limiter, tasks: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Seen::default());
        let quota = quota();
        let tasks = (0..tasks)
            .map(|task| {
                let (limiter, stop, seen) = (limiter.clone(), stop.clone(), seen.clone());
                tokio::spawn(async move {
                    let key = format!("load:{task}");
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let result = limiter.check(Request::new(&quota, &key)).await;
                        let took = started.elapsed().as_micros() as u64;
                        seen.slowest_us.fetch_max(took, Ordering::Relaxed);
                        seen.calls.fetch_add(1, Ordering::Relaxed);
                        let fallback = match &result {
                            Ok(admitted) => admitted.decisions()[0].fallback,
                            Err(denied) => {
                                assert!(
                                    matches!(
                                        denied.cause,
                                        DenialCause::BackendUnavailable { .. }
                                            | DenialCause::LocalFallback
                                    ),
                                    "a quota this large never denies: {denied:?}"
                                );
                                true
                            }
                        };
                        let counter = if fallback {
                            &seen.fallbacks
                        } else {
                            &seen.from_redis
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        // Pace the load so a failing backend is not spun on.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            })
            .collect();
        Load { stop, tasks, seen }
    }

    fn decided_by_redis(&self) -> u64 {
        self.seen.from_redis.load(Ordering::Relaxed)
    }

    /// Waits until `count` more calls were decided by Redis; returns how long.
    async fn until_redis_decides(&self, count: u64, within: Duration) -> Duration {
        let started = Instant::now();
        let target = self.decided_by_redis() + count;
        while self.decided_by_redis() < target {
            assert!(
                started.elapsed() < within,
                "Redis did not decide again within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        started.elapsed()
    }

    /// Stops the load; checks that no task panicked and no call hung, and
    /// that the limiter counted every fallback the callers saw.
    async fn finish(self, limiter: &Limiter, context: &str) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await
                .unwrap_or_else(|e| panic!("{context}: a caller panicked: {e}"));
        }
        let slowest = Duration::from_micros(self.seen.slowest_us.load(Ordering::Relaxed));
        assert!(
            slowest < NO_HANG,
            "{context}: a call took {slowest:?} with a {TIMEOUT:?} timeout"
        );
        let fallbacks = self.seen.fallbacks.load(Ordering::Relaxed);
        assert_eq!(
            limiter.stats().fallbacks(),
            fallbacks,
            "{context}: every fallback counted ({:?})",
            limiter.stats()
        );
        fallbacks
    }
}

/// A private server, a limiter on it with `policy`, and 16 callers whose
/// decisions Redis is already answering.
async fn under_load(policy: FailurePolicy) -> (RedisServer, Limiter, Load) {
    let server = RedisServer::start();
    let limiter = limiter(&server, policy);
    let load = Load::start(&limiter, 16);
    load.until_redis_decides(50, Duration::from_secs(5)).await;
    (server, limiter, load)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_answered_by_the_policy_and_nothing_hangs() {
    for policy in POLICIES {
        let (mut server, limiter, load) = under_load(policy).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let fallbacks = load
            .finish(&limiter, &format!("{policy:?}, server killed"))
            .await;
        assert!(
            fallbacks > 0,
            "{policy:?}: the killed server caused no fallback"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_dead_server_opens_the_breaker_once_in_the_log() {
    // While Redis refuses connections the breaker probes every 50 ms; each
    // failed probe leaves it open as it was, which is no news for the log.
    let mut server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Open);
    let quota = quota();
    limiter.decide(&quota, "warm", 1).await.unwrap();
    server.kill();
    let (calls, log) = support::logged(async {
        let started = Instant::now();
        let mut calls = 0;
        while started.elapsed() < Duration::from_millis(1_500) {
            let key = format!("k{calls}");
            let _ = limiter.check(Request::new(&quota, &key)).await;
            calls += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        calls
    })
    .await;
    // At most one: a log statement other tests reach on their threads at
    // the same time is now and then missed by this thread's capture, and
    // the breaker's unit test `a_failed_probe_opens_nothing_anew` counts
    // the transitions exactly.
    let opened = log.matches("circuit open").count();
    assert!(
        opened <= 1,
        "{opened} in {calls} calls, 1.5 s of one outage:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_times_out_then_the_breaker_answers_until_it_thaws() {
    for policy in POLICIES {
        let (server, limiter, load) = under_load(policy).await;
        server.freeze();
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_ne!(
            limiter.circuit_state(),
            ratelimit::CircuitState::Closed,
            "{policy:?}: timeouts must open the breaker"
        );
        server.thaw();
        load.until_redis_decides(50, Duration::from_secs(3)).await;
        let fallbacks = load
            .finish(&limiter, &format!("{policy:?}, server frozen"))
            .await;
        assert!(
            fallbacks > 0,
            "{policy:?}: the frozen server caused no fallback"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_used_again_within_a_second_of_its_return() {
    for policy in POLICIES {
        let (mut server, limiter, load) = under_load(policy).await;
        server.kill();
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.restart();
        let back = load.until_redis_decides(1, Duration::from_secs(5)).await;
        assert!(
            back < Duration::from_secs(1),
            "{policy:?}: back on Redis {back:?} after its return"
        );
        load.finish(&limiter, &format!("{policy:?}, server restarted"))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_load_reaches_no_caller() {
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Closed);
    let load = Load::start(&limiter, 16);
    let mut redis = server.connection().await;
    for _ in 0..20 {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut redis)
            .await
            .unwrap();
        load.until_redis_decides(20, Duration::from_secs(5)).await;
    }
    let fallbacks = load.finish(&limiter, "SCRIPT FLUSH").await;
    assert_eq!(
        fallbacks, 0,
        "NOSCRIPT must be reloaded, never reach the failure policy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_reconnects_by_itself() {
    for policy in POLICIES {
        let (server, limiter, load) = under_load(policy).await;
        let mut redis = server.connection().await;
        for _ in 0..3 {
            let killed: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
                .query_async(&mut redis)
                .await
                .unwrap();
            assert!(killed >= 1, "our connection was there to kill");
            load.until_redis_decides(50, Duration::from_secs(3)).await;
        }
        load.finish(&limiter, &format!("{policy:?}, CLIENT KILL"))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_answering_errors_is_a_backend_failure_not_a_denial() {
    for policy in POLICIES {
        let (server, limiter, load) = under_load(policy).await;
        let mut redis = server.connection().await;
        // Writes now fail with OOM errors.
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory-policy", "noeviction"])
            .query_async(&mut redis)
            .await
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory", "1"])
            .query_async(&mut redis)
            .await
            .unwrap();
        let quota = quota();
        // Asked by another instance, so that its answer is not counted here.
        let other = self::limiter(&server, FailurePolicy::Closed);
        let err = other.decide(&quota, "fresh-key", 1).await.unwrap_err();
        assert_eq!(
            fault(&err),
            Some(ErrorKind::Unavailable),
            "{policy:?}: {err}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "maxmemory", "0"])
            .query_async(&mut redis)
            .await
            .unwrap();
        load.until_redis_decides(50, Duration::from_secs(3)).await;
        let fallbacks = load
            .finish(&limiter, &format!("{policy:?}, OOM errors"))
            .await;
        assert!(fallbacks > 0, "{policy:?}: the errors caused no fallback");
    }
}

#[tokio::test]
async fn the_local_policy_limits_with_its_share_of_the_quota() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Local);
    server.kill();
    let quota = Quota::new(10, "1/min".parse().unwrap()).unwrap();
    let mut admitted = 0;
    for _ in 0..20 {
        match limiter.check(Request::new(&quota, "user:1")).await {
            Ok(check) => {
                assert!(check.decisions()[0].fallback);
                admitted += 1;
            }
            Err(denied) => assert_eq!(denied.cause, DenialCause::LocalFallback),
        }
    }
    assert_eq!(admitted, 5, "a share of 0.5 of a capacity of 10");
}

#[tokio::test]
async fn a_cost_above_the_local_share_is_denied_by_the_share_never_a_panic() {
    let mut server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(TIMEOUT)
        .failure_policy(FailurePolicy::Local)
        .local_share(0.25)
        .build()
        .unwrap();
    server.kill();
    let rate = "10/min".parse().unwrap();
    let minute = Duration::from_secs(60);
    for quota in [
        Quota::token_bucket(10, rate).unwrap(),
        Quota::gcra(10, rate).unwrap(),
        Quota::leaky_bucket(10, rate).unwrap(),
        Quota::fixed_window(10, minute).unwrap(),
        Quota::sliding_log(10, minute).unwrap(),
        Quota::sliding_window(10, minute).unwrap(),
    ] {
        let key = format!("share:{}", quota.algorithm());
        // The share of 10 is 2 (rounded down to a whole token); 3 never fits it.
        for _ in 0..3 {
            let denied = limiter
                .check(Request::new(&quota, &key).cost(3))
                .await
                .unwrap_err();
            assert_eq!(
                denied.cause,
                DenialCause::LocalFallback,
                "{quota:?}: {denied:?}"
            );
            assert_eq!(denied.limit, 2, "{quota:?}: the share's capacity");
            assert!(denied.is_retryable(), "Redis may admit it once it is back");
            assert!(denied.retry_after <= Duration::from_secs(1), "{denied:?}");
        }
        // Smaller costs are decided by the share, which never exceeds it.
        let admitted =
            futures::future::join_all((0..4).map(|_| limiter.check(Request::new(&quota, &key))))
                .await
                .into_iter()
                .filter(Result::is_ok)
                .count();
        assert_eq!(admitted, 2, "{quota:?}: the share admits 2 of 10");
    }
}

/// Redis restarted after calls failed while it was down: the very first call
/// after the restart is decided by Redis. (A connection manager reports the
/// failure of its last reconnection attempt to the next call while it starts
/// a new one; a refused connection sent nothing, so the call goes again.)
/// With no breaker, so that every call reaches the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_a_restart_is_decided_by_redis() {
    let mut server = RedisServer::start();
    let mut no_breaker = ratelimit::BreakerConfig::default();
    no_breaker.failures_to_open = 0;
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_millis(500))
        .breaker(no_breaker)
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    limiter.decide(&quota, "restart", 1).await.unwrap();
    server.kill();
    for _ in 0..4 {
        let down = limiter.decide(&quota, "restart", 1).await;
        assert!(down.is_err(), "Redis is down: {down:?}");
    }
    tokio::task::block_in_place(|| server.restart());
    let first = limiter.decide(&quota, "restart", 1).await;
    assert!(
        first.as_ref().is_ok_and(|d| d.allowed),
        "the first call after the restart: {first:?}"
    );
}

/// One policy step for one limit or several: a check of several limits that
/// the failure policy admits is counted under every limit, as an admission
/// by Redis is (it was counted under the first limit alone).
#[tokio::test]
async fn a_fallback_admission_of_several_limits_counts_under_every_limit() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Open);
    let (user, global) = (quota(), quota());
    let check = [
        Request::new(&user, "user:1").rule("user"),
        Request::new(&global, "global").rule("global"),
    ];
    limiter.check(check).await.unwrap();
    assert_eq!(limiter.stats().allowed, 2, "{:?}", limiter.stats());
    server.kill();
    let admitted = limiter.check(check).await.unwrap();
    assert!(admitted.decisions().iter().all(|d| d.fallback));
    assert_eq!(
        limiter.stats().fallback_allowed,
        2,
        "one fallback admission per limit: {:?}",
        limiter.stats()
    );
    // A closed limit among them denies the check, counted once, under it.
    let closed = check[1].on_error(FailurePolicy::Closed);
    let denied = limiter.check([check[0], closed]).await.unwrap_err();
    assert_eq!(denied.rule, Some("global"));
    assert_eq!(limiter.stats().fallback_denied, 1);
}

/// A check of no limits admits at once, whatever the backend's state and
/// with or without a subscriber recording debug spans: nothing reads a
/// first request that is not there.
#[tokio::test]
async fn an_empty_check_admits_with_redis_down_and_debug_spans_on() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Closed);
    server.kill();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("ratelimit=debug")
        .with_writer(std::io::sink)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let none: [Request<'_>; 0] = [];
    let admitted = limiter.check(none).await.expect("nothing to deny");
    assert!(admitted.decisions().is_empty() && admitted.would_deny().is_none());
}

/// On a slow network (each reply 60 ms late, the timeout 100 ms), a leased
/// request whose lease is refused asks for its own cost within a timeout of
/// its own: a spent key is denied, not left to the failure policy, which
/// would admit it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lease_on_a_slow_network_still_denies_a_spent_key() {
    let server = RedisServer::start();
    let relay = support::Relay::start(server.port()).await;
    let limiter = Limiter::builder()
        .redis(relay.url())
        .timeout(TIMEOUT)
        .failure_policy(FailurePolicy::Open)
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = Quota::per_minute(5).unwrap();
    limiter
        .check(Request::new(&quota, "slow:spent").cost(5))
        .await
        .unwrap();
    // Every connection the batches take turns on is made (they connect on
    // first use) before the network slows down.
    for _ in 0..4 {
        limiter
            .check(Request::new(&quota, "slow:warm"))
            .await
            .unwrap();
    }
    relay.delay_replies(Duration::from_millis(60));
    for attempt in 0..3 {
        let started = Instant::now();
        match limiter
            .check(Request::new(&quota, "slow:spent").lease(5))
            .await
        {
            Ok(admitted) => panic!(
                "attempt {attempt}: a spent key admitted after {:?}: {:?}",
                started.elapsed(),
                admitted.decisions()
            ),
            Err(denied) => assert_eq!(
                fault(&denied),
                None,
                "attempt {attempt}: denied by the failure policy: {denied:?}"
            ),
        }
    }
}

/// A private network: a namespace holding one end of a veth pair, the
/// other end on this host, and a redis-server inside on 10.77.<n>.2. Its
/// link can be cut, as when a host is gone or a network cut, with no reset
/// or close ever sent. Removed, with its server, when dropped.
struct PrivateNetwork {
    namespace: String,
    /// Set once started: a setup that fails before still removes the
    /// namespace.
    server: Option<std::process::Child>,
    address: String,
    inside: String,
}

impl PrivateNetwork {
    fn start() -> Self {
        let id = std::process::id() % 200;
        let (namespace, outside, inside) = (
            format!("rltest{id}"),
            format!("rlh{id}"),
            format!("rln{id}"),
        );
        let net = format!("10.77.{id}");
        let ip = |args: &[&str]| {
            let status = std::process::Command::new("ip")
                .args(args)
                .status()
                .unwrap_or_else(|e| panic!("`ip {args:?}` did not run ({e}): install iproute2"));
            assert!(
                status.success(),
                "`ip {args:?}` failed: this test makes a network namespace, which needs root \
                 (or CAP_NET_ADMIN) and iproute2"
            );
        };
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &namespace])
            .stderr(std::process::Stdio::null())
            .status();
        ip(&["netns", "add", &namespace]);
        let mut network = Self {
            namespace: namespace.clone(),
            server: None,
            address: format!("{net}.2:6390"),
            inside: inside.clone(),
        };
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]);
        ip(&["link", "set", &inside, "netns", &namespace]);
        ip(&["addr", "add", &format!("{net}.1/24"), "dev", &outside]);
        ip(&["link", "set", &outside, "up"]);
        let within = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &namespace, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        within(&["addr", "add", &format!("{net}.2/24"), "dev", &inside]);
        within(&["link", "set", &inside, "up"]);
        within(&["link", "set", "lo", "up"]);
        let server = std::process::Command::new("ip")
            .args(["netns", "exec", &namespace])
            .arg(support::redis_server_binary())
            .args([
                "--bind",
                &format!("{net}.2"),
                "--port",
                "6390",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--protected-mode", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server in the namespace");
        network.server = Some(server);
        let started = Instant::now();
        while std::net::TcpStream::connect(&network.address).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server in the namespace never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        network
    }

    /// Cuts the link (`up: false`): nothing crosses it from then on, and
    /// nothing says so (no reset, no close), as when a cable is pulled; or
    /// mends it.
    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let status = std::process::Command::new("ip")
            .args(["netns", "exec", &self.namespace, "ip", "link", "set"])
            .args([&self.inside, state])
            .status()
            .expect("ip (iproute2)");
        assert!(
            status.success(),
            "`ip link set {} {state}` failed",
            self.inside
        );
    }

    /// This host's established TCP connections to the server, by local port.
    fn connections(&self) -> Vec<String> {
        let out = std::process::Command::new("ss")
            .args(["-tnH", "state", "established", "dst", &self.address])
            .output()
            .expect("ss (iproute2)");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().nth(2).map(str::to_owned))
            .collect()
    }
}

impl Drop for PrivateNetwork {
    fn drop(&mut self) {
        if let Some(server) = &mut self.server {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
    }
}

/// A Redis whose host goes silent (no reply, no reset: a host gone, a
/// network cut): the limiter's connections to it are given up within
/// seconds, so that a Redis the address reaches again (a DNS name moved to
/// a replica) is reached on new ones. (They stayed established while the
/// kernel retransmitted, some fifteen minutes, every call timing out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_to_a_host_gone_silent_are_given_up() {
    let network = PrivateNetwork::start();
    let limiter = Limiter::builder()
        .redis(format!("redis://{}", network.address))
        .timeout(Duration::from_millis(200))
        // A fault is a denial: an admission is Redis's.
        .failure_policy(FailurePolicy::Closed)
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    for _ in 0..4 {
        limiter
            .check(Request::new(&quota, "silent"))
            .await
            .unwrap_or_else(|denied| panic!("before the cut: {denied:?}"));
    }
    let before = network.connections();
    assert!(!before.is_empty(), "no connection to {}", network.address);
    network.link(false);
    // Calls go on, each timing out, with data left unacknowledged.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(16) {
        let _ = limiter.check(Request::new(&quota, "silent")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kept: Vec<String> = network
        .connections()
        .into_iter()
        .filter(|local| before.contains(local))
        .collect();
    assert!(
        kept.is_empty(),
        "16 s after the host went silent, these connections were kept: {kept:?} (of {before:?})"
    );
    // Reached again, it decides on new connections.
    network.link(true);
    let started = Instant::now();
    while limiter.check(Request::new(&quota, "silent")).await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the limiter did not reach the server again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        network
            .connections()
            .iter()
            .all(|local| !before.contains(local)),
        "decided on a connection from before the cut"
    );
}
