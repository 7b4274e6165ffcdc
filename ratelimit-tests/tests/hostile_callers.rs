//! Callers as production has them: tasks that loop on the limiter without
//! ever yielding, futures dropped mid-call, floods while Redis is frozen,
//! values another writer left in Redis, runtimes that come and go. Each test
//! asserts liveness and exact accounting, never speed.

mod support;

use support::{fault, Decide};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use ratelimit::{
    Algorithm, BreakerConfig, CircuitState, DenialCause, Error, ErrorKind, FailurePolicy, Limiter,
    Quota, Rate, Request,
};
use redis::AsyncCommands as _;
use support::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(100);
/// The timeout of the runs of spinning callers, where every call made while
/// Redis is well must be Redis's: on a loaded machine, sixteen callers that
/// never yield can hold a call past 100 ms. Still far shorter than the
/// freezes, which must cause fallbacks.
const SPINNING_TIMEOUT: Duration = Duration::from_millis(300);
/// Generous: a loaded machine's scheduling delays on top of the timeout.
const MARGIN: Duration = Duration::from_secs(1);
/// How soon calls must be decided by Redis again once it is back: long
/// enough for a loaded machine's reconnection, far shorter than a limiter
/// that never went back (or backed off for minutes) would take.
const RECOVERY: Duration = Duration::from_secs(5);
const POLICIES: [FailurePolicy; 3] = [
    FailurePolicy::Open,
    FailurePolicy::Closed,
    FailurePolicy::Local,
];

fn limiter(server: &RedisServer, policy: FailurePolicy) -> Limiter {
    patient_limiter(server, policy, TIMEOUT)
}

/// A limiter with a `timeout` of its own: long enough that a loaded
/// machine's scheduling delays do not open the breaker where a test needs
/// Redis's answers.
fn patient_limiter(server: &RedisServer, policy: FailurePolicy, timeout: Duration) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(timeout)
        .failure_policy(policy)
        .build()
        .unwrap()
}

/// A quota that never denies in these tests.
fn roomy() -> Quota {
    Quota::new(1_000_000_000, "1000000000/s".parse().unwrap()).unwrap()
}

/// Counters shared by callers that loop on `acquire` as fast as they can.
#[derive(Default)]
struct Seen {
    from_redis: AtomicU64,
    fallbacks: AtomicU64,
    slowest_us: AtomicU64,
    /// Denials by the quota, which a roomy quota never gives.
    quota_denials: AtomicU64,
    /// The longest a ticker task sharing the runtime waited past its 10 ms.
    ticker_gap_us: AtomicU64,
}

impl Seen {
    fn decided_by_redis(&self) -> u64 {
        self.from_redis.load(Ordering::Relaxed)
    }

    /// Waits (on the test's own thread, which the runtime does not need)
    /// until Redis decides `count` more calls; how long that took.
    fn until_redis_decides(&self, count: u64, within: Duration, context: &str) -> Duration {
        let started = Instant::now();
        let target = self.decided_by_redis() + count;
        while self.decided_by_redis() < target {
            assert!(
                started.elapsed() < within,
                "{context}: Redis decided no call within {within:?} of its return"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        started.elapsed()
    }
}

/// Runs `callers` tasks that call `acquire` in a loop with no await of
/// their own, and a ticker, on a runtime of `workers` threads (0: a
/// current-thread runtime) in a thread of its own, until `stop`.
fn spin_callers(
    limiter: Limiter,
    workers: usize,
    callers: usize,
    stop: Arc<AtomicBool>,
    seen: Arc<Seen>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let runtime = if workers == 0 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build()
        }
        .unwrap();
        runtime.block_on(async move {
            let quota = roomy();
            let mut tasks = Vec::new();
            for caller in 0..callers {
                let (limiter, stop, seen) = (limiter.clone(), stop.clone(), seen.clone());
                tasks.push(tokio::spawn(async move {
                    let key = format!("spin:{caller}");
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let result = limiter.check(Request::new(&quota, &key)).await;
                        let took = started.elapsed().as_micros() as u64;
                        seen.slowest_us.fetch_max(took, Ordering::Relaxed);
                        match result {
                            Ok(d) if !d.decisions()[0].fallback => {
                                seen.from_redis.fetch_add(1, Ordering::Relaxed)
                            }
                            Err(denied) if denied.cause == DenialCause::Quota => {
                                seen.quota_denials.fetch_add(1, Ordering::Relaxed)
                            }
                            _ => seen.fallbacks.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }));
            }
            let (ticker_stop, ticker_seen) = (stop.clone(), seen.clone());
            tasks.push(tokio::spawn(async move {
                let mut last = Instant::now();
                while !ticker_stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let gap = last.elapsed().saturating_sub(Duration::from_millis(10));
                    ticker_seen
                        .ticker_gap_us
                        .fetch_max(gap.as_micros() as u64, Ordering::Relaxed);
                    last = Instant::now();
                }
            }));
            for task in tasks {
                task.await.expect("a caller panicked");
            }
        });
    })
}

/// Callers that never yield, on a current-thread runtime and on a
/// one-worker multi-thread runtime, for every policy: Redis frozen, thawed,
/// killed and restarted. Answers given without I/O must let the runtime's
/// timers, the batching task and reconnection run.
#[test]
fn callers_that_never_yield_keep_the_runtime_alive_and_return_to_redis() {
    for workers in [0, 1] {
        for policy in POLICIES {
            let context = format!("{policy:?}, {workers} workers");
            let mut server = RedisServer::start();
            let limiter = patient_limiter(&server, policy, SPINNING_TIMEOUT);
            let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
            let runtime = spin_callers(limiter.clone(), workers, 8, stop.clone(), seen.clone());
            let watchdog = Instant::now();
            seen.until_redis_decides(100, Duration::from_secs(10), &context);

            server.freeze();
            std::thread::sleep(Duration::from_millis(1_000));
            let during = seen.fallbacks.load(Ordering::Relaxed);
            server.thaw();
            let thawed = seen.until_redis_decides(10, RECOVERY, &context);

            server.kill();
            std::thread::sleep(Duration::from_millis(500));
            server.restart();
            let restarted = seen.until_redis_decides(10, RECOVERY, &context);

            stop.store(true, Ordering::Relaxed);
            runtime.join().expect("the callers' runtime panicked");
            let slowest = Duration::from_micros(seen.slowest_us.load(Ordering::Relaxed));
            let gap = Duration::from_micros(seen.ticker_gap_us.load(Ordering::Relaxed));
            eprintln!(
                "{context}: back on Redis {thawed:?} after the thaw, {restarted:?} after the restart; \
                 slowest call {slowest:?}, longest ticker delay {gap:?}, whole run {:?}",
                watchdog.elapsed()
            );
            assert!(during > 0, "{context}: a frozen Redis caused no fallback");
            assert!(
                slowest < SPINNING_TIMEOUT + MARGIN,
                "{context}: a call took {slowest:?} under a {SPINNING_TIMEOUT:?} timeout"
            );
            assert!(
                gap < MARGIN,
                "{context}: a ticker sharing the runtime was held up {gap:?}"
            );
            assert!(
                thawed < RECOVERY && restarted < RECOVERY,
                "{context}: back on Redis {thawed:?} after the thaw, {restarted:?} after the restart"
            );
        }
    }
}

/// Runs `command` on `server` with the plain client (the test's own thread).
fn redis_cli(server: &RedisServer, args: &[&str]) {
    let mut connection = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect to the private redis-server");
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd
        .query(&mut connection)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
}

/// One fault after another under a steady load of callers that never
/// yield, with the counts of each phase: how many calls Redis decided, how
/// many the policy answered, and the longest call.
#[test]
fn a_timeline_of_faults_under_steady_load_is_survived_phase_by_phase() {
    timeline_of_faults(false);
}

/// The same on a server that runs the native module, which is unloaded at
/// the end: the function takes over, and no caller sees it.
#[test]
fn a_timeline_of_faults_under_steady_load_is_survived_phase_by_phase_on_the_module() {
    timeline_of_faults(true);
}

/// A private Redis, with the native module loaded when `module` (and
/// `MODULE UNLOAD` allowed).
fn server(module: bool) -> RedisServer {
    if !module {
        return RedisServer::start();
    }
    let module = support::native_module();
    RedisServer::start_with(&[
        "--loadmodule",
        module.to_str().unwrap(),
        "--enable-module-command",
        "yes",
    ])
}

/// Asserts that `server`'s decisions went through the native module.
async fn decided_by_the_module(server: &RedisServer, what: &str) {
    assert!(
        server.command_calls(&["ratelimit.decide"]).await > 0,
        "{what}: the limiter never used the native module"
    );
}

fn timeline_of_faults(module: bool) {
    let mut server = server(module);
    let limiter = patient_limiter(&server, FailurePolicy::Local, SPINNING_TIMEOUT);
    let (stop, seen) = (Arc::new(AtomicBool::new(false)), Arc::new(Seen::default()));
    let runtime = spin_callers(limiter.clone(), 2, 16, stop.clone(), seen.clone());
    seen.until_redis_decides(100, Duration::from_secs(10), "start");
    let mut rows = Vec::new();
    // `expected`: whether the fault must cause fallbacks (Some(true)), must
    // cause none (Some(false)), or may (None).
    let mut phase = |name: &str,
                     fault: &mut dyn FnMut(&mut RedisServer),
                     expected: Option<bool>| {
        let (redis0, fallbacks0) = (
            seen.decided_by_redis(),
            seen.fallbacks.load(Ordering::Relaxed),
        );
        seen.slowest_us.store(0, Ordering::Relaxed);
        fault(&mut server);
        let back = seen.until_redis_decides(10, RECOVERY, name);
        std::thread::sleep(Duration::from_millis(300));
        let slowest = Duration::from_micros(seen.slowest_us.load(Ordering::Relaxed));
        let fallbacks = seen.fallbacks.load(Ordering::Relaxed) - fallbacks0;
        rows.push(format!(
            "{name:<24} redis {:>8}  fallbacks {fallbacks:>8}  longest call {slowest:>12.1?}  back on Redis after {back:.1?}",
            seen.decided_by_redis() - redis0
        ));
        assert!(
            slowest < SPINNING_TIMEOUT + MARGIN,
            "{name}: a call took {slowest:?}"
        );
        assert!(back < RECOVERY, "{name}: back on Redis after {back:?}");
        match expected {
            Some(true) => assert!(fallbacks > 0, "{name}: the fault caused no fallback"),
            Some(false) => assert_eq!(fallbacks, 0, "{name}: the fault reached callers"),
            None => {}
        }
    };
    phase(
        "healthy",
        &mut |_| std::thread::sleep(Duration::from_millis(500)),
        Some(false),
    );
    phase(
        "SIGSTOP 2 s, SIGCONT",
        &mut |server| {
            server.freeze();
            std::thread::sleep(Duration::from_secs(2));
            server.thaw();
        },
        Some(true),
    );
    phase(
        "SIGKILL, restart",
        &mut |server| {
            server.kill();
            std::thread::sleep(Duration::from_millis(500));
            server.restart();
        },
        Some(true),
    );
    phase(
        "CLIENT KILL",
        &mut |server| {
            redis_cli(
                server,
                &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
            );
        },
        None,
    );
    // Right after the connections were killed: a breaker still open from
    // that would show here.
    phase(
        "SCRIPT FLUSH and FUNCTION FLUSH",
        &mut |server| {
            redis_cli(server, &["SCRIPT", "FLUSH"]);
            redis_cli(server, &["FUNCTION", "FLUSH"]);
        },
        Some(false),
    );
    phase(
        "maxmemory 1 (OOM) 1 s",
        &mut |server| {
            redis_cli(server, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
            redis_cli(server, &["CONFIG", "SET", "maxmemory", "1"]);
            std::thread::sleep(Duration::from_secs(1));
            redis_cli(server, &["CONFIG", "SET", "maxmemory", "0"]);
        },
        Some(true),
    );
    if module {
        phase(
            "MODULE UNLOAD",
            &mut |server| {
                let mut connection = server
                    .client()
                    .get_connection_with_timeout(Duration::from_secs(2))
                    .unwrap();
                let stats: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut connection)
                    .unwrap();
                assert!(
                    stats.contains("cmdstat_ratelimit.decide:"),
                    "the module decided nothing since the restart:\n{stats}"
                );
                redis_cli(server, &["MODULE", "UNLOAD", "ratelimit"]);
            },
            Some(false),
        );
    }
    stop.store(true, Ordering::Relaxed);
    runtime.join().expect("the callers' runtime panicked");
    eprintln!("{}", rows.join("\n"));
    assert_eq!(
        seen.quota_denials.load(Ordering::Relaxed),
        0,
        "a fault was reported as a denial by the quota"
    );
    let gap = Duration::from_micros(seen.ticker_gap_us.load(Ordering::Relaxed));
    assert!(
        gap < MARGIN,
        "a ticker sharing the runtime was held up {gap:?}"
    );
}

/// Opens the breaker of `limiter` on a frozen `server` with three timed-out
/// calls.
/// A limiter whose breaker opens after three failures (the default).
fn breaking_limiter(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(TIMEOUT)
        .breaker(BreakerConfig::default())
        .build()
        .unwrap()
}

async fn open_breaker(limiter: &Limiter, quota: &Quota) {
    for i in 0..3 {
        let _ = limiter.decide(quota, &format!("open:{i}"), 1).await;
    }
    assert_eq!(limiter.circuit_state(), CircuitState::Open);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_dropped_mid_call_lets_the_next_call_probe() {
    let server = RedisServer::start();
    let limiter = breaking_limiter(&server);
    let quota = roomy();
    limiter.decide(&quota, "warm", 1).await.unwrap();
    server.freeze();
    open_breaker(&limiter, &quota).await;
    // Past the first backoff (50 ms), the next call is the probe; its caller
    // gives up after 5 ms, as a client disconnect or a tower timeout would.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let probe = tokio::time::timeout(
        Duration::from_millis(5),
        limiter.check(Request::new(&quota, "probe")),
    )
    .await;
    assert!(probe.is_err(), "the probe was to be cut short: {probe:?}");
    server.thaw();
    let started = Instant::now();
    loop {
        if let Ok(d) = limiter.check(Request::new(&quota, "after")).await {
            if !d.decisions()[0].fallback {
                break;
            }
        }
        assert!(
            started.elapsed() < RECOVERY,
            "no call reached Redis within {RECOVERY:?} of its return; circuit {:?}",
            limiter.circuit_state()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(limiter.circuit_state(), CircuitState::Closed);
}

/// Waits until Redis decides a call again (at most `RECOVERY`).
async fn until_redis_decides(limiter: &Limiter, quota: &Quota) {
    let started = Instant::now();
    while limiter.decide(quota, "until-redis", 1).await.is_err() {
        assert!(
            started.elapsed() < RECOVERY,
            "Redis decided nothing within {RECOVERY:?} of its return"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Keys matching `pattern` that Redis holds.
async fn keys(server: &RedisServer, pattern: &str) -> usize {
    let mut redis = server.connection().await;
    let keys: Vec<String> = redis.keys(pattern).await.unwrap();
    keys.len()
}

/// Polls 1,000 calls once each, by `queued` on the key `<what>:<i>` (which
/// says whether the call is still pending, its work queued), and drops them
/// before the batching task (on this same thread) has run: none consumes.
/// On a server with the native module when `module`.
async fn calls_whose_callers_are_gone_before_they_are_sent_consume_nothing<F>(
    what: &str,
    module: bool,
    queued: F,
) where
    F: Fn(&Limiter, &str) -> bool,
{
    let server = server(module);
    let limiter = limiter(&server, FailurePolicy::Open);
    let quota = Quota::per_hour(5).unwrap();
    limiter.decide(&quota, "warm", 1).await.unwrap();
    for i in 0..1_000 {
        assert!(
            queued(&limiter, &format!("{what}:{i}")),
            "{what}: a Redis decision cannot be ready at once"
        );
    }
    // Now let the batching task run, and decide one more call after them.
    limiter.decide(&quota, "after", 1).await.unwrap();
    assert_eq!(
        keys(&server, &format!("rl:{what}*")).await,
        0,
        "{what}: calls whose callers had gone reached Redis"
    );
    if module {
        decided_by_the_module(&server, what).await;
    }
}

async fn decisions_whose_callers_are_gone_consume_nothing(module: bool) {
    let quota = Quota::per_hour(5).unwrap();
    calls_whose_callers_are_gone_before_they_are_sent_consume_nothing(
        "gone",
        module,
        |limiter, key| {
            limiter
                .check(Request::new(&quota, key))
                .now_or_never()
                .is_none()
        },
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn decisions_whose_callers_are_gone_before_they_are_sent_consume_nothing() {
    decisions_whose_callers_are_gone_consume_nothing(false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn decisions_whose_callers_are_gone_before_they_are_sent_consume_nothing_on_the_module() {
    decisions_whose_callers_are_gone_consume_nothing(true).await;
}

/// All-or-nothing checks wait in the same queue as single decisions: one
/// whose caller has gone before it is sent consumes nothing either.
async fn checks_whose_callers_are_gone_consume_nothing(module: bool) {
    let (user, global) = (Quota::per_hour(5).unwrap(), Quota::per_hour(5_000).unwrap());
    calls_whose_callers_are_gone_before_they_are_sent_consume_nothing(
        "gone-check",
        module,
        |limiter, key| {
            let dimensions = [
                Request::new(&user, key),
                Request::new(&global, "gone-check-global"),
            ];
            limiter.check(&dimensions[..]).now_or_never().is_none()
        },
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn checks_whose_callers_are_gone_before_they_are_sent_consume_nothing() {
    checks_whose_callers_are_gone_consume_nothing(false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn checks_whose_callers_are_gone_before_they_are_sent_consume_nothing_on_the_module() {
    checks_whose_callers_are_gone_consume_nothing(true).await;
}

/// A check of no dimensions admits and takes nothing, and the checks that
/// share its script call stay all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_check_leaves_the_checks_beside_it_all_or_nothing() {
    let server = RedisServer::start();
    // No deny cache: every check goes to Redis.
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(5))
        .deny_cache_max_keys(0)
        .build()
        .unwrap();
    let (user, global) = (Quota::per_hour(5).unwrap(), Quota::per_hour(1).unwrap());
    limiter.decide(&global, "empty-global", 1).await.unwrap();
    let calls: Vec<_> = (0..256)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                if i % 4 == 0 {
                    return (i, limiter.check([]).await.map(|d| d.decisions().len()));
                }
                let key = format!("empty-user:{i}");
                let dimensions = [
                    Request::new(&user, &key),
                    Request::new(&global, "empty-global"),
                ];
                (
                    i,
                    limiter
                        .check(&dimensions[..])
                        .await
                        .map(|d| d.decisions().len()),
                )
            })
        })
        .collect();
    for call in calls {
        match call.await.unwrap() {
            (i, Ok(0)) if i % 4 == 0 => {}
            (i, Err(denied)) if i % 4 != 0 => assert_eq!(denied.key, "empty-global", "check {i}"),
            (i, other) => panic!("check {i}: {other:?}"),
        }
    }
    assert_eq!(
        keys(&server, "rl:empty-user:*").await,
        0,
        "a check denied by its global key consumed its user's"
    );
}

/// Sends 2,000 calls to a frozen Redis, each by `call` on the key
/// `<what>:<i>` (which says whether the failure policy answered it): each
/// is answered within the timeout, and after the thaw only what was in
/// flight when Redis froze (at most every slot of full batches) and one
/// lone batch after the calls failed has consumed; everything still queued
/// had lost its caller and was dropped.
async fn a_frozen_redis_is_left_a_bounded_amount_of_work<F, C>(what: &str, call: F)
where
    F: Fn(Limiter, String) -> C,
    C: std::future::Future<Output = bool> + Send + 'static,
{
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Open);
    let quota = Quota::per_hour(5).unwrap();
    limiter.decide(&quota, "warm", 1).await.unwrap();
    server.freeze();
    let calls: Vec<_> = (0..2_000)
        .map(|i| {
            let answered = call(limiter.clone(), format!("{what}:{i}"));
            tokio::spawn(async move {
                let started = Instant::now();
                let by_policy = answered.await;
                (started.elapsed(), by_policy)
            })
        })
        .collect();
    for call in calls {
        let (took, by_policy) = call.await.unwrap();
        assert!(took < TIMEOUT + MARGIN, "{what}: a call took {took:?}");
        assert!(by_policy, "{what}: a frozen Redis decided");
    }
    server.thaw();
    // Let Redis run what was already written to its sockets.
    until_redis_decides(&limiter, &quota).await;
    let consumed = keys(&server, &format!("rl:{what}:*")).await;
    eprintln!(
        "{what}: 2,000 callers timed out on a frozen Redis; {consumed} consumed after the thaw"
    );
    assert!(
        consumed <= 16 * 32 + 32,
        "{what}: {consumed} of 2,000 abandoned calls consumed tokens"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_is_left_a_bounded_amount_of_work_by_callers_that_time_out() {
    let quota = Quota::per_hour(5).unwrap();
    a_frozen_redis_is_left_a_bounded_amount_of_work("late", move |limiter, key| async move {
        limiter
            .check(Request::new(&quota, &key))
            .await
            .unwrap()
            .decisions()[0]
            .fallback
    })
    .await;
}

/// Checks too: each is answered by its failure policy within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_is_left_a_bounded_amount_of_work_by_checks_that_time_out() {
    let (user, global) = (
        Quota::per_hour(5).unwrap(),
        Quota::per_hour(100_000).unwrap(),
    );
    a_frozen_redis_is_left_a_bounded_amount_of_work("late-check", move |limiter, key| async move {
        let dimensions = [
            Request::new(&user, &key),
            Request::new(&global, "late-global"),
        ];
        let admitted = limiter.check(&dimensions[..]).await.unwrap();
        admitted.decisions().iter().all(|d| d.fallback)
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_queue_in_front_of_a_slow_redis_is_bounded() {
    let server = RedisServer::start();
    // A long timeout: the callers wait while the queue fills.
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let quota = Quota::per_hour(5).unwrap();
    limiter.decide(&quota, "warm", 1).await.unwrap();
    server.freeze();
    let started = Arc::new(AtomicU64::new(0));
    let calls: Vec<_> = (0..6_000)
        .map(|i| {
            let (limiter, started) = (limiter.clone(), started.clone());
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::Relaxed);
                limiter.decide(&quota, &format!("q:{i}"), 1).await
            })
        })
        .collect();
    // One thread: once every call task has started, each has run up to its
    // wait, and the queue is full.
    while started.load(Ordering::Relaxed) < 6_000 {
        tokio::task::yield_now().await;
    }
    let mut refused = 0;
    for call in calls {
        match call.await.unwrap() {
            Err(d) if fault(&d) == Some(ErrorKind::Overloaded) => refused += 1,
            Err(d) if fault(&d) == Some(ErrorKind::Timeout) => {}
            other => panic!("a decision on a frozen Redis: {other:?}"),
        }
    }
    server.thaw();
    until_redis_decides(&limiter, &quota).await;
    let consumed = keys(&server, "rl:q:*").await;
    eprintln!("6,000 calls on a frozen Redis: {refused} refused at once, {consumed} consumed");
    assert!(
        consumed <= 16 * 32 + 32,
        "{consumed} decisions reached Redis though their callers had timed out"
    );
    assert!(
        refused >= 6_000 - 4_096 - 16 * 32,
        "only {refused} of 6,000 calls were refused by a queue of 4,096"
    );
    assert_eq!(
        limiter.circuit_state(),
        CircuitState::Closed,
        "a full queue is no failure of Redis"
    );
}

/// `TYPE key`: which kind of value Redis holds there.
async fn key_type(redis: &mut impl redis::aio::ConnectionLike, key: &str) -> String {
    redis::cmd("TYPE")
        .arg(key)
        .query_async(redis)
        .await
        .unwrap()
}

fn every_string_algorithm() -> Vec<Quota> {
    let rate = Rate::per_second(1).unwrap();
    let window = Duration::from_secs(10);
    vec![
        Quota::token_bucket(5, rate).unwrap(),
        Quota::gcra(5, rate).unwrap(),
        Quota::leaky_bucket(5, rate).unwrap(),
        Quota::fixed_window(5, window).unwrap(),
        Quota::sliding_window(5, window).unwrap(),
    ]
}

#[tokio::test]
async fn a_key_of_another_type_is_that_keys_error_and_is_never_overwritten() {
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Open);
    let mut redis = server.connection().await;
    let _: () = redis.zadd("rl:zset", "member", 1).await.unwrap();
    let _: () = redis.hset("rl:hash", "field", "value").await.unwrap();
    for quota in every_string_algorithm() {
        for key in ["zset", "hash"] {
            let result = limiter.decide(&quota, key, 1).await;
            assert!(
                matches!(&result, Err(d) if fault(d) == Some(ErrorKind::ForeignValue) && d.key == key),
                "{}: a {key} read as {result:?}",
                quota.algorithm()
            );
            let error = limiter.inspect(&quota, key, 1).await;
            assert!(
                matches!(&error, Err(Error::ForeignValue { key: k, .. }) if k == &format!("rl:{key}")),
                "{}: a {key} inspected as {error:?}",
                quota.algorithm()
            );
            let all = limiter
                .decide_all(&[
                    Request::new(&quota, "fresh-dimension"),
                    Request::new(&quota, key),
                ])
                .await;
            assert!(
                matches!(&all, Err(d) if fault(d) == Some(ErrorKind::ForeignValue)),
                "{}: all or nothing with a {key}: {all:?}",
                quota.algorithm()
            );
        }
    }
    assert_eq!(
        key_type(&mut redis, "rl:zset").await,
        "zset",
        "the sorted set was overwritten"
    );
    assert_eq!(
        key_type(&mut redis, "rl:hash").await,
        "hash",
        "the hash was overwritten"
    );
    let untouched: u64 = redis::cmd("EXISTS")
        .arg("rl:fresh-dimension")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(
        untouched, 0,
        "an all-or-nothing check with a foreign key wrote"
    );
    assert_eq!(limiter.circuit_state(), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_in_a_batch_leaves_the_others_decided_and_the_breaker_closed() {
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Closed);
    let mut redis = server.connection().await;
    let _: () = redis.set("rl:log:bad", "a string").await.unwrap();
    let log = Quota::sliding_log(5, Duration::from_secs(10)).unwrap();
    limiter.decide(&log, "warm", 1).await.unwrap();
    for round in 0..5 {
        // Decided together: the batch holds the bad key and 63 good ones.
        let calls: Vec<_> = (0..64)
            .map(|i| {
                let limiter = limiter.clone();
                let key = if i == 0 {
                    "log:bad".to_owned()
                } else {
                    format!("log:good:{round}:{i}")
                };
                tokio::spawn(async move { (i, limiter.decide(&log, &key, 1).await) })
            })
            .collect();
        for call in calls {
            match call.await.unwrap() {
                (0, Err(d)) if fault(&d) == Some(ErrorKind::ForeignValue) => {}
                (0, other) => panic!("the string read by the sliding log: {other:?}"),
                (i, Ok(d)) => assert!(d.allowed, "good key {i} denied: {d:?}"),
                (i, Err(e)) => panic!("good key {i} failed beside a bad one: {e}"),
            }
        }
    }
    assert_eq!(limiter.circuit_state(), CircuitState::Closed);
    let healthy = limiter
        .check(Request::new(&log, "log:healthy"))
        .await
        .unwrap();
    assert!(
        !healthy.decisions()[0].fallback,
        "a healthy key after a bad one: {healthy:?}"
    );
    let kept: String = redis.get("rl:log:bad").await.unwrap();
    assert_eq!(kept, "a string");
}

/// Checks share script calls with other checks and with single decisions:
/// a foreign value in one check is that check's error, and nothing else in
/// its call is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_in_a_check_leaves_the_checks_and_decisions_beside_it_decided() {
    let cost_of = |i: u64| i % 3 + 1;
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Closed);
    let mut redis = server.connection().await;
    let _: () = redis.hset("rl:bad", "field", "value").await.unwrap();
    let calls_before = server.script_calls().await;
    let mut quotas = every_string_algorithm();
    quotas.push(Quota::sliding_log(5, Duration::from_secs(10)).unwrap());
    for quota in quotas {
        let name = quota.algorithm().name();
        let calls: Vec<_> = (0..64)
            .map(|i| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let (one, two) = (format!("{name}:{i}:one"), format!("{name}:{i}:two"));
                    let result = match i % 4 {
                        // The foreign key first in half the checks, last in
                        // the others: the answers after it are still its
                        // check's, and the next caller's start after them.
                        0 if i % 8 == 0 => {
                            limiter
                                .decide_all(&[
                                    Request::new(&quota, "bad"),
                                    Request::new(&quota, &one),
                                ])
                                .await
                        }
                        0 => {
                            limiter
                                .decide_all(&[
                                    Request::new(&quota, &one),
                                    Request::new(&quota, "bad"),
                                ])
                                .await
                        }
                        1 => {
                            limiter
                                .decide_all(&[
                                    Request::new(&quota, &one),
                                    Request::new(&quota, &two),
                                ])
                                .await
                        }
                        // A cost of its own, so that its answer is told
                        // from its neighbours'.
                        _ => limiter
                            .decide(&quota, &one, cost_of(i))
                            .await
                            .map(|d| vec![d]),
                    };
                    (i, result)
                })
            })
            .collect();
        for call in calls {
            match call.await.unwrap() {
                // The denial of the check failing closed names its first
                // key; the foreign key is in the log and the metrics.
                (i, Err(d)) if i % 4 == 0 => assert_eq!(
                    fault(&d),
                    Some(ErrorKind::ForeignValue),
                    "{name}: check {i}: {d}"
                ),
                (i, Ok(decisions)) if i % 4 != 0 => {
                    let left = if i % 4 == 1 {
                        vec![4, 4]
                    } else {
                        vec![5 - cost_of(i)]
                    };
                    assert!(
                        decisions.iter().all(|d| d.allowed && !d.fallback)
                            && decisions
                                .iter()
                                .map(|d| d.remaining)
                                .eq(left.iter().copied()),
                        "{name}: {i} beside a bad check, {left:?} left expected: {decisions:?}"
                    )
                }
                (i, other) => panic!("{name}: {i}: {other:?}"),
            }
        }
        for i in (0..64).step_by(4) {
            let written: u64 = redis.exists(format!("rl:{name}:{i}:one")).await.unwrap();
            assert_eq!(written, 0, "{name}: check {i} wrote beside a foreign key");
        }
    }
    let calls = server.script_calls().await - calls_before;
    assert!(
        calls < 6 * 64 / 2,
        "{calls} script calls for 384 checks and decisions: they did not share calls"
    );
    assert_eq!(limiter.circuit_state(), CircuitState::Closed);
    assert_eq!(
        key_type(&mut redis, "rl:bad").await,
        "hash",
        "the foreign value was overwritten"
    );
}

#[test]
fn a_redis_limiter_outlives_the_runtime_of_its_first_decision() {
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Closed);
    let quota = Quota::per_hour(100).unwrap();
    // Outside any runtime: a clear error, no panic.
    let outside = futures::executor::block_on(limiter.inspect(&quota, "outside", 1));
    match outside {
        Err(error @ Error::NoRuntime { .. }) => {
            assert!(error.to_string().contains("Tokio runtime"), "{error}")
        }
        other => panic!("a decision outside a runtime: {other:?}"),
    }
    let failed_closed = futures::executor::block_on(limiter.decide(&quota, "outside", 1));
    assert!(
        matches!(&failed_closed, Err(d) if fault(d) == Some(ErrorKind::Configuration)),
        "{failed_closed:?}"
    );
    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let decision = runtime
            .block_on(limiter.decide(&quota, "runtimes", 1))
            .unwrap_or_else(|e| panic!("runtime {round}: {e}"));
        assert_eq!(decision.remaining, 99 - round, "runtime {round}");
        drop(runtime);
    }
}

#[test]
fn every_algorithm_refuses_a_foreign_value_in_check_all_and_decide() {
    // The sliding log reads a sorted set; any other type is foreign to it.
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let limiter = limiter(&server, FailurePolicy::Open);
        let mut redis = server.connection().await;
        let _: () = redis.set("rl:s", "text").await.unwrap();
        let log = Quota::builder(Algorithm::SlidingLog)
            .limit(3)
            .window(Duration::from_secs(5))
            .build()
            .unwrap();
        let result = limiter.decide(&log, "s", 1).await;
        assert!(
            matches!(&result, Err(d) if fault(d) == Some(ErrorKind::ForeignValue)),
            "{result:?}"
        );
        let all = limiter
            .decide_all(&[Request::new(&log, "other"), Request::new(&log, "s")])
            .await;
        assert!(
            matches!(&all, Err(d) if fault(d) == Some(ErrorKind::ForeignValue)),
            "{all:?}"
        );
        let other: u64 = redis::cmd("EXISTS")
            .arg("rl:other")
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(
            other, 0,
            "the all-or-nothing check wrote beside a foreign key"
        );
    });
}

/// Spends what is left of this task's Tokio budget, without yielding: the
/// next answer given in process must yield first.
async fn spend_the_budget() {
    while tokio::task::coop::has_budget_remaining() {
        tokio::task::coop::consume_budget().await;
    }
}

/// Leaves this task one unit of Tokio budget: yields for a whole budget,
/// counts it out, then yields again and spends all but one.
async fn leave_one_unit_of_budget() {
    tokio::task::yield_now().await;
    let mut units = 0;
    while tokio::task::coop::has_budget_remaining() {
        tokio::task::coop::consume_budget().await;
        units += 1;
    }
    tokio::task::yield_now().await;
    for _ in 1..units {
        tokio::task::coop::consume_budget().await;
    }
    assert!(tokio::task::coop::has_budget_remaining());
}

/// A check answered in process whose task must yield first (its Tokio
/// budget spent), dropped at that yield as a timed-out or disconnected
/// caller's is, takes nothing: not a token of the memory backend, nor one of
/// a lease (leased through the function, and through the native module).
/// A check that mixes an enforced request and one in shadow mode, with one
/// unit of budget left, answers or takes nothing: it never yields between
/// its two groups.
#[tokio::test(flavor = "current_thread")]
async fn a_check_dropped_at_its_yield_takes_nothing() {
    let quota = Quota::per_hour(5).unwrap();
    let memory = Limiter::memory();
    spend_the_budget().await;
    assert!(
        memory
            .check(Request::new(&quota, "k"))
            .now_or_never()
            .is_none(),
        "a spent budget yields before the answer"
    );
    assert_eq!(memory.inspect(&quota, "k", 0).await.unwrap().remaining, 5);

    let mixed = [
        Request::new(&quota, "enforced"),
        Request::new(&quota, "shadowed").shadow(true),
    ];
    leave_one_unit_of_budget().await;
    let answered = memory.check(mixed).now_or_never();
    let left = memory
        .inspect(&quota, "enforced", 0)
        .await
        .unwrap()
        .remaining;
    match answered {
        Some(checked) => {
            checked.unwrap();
            assert_eq!(left, 4, "an admitted check took one token");
        }
        None => assert_eq!(left, 5, "a check dropped at a yield took a token"),
    }

    for module in [false, true] {
        let server = server(module);
        let leasing = limiter(&server, FailurePolicy::Closed);
        let leased = Request::new(&quota, "leased").lease(5);
        // The whole quota leased at once: one served, four left in the lease.
        leasing.check(leased).await.unwrap();
        spend_the_budget().await;
        assert!(leasing.check(leased).now_or_never().is_none());
        let mut admitted = 0;
        while leasing.check(leased).await.is_ok() {
            admitted += 1;
            assert!(admitted <= 5, "more admitted than the quota holds");
        }
        assert_eq!(
            admitted, 4,
            "the dropped check took a leased token (module: {module})"
        );
        if module {
            decided_by_the_module(&server, "leases").await;
        }
    }
}

/// A check polled to its end by an executor other than Tokio's, inside a
/// Tokio task whose budget is spent (a synchronous helper that calls
/// `futures::executor::block_on`), is answered: it yields once, and its next
/// poll answers. It was polled forever at full speed, as the budget comes
/// back only when the task returns to Tokio, which that executor never lets
/// it do.
#[test]
fn a_check_polled_by_another_executor_inside_a_task_is_answered() {
    let (answered, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let limiter = Limiter::memory();
            let quota = roomy();
            spend_the_budget().await;
            for call in 0..1_000 {
                futures::executor::block_on(limiter.check(Request::new(&quota, "k"))).unwrap();
                let _ = answered.send(call);
            }
        });
    });
    let mut last = None;
    while let Ok(call) = seen.recv_timeout(Duration::from_secs(10)) {
        last = Some(call);
        if call == 999 {
            break;
        }
    }
    assert_eq!(
        last,
        Some(999),
        "a check polled by another executor inside a task with its budget spent never answered"
    );
}

/// A waiting call whose denial asks it to wait past any instant (a local
/// fallback's denial with a `closed_retry_after` of `Duration::MAX`) gives
/// up with the denial: it never panics computing when to wake.
#[ratelimit::rate_limit(key = "sync:<tenant>", capacity = 2, rate = "1/s", cost = 2,
    on_error = local, on_limit = wait(max = "1s"), limiter = limiter)]
async fn waits_for_a_share(limiter: &Limiter, tenant: u32) -> Result<(), ratelimit::RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_wait_past_any_instant_gives_up_with_the_denial() {
    let mut server = RedisServer::start();
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(TIMEOUT)
        .local_share(0.5)
        .closed_retry_after(Duration::MAX)
        .build()
        .unwrap();
    server.kill();
    let denied = waits_for_a_share(&limiter, 1).await.unwrap_err();
    assert_eq!(denied.cause, DenialCause::LocalFallback, "{denied:?}");
    assert_eq!(denied.retry_after, Duration::MAX);
}

/// Callers that arrive together at a Redis that never answers (frozen
/// before the limiter's first decision) each wait one timeout, not one per
/// caller ahead of them: the first attempt to connect answers them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_queued_behind_a_first_connection_to_a_frozen_redis_wait_one_timeout() {
    let server = RedisServer::start();
    server.freeze();
    let limiter = limiter(&server, FailurePolicy::Closed);
    let started = Instant::now();
    let calls = (0..30).map(|i| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let (quota, key) = (roomy(), format!("queued:{i}"));
            let denied = limiter.check(Request::new(&quota, &key)).await.err();
            denied
        })
    });
    let answers = futures::future::join_all(calls).await;
    let took = started.elapsed();
    server.thaw();
    for answer in answers {
        let denied = answer.unwrap().expect("a frozen Redis admitted a call");
        assert!(
            matches!(denied.cause, DenialCause::BackendUnavailable { .. }),
            "{denied:?}"
        );
    }
    assert!(
        took < TIMEOUT + MARGIN,
        "30 callers took {took:?} to be answered, with a timeout of {TIMEOUT:?}"
    );
}

/// The open breaker's probe taken by a check whose caller polls it once and
/// keeps it unpolled (pinned beside a `select!` loop that waits on something
/// else): once Redis is back, the next callers still reach it, rather than
/// going to the failure policy for as long as that future lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_left_unpolled_does_not_keep_the_breaker_open() {
    let server = RedisServer::start();
    let limiter = breaking_limiter(&server);
    let quota = roomy();
    limiter.check(Request::new(&quota, "warm")).await.unwrap();
    server.freeze();
    open_breaker(&limiter, &quota).await;
    // Past the first backoff: this check takes the probe.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let mut stalled = Box::pin(limiter.check(Request::new(&quota, "probe")));
    assert!((&mut stalled).now_or_never().is_none());
    assert_eq!(limiter.circuit_state(), CircuitState::HalfOpen);
    server.thaw();
    let started = Instant::now();
    let decided_by_redis = loop {
        let admitted = limiter.check(Request::new(&quota, "after")).await.unwrap();
        if !admitted.decisions()[0].fallback {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < 2 * MARGIN,
            "{:?} after Redis came back, every call still went to the failure policy \
             (breaker {:?})",
            started.elapsed(),
            limiter.circuit_state()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("decided by Redis again {decided_by_redis:?} after it came back");
    assert_eq!(limiter.circuit_state(), CircuitState::Closed);
    drop(stalled);
}

/// A caller that takes the deny cache's probe of a key near its limit (it
/// asks Redis for the others) and then keeps its future unpolled: the other
/// callers of the key wait for it only until it is past the timeout, then
/// ask Redis in its place, and get Redis's denial. They waited out their
/// whole deadline on it, and went to the failure policy (`Open` admitted
/// every one of them on a key Redis denies).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_cache_probe_left_unpolled_does_not_hold_its_key() {
    let server = RedisServer::start();
    // Replies 100 ms late: the stalled call's answer cannot be there by
    // the end of its first poll, however the threads are scheduled.
    let relay = support::Relay::start(server.port()).await;
    for policy in [FailurePolicy::Open, FailurePolicy::Closed] {
        relay.delay_replies(Duration::ZERO);
        let limiter = Limiter::builder()
            .redis(relay.url())
            .timeout(Duration::from_secs(2))
            .failure_policy(policy)
            .build()
            .unwrap();
        let quota = Quota::fixed_window(3, Duration::from_secs(3600)).unwrap();
        let key = format!("stalled-probe:{policy:?}");
        for _ in 0..2 {
            limiter.check(Request::new(&quota, &key)).await.unwrap();
        }
        relay.delay_replies(Duration::from_millis(100));
        // The last admission's caller asks for the others, and stalls.
        let mut stalled = Box::pin(limiter.check(Request::new(&quota, &key)));
        assert!((&mut stalled).now_or_never().is_none());
        let mut answers = Vec::new();
        for _ in 0..5 {
            answers.push(match limiter.check(Request::new(&quota, &key)).await {
                Ok(admitted) if admitted.decisions()[0].fallback => "admitted by the policy",
                Ok(_) => "admitted by Redis",
                Err(denied) if denied.cause == DenialCause::Quota => "denied by Redis",
                Err(_) => "denied by the policy",
            });
        }
        // The stalled call, still wanted, went in a batch and took the
        // last of the window, unseen.
        assert_eq!(answers, ["denied by Redis"; 5], "{policy:?}");
        drop(stalled);
    }
}

/// A check made off any Tokio runtime (`futures::executor::block_on` on a
/// plain thread) that finds another caller asking Redis for its key, where
/// it cannot wait with a timeout, asks Redis itself rather than panicking.
#[test]
fn a_check_off_a_runtime_that_meets_a_probe_fails_without_a_panic() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let limiter = runtime.block_on(async {
        patient_limiter(&server, FailurePolicy::Closed, Duration::from_secs(1))
    });
    let quota = Quota::fixed_window(3, Duration::from_secs(3600)).unwrap();
    runtime.block_on(async {
        for _ in 0..2 {
            limiter.check(Request::new(&quota, "off")).await.unwrap();
        }
    });
    // Its probe stays in flight: Redis does not answer it.
    server.freeze();
    let mut holder = Box::pin(limiter.check(Request::new(&quota, "off")));
    {
        let _on_the_runtime = runtime.enter();
        assert!((&mut holder).now_or_never().is_none());
    }
    let off = limiter.clone();
    let outcome = std::thread::spawn(move || {
        futures::executor::block_on(off.check(Request::new(&quota, "off"))).map(|_| ())
    })
    .join()
    .expect("a check off a runtime panicked");
    // It asks Redis itself, through the connection made on the runtime,
    // and frozen Redis does not answer it either.
    let denied = outcome.expect_err("Redis does not answer");
    assert_eq!(fault(&denied), Some(ErrorKind::Timeout), "{denied:?}");
    server.thaw();
    let _ = runtime.block_on(&mut holder);
}

/// A slow Redis (each reply takes two thirds of the timeout) and callers of
/// a key near its limit waiting for one caller's probe: those that wait past
/// the probe's time and ask in its place ask within a timeout of their own,
/// and get Redis's denial. With what was left of their own, they timed out,
/// and `Open` admitted them on a key Redis denies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_take_a_slow_probes_place_still_get_redis_s_answer() {
    let server = RedisServer::start();
    let relay = support::Relay::start(server.port()).await;
    let limiter = Limiter::builder()
        .redis(relay.url())
        .timeout(Duration::from_millis(1_500))
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap();
    let quota = Quota::fixed_window(3, Duration::from_secs(3600)).unwrap();
    for _ in 0..2 {
        limiter.check(Request::new(&quota, "slow")).await.unwrap();
    }
    // Half a second of slack for a loaded machine, and still less left of
    // a waiter's own timeout after the probe than a reply takes.
    relay.delay_replies(Duration::from_millis(1_000));
    let calls = (0..6).map(|_| async {
        match limiter.check(Request::new(&quota, "slow")).await {
            Ok(admitted) if admitted.decisions()[0].fallback => "admitted by the policy",
            Ok(_) => "admitted by Redis",
            Err(denied) if denied.cause == DenialCause::Quota => "denied by Redis",
            Err(_) => "denied by the policy",
        }
    });
    let mut answers = futures::future::join_all(calls).await;
    answers.sort_unstable();
    assert_eq!(
        answers,
        [
            "admitted by Redis",
            "denied by Redis",
            "denied by Redis",
            "denied by Redis",
            "denied by Redis",
            "denied by Redis"
        ]
    );
}
