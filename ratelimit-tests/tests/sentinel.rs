//! Redis Sentinel: a private master, a replica and three Sentinels on
//! loopback. The master is killed under load, a Sentinel promotes the
//! replica, and limiting continues: through the failure policy meanwhile,
//! on the new master after, with nothing panicking.

mod support;

use support::Decide;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit::{FailurePolicy, Limiter, Quota, Rate, RedisRuleSource, Request};
use support::RedisServer;

use support::SENTINEL_MASTER as MASTER;
use support::{master_port, sentinel_command, sentinel_set, sentinel_set_with, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_and_limiting_continues_on_the_new_one() {
    let (mut master, replica, sentinels) = sentinel_set();
    let urls: Vec<String> = sentinels.iter().map(|s| s.url()).collect();
    // The killed master fails calls at once (its port refuses them); the
    // timeout is for calls that must get Redis's own answer.
    let limiter = Limiter::builder()
        .sentinel(MASTER, urls.clone())
        .timeout(Duration::from_secs(1))
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap();
    let source = RedisRuleSource::sentinel(MASTER, urls.clone())
        .start(&limiter)
        .unwrap();
    support::read_rules(
        &source,
        Duration::from_secs(5),
        "the rule source reads the master the Sentinels name",
    )
    .await;

    let quota = Quota::new(1_000_000_000, "1000000000/s".parse().unwrap()).unwrap();
    let (stop, from_redis, fallbacks) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let load: Vec<_> = (0..8)
        .map(|task| {
            let (limiter, stop) = (limiter.clone(), stop.clone());
            let (from_redis, fallbacks) = (from_redis.clone(), fallbacks.clone());
            tokio::spawn(async move {
                let key = format!("sentinel:{task}");
                while !stop.load(Ordering::Relaxed) {
                    match limiter.check(Request::new(&quota, &key)).await {
                        Ok(d) if !d.decisions()[0].fallback => {
                            from_redis.fetch_add(1, Ordering::Relaxed)
                        }
                        _ => fallbacks.fetch_add(1, Ordering::Relaxed),
                    };
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    let redis_decides = |more: u64, within: Duration| {
        let target = from_redis.load(Ordering::Relaxed) + more;
        let from_redis = from_redis.clone();
        async move {
            let started = Instant::now();
            while from_redis.load(Ordering::Relaxed) < target {
                assert!(
                    started.elapsed() < within,
                    "Redis decided nothing for {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            started.elapsed()
        }
    };
    redis_decides(100, Duration::from_secs(5)).await;
    let spent = Quota::new(3, "1/h".parse().unwrap()).unwrap();
    limiter.decide(&spent, "sentinel:spent", 3).await.unwrap();
    // Replication is asynchronous: wait until the replica has the write, so
    // what follows shows that replicated state survives (an unreplicated
    // write is what a failover loses).
    let mut on_replica = replica.connection().await;
    let started = Instant::now();
    loop {
        // A replica still loading its first sync answers `LOADING`.
        let there: i64 = redis::cmd("EXISTS")
            .arg("rl:sentinel:spent")
            .query_async(&mut on_replica)
            .await
            .unwrap_or(0);
        if there == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the write never reached the replica"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let killed_at = Instant::now();
    master.kill();
    let switch = redis_decides(100, Duration::from_secs(30)).await;
    let promoted = master_port(&sentinels[0]);
    assert_eq!(
        promoted,
        Some(replica.port()),
        "the replica is the master now"
    );
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("a caller panicked");
    }
    eprintln!(
        "master killed: calls back on Redis after {switch:?} ({:?} since the kill), {} fallbacks meanwhile",
        killed_at.elapsed(),
        fallbacks.load(Ordering::Relaxed)
    );
    assert!(
        fallbacks.load(Ordering::Relaxed) > 0,
        "the failover caused no fallback"
    );

    // The new master decides, all or nothing too; state replicated before
    // the kill is there.
    let seen = limiter.decide(&spent, "sentinel:spent", 0).await.unwrap();
    assert_eq!(
        seen.remaining, 0,
        "state written a while before the kill was replicated"
    );
    let all = limiter
        .decide_all(&[
            Request::new(&quota, "sentinel:a"),
            Request::new(&quota, "sentinel:b"),
        ])
        .await
        .unwrap();
    assert!(all.iter().all(|d| d.allowed));
    // And the rule source follows the new master.
    RedisRuleSource::sentinel(MASTER, urls)
        .publish("after-failover", "capacity=4 rate=1/s")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while limiter.rules().get("after-failover").is_none() {
        assert!(
            Instant::now() < deadline,
            "the rule published after the failover never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `SENTINEL FAILOVER` while the old master is alive and two instances
/// decide: both follow Sentinel's announcement at once, not a failure on the
/// old master (which a manual failover leaves answering for seconds), so
/// neither decides on the old master a second after the switch, and no key
/// is admitted more than one burst over its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_moves_two_instances_to_the_new_master_within_a_second() {
    switchover(false, false, false).await;
}

/// The same with the native module on both servers: the instances decide
/// through it on the old master and on the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_moves_two_instances_to_the_new_master_within_a_second_on_the_module() {
    switchover(true, true, false).await;
}

/// The module loaded on the master alone, as an operator may forget it on
/// the replica: after the switch, the instances decide on the new master
/// through the function, on the keys the module wrote, with no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_to_a_master_without_the_module_goes_on_through_the_function() {
    switchover(true, false, false).await;
}

/// The module loaded on the replica alone: the instances decide through the
/// function on the old master, and through the module on the new one from
/// the switch (each master is asked afresh, not a minute after the old one
/// refused the module).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_to_a_master_with_the_module_decides_through_it() {
    switchover(false, true, false).await;
}

/// The same after each instance first decided on a runtime that then shut
/// down (a test's, one a library made for a blocking call): the switch
/// watcher, which ran there, is started again with the instance's next
/// connection, on the runtime it is made on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_is_followed_after_the_runtime_first_used_shut_down() {
    switchover(false, false, true).await;
}

/// The decisions `server` has made: calls of the native module when
/// `module`, else of the limiter's function or script.
async fn decisions(server: &RedisServer, module: bool) -> u64 {
    if module {
        server.command_calls(&["ratelimit.decide"]).await
    } else {
        server.script_calls().await
    }
}

/// Every decision `server` has made, through the module or not.
async fn all_decisions(server: &RedisServer) -> u64 {
    server
        .command_calls(&["ratelimit.decide", "fcall", "evalsha"])
        .await
}

/// A switchover while two instances decide, with the native module loaded
/// on the master (`on_master`) and on the replica (`on_replica`), the
/// instances having first decided on a runtime since shut down when
/// `runtime_gone`.
async fn switchover(on_master: bool, on_replica: bool, runtime_gone: bool) {
    let module_path = support::native_module();
    let load = ["--loadmodule", module_path.to_str().unwrap()];
    let args = |module: bool| if module { &load[..] } else { &[][..] };
    let (master, replica, sentinels) = sentinel_set_with(args(on_master), args(on_replica), None);
    let urls: Vec<String> = sentinels.iter().map(|s| s.url()).collect();
    let instances: Vec<Limiter> = (0..2)
        .map(|_| {
            // Long enough that no call on a well master times out on a
            // loaded machine: what is tested is where calls go, and a call
            // the failure policy answers from a second after the switch
            // must mean a call sent where it should not have been.
            Limiter::builder()
                .sentinel(MASTER, urls.clone())
                .timeout(Duration::from_secs(2))
                .failure_policy(FailurePolicy::Open)
                .build()
                .unwrap()
        })
        .collect();
    if runtime_gone {
        for limiter in &instances {
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(limiter.ping()).unwrap();
            })
            .join()
            .unwrap();
        }
    }
    for limiter in &instances {
        limiter.ping().await.unwrap();
    }
    let (capacity, per_second) = (10u64, 5u64);
    let quota = Quota::new(capacity, Rate::per_second(per_second).unwrap()).unwrap();
    const KEYS: usize = 40;
    let stop = Arc::new(AtomicBool::new(false));
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    // Calls the failure policy answered: a backend error, or a call timed out.
    let fallbacks = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let load: Vec<_> = (0..32)
        .map(|task| {
            let limiter = instances[task % 2].clone();
            let (stop, admitted, fallbacks) = (stop.clone(), admitted.clone(), fallbacks.clone());
            tokio::spawn(async move {
                let mut n = task;
                while !stop.load(Ordering::Relaxed) {
                    n = (n * 7 + 3) % KEYS;
                    if let Ok(d) = limiter
                        .check(Request::new(&quota, &format!("switch:{n}")))
                        .await
                    {
                        if d.decisions()[0].fallback {
                            fallbacks.fetch_add(1, Ordering::Relaxed);
                        } else {
                            admitted[n].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = decisions(&master, on_master).await;
    assert!(before > 0, "the instances decide on the master");
    sentinel_command(&sentinels[0], &["failover", MASTER]);
    let switch = Instant::now();
    let waited = wait_for("the switch", Duration::from_secs(20), || {
        master_port(&sentinels[0]) == Some(replica.port())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let a_second_after = all_decisions(&master).await;
    let fallbacks_a_second_after = fallbacks.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let at_end = all_decisions(&master).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.expect("a caller panicked");
    }
    let elapsed = started.elapsed();
    assert_eq!(
        at_end,
        a_second_after,
        "the old master decided {} more calls from 1 s after the switch (seen {waited:?} after \
         the failover was asked, {:?} ago)",
        at_end - a_second_after,
        switch.elapsed()
    );
    // Through the module where it runs, through the function where not.
    assert!(
        decisions(&replica, on_replica).await > 0,
        "the new master decides (module: {on_replica})"
    );
    // The switch itself may fail a call or two over to the failure policy;
    // nothing after it may, the module's absence (or return) included.
    assert_eq!(
        fallbacks.load(Ordering::Relaxed),
        fallbacks_a_second_after,
        "calls answered by the failure policy from a second after the switch"
    );
    // The bound over the run, plus the one extra burst a switch may cost.
    let bound = capacity + per_second * elapsed.as_millis() as u64 / 1_000 + 1 + capacity;
    let worst = admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .max()
        .unwrap();
    eprintln!("switchover: the worst key admitted {worst} in {elapsed:?}, bound {bound}");
    assert!(worst <= bound, "a key admitted {worst}, over {bound}");
}

/// Sentinels that do not answer stop nothing while the master is well:
/// after a failed call (the master frozen past the timeout, then thawed),
/// decisions go on to the master as last known, rather than each waiting
/// on the Sentinels and failing until they answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_sentinels_leave_decisions_on_the_master_as_last_known() {
    let (master, _replica, sentinels) = sentinel_set();
    let urls: Vec<String> = sentinels.iter().map(|s| s.url()).collect();
    // The frozen master's call must time out; the master's answers after
    // the thaw must not, however loaded the machine.
    let limiter = Limiter::builder()
        .sentinel(MASTER, urls)
        .timeout(Duration::from_secs(1))
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap();
    let quota = Quota::new(1_000_000_000, "1000000000/s".parse().unwrap()).unwrap();
    let on_redis = |admitted: &ratelimit::Admitted<'_>| !admitted.decisions()[0].fallback;
    let first = limiter.check(Request::new(&quota, "k")).await.unwrap();
    assert!(on_redis(&first), "{:?}", first.decisions());
    sentinels.iter().for_each(RedisServer::freeze);
    master.freeze();
    let failed = limiter.check(Request::new(&quota, "k")).await.unwrap();
    assert!(!on_redis(&failed), "a frozen master decided");
    master.thaw();
    let started = Instant::now();
    let (fallbacks, logs) = support::logged(async {
        loop {
            let admitted = limiter.check(Request::new(&quota, "k")).await.unwrap();
            if on_redis(&admitted) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "decisions did not go back to the master while its Sentinels were frozen"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Back on the master, which answers: the frozen Sentinels are not
        // asked again, and decisions do not wait for them.
        let mut fallbacks = 0;
        for _ in 0..50 {
            let admitted = limiter.check(Request::new(&quota, "k")).await.unwrap();
            fallbacks += u32::from(!on_redis(&admitted));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fallbacks
    })
    .await;
    sentinels.iter().for_each(RedisServer::thaw);
    assert_eq!(fallbacks, 0, "decisions went to the failure policy");
    let asked = logs.matches("did not say where the master is").count();
    assert!(
        asked <= 2,
        "the frozen Sentinels were asked {asked} times while the master answered:\n{logs}"
    );
}

/// Sentinels that cannot be reached are tried again less and less often
/// while the master answers, not ten times a second for as long as they are
/// away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sentinels_are_tried_again_less_and_less_often() {
    let (_master, _replica, sentinels) = sentinel_set();
    let relay = support::Relay::start(sentinels[0].port()).await;
    let limiter = Limiter::builder()
        .sentinel(MASTER, [relay.url()])
        .timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    let quota = Quota::new(1_000_000_000, "1000000000/s".parse().unwrap()).unwrap();
    limiter.check(Request::new(&quota, "k")).await.unwrap();
    // The watcher's subscription, made on the first decision.
    wait_for(
        "a subscription through the relay",
        Duration::from_secs(5),
        || relay.accepted() >= 2,
    );
    // Nothing listens where the relay leads now.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    relay.lead_to(nowhere.local_addr().unwrap().port());
    drop(nowhere);
    relay.cut();
    let before = relay.accepted();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        limiter.check(Request::new(&quota, "k")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tries = relay.accepted() - before;
    assert!(
        tries <= 8,
        "{tries} connections to an unreachable Sentinel in 3 s"
    );
}

/// A Sentinel user that may not subscribe to `+switch-master` cannot be
/// told of switchovers: the limiter says so once, as an error naming the
/// permission, where it said nothing and followed a switchover only once a
/// call failed on the old master.
// Current-thread: the watcher logs on this thread, where `logged` listens.
#[tokio::test]
async fn a_sentinel_user_that_may_not_subscribe_is_named() {
    let (master, _replica, sentinels) = sentinel_set();
    let acl = |server: &RedisServer, rules: &[&str]| {
        let mut connection = server.client().get_connection().unwrap();
        let mut setuser = redis::cmd("ACL");
        setuser.arg("SETUSER").arg("watcher").arg(rules);
        let _: () = setuser.query(&mut connection).unwrap();
    };
    let no_subscribe = [
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-subscribe",
        "-psubscribe",
    ];
    acl(&master, &["on", ">pw", "~*", "&*", "+@all"]);
    for sentinel in &sentinels {
        acl(sentinel, &no_subscribe);
    }
    let urls: Vec<String> = sentinels
        .iter()
        .map(|s| format!("redis://watcher:pw@127.0.0.1:{}", s.port()))
        .collect();
    let limiter = Limiter::builder()
        .sentinel(MASTER, urls)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let limiter = &limiter;
    let (pinged, log) = support::logged_with(|logs| async move {
        let pinged = limiter.ping().await;
        // The watcher asks each Sentinel in turn: wait for its word (at most
        // 5 s), then half a second more for any repeat of it.
        let started = Instant::now();
        while !logs
            .text()
            .contains("may not subscribe to `+switch-master`")
            && started.elapsed() < Duration::from_secs(5)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        pinged
    })
    .await;
    pinged.expect("the master is reached");
    assert_eq!(
        log.matches("may not subscribe to `+switch-master`").count(),
        1,
        "named once: {log}"
    );
    assert!(
        log.contains("kind=permission") && !log.contains("pw@"),
        "{log}"
    );
}

/// Of the faults met asking several Sentinels, `ping` reports the most
/// severe, naming the Sentinel it was met on (without its password): one
/// that fixing the deployment ends (a refused password, a server that is
/// no Sentinel) before one that waiting may end (a Sentinel down), in
/// whichever order the Sentinels are given. Only the last Sentinel's fault
/// was reported, so a wrong password behind a Sentinel that was down read
/// as an outage.
#[tokio::test]
async fn the_most_severe_fault_among_the_sentinels_is_reported_with_its_address() {
    use ratelimit::ErrorKind;
    let server = RedisServer::start();
    support::config_set(&mut server.connection().await, "requirepass", "right-one").await;
    let plain = format!("127.0.0.1:{}", server.port());
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", listener.local_addr().unwrap().port())
    };
    let wrong_password = format!("redis://u:WRONG-pw@{plain}");
    let not_a_sentinel = format!("redis://:right-one@{plain}");
    let sentinel_down = format!("redis://:right-one@{down}");
    for (urls, kind, named) in [
        (
            vec![wrong_password.clone(), sentinel_down.clone()],
            ErrorKind::Authentication,
            &plain,
        ),
        (
            vec![sentinel_down.clone(), wrong_password.clone()],
            ErrorKind::Authentication,
            &plain,
        ),
        (vec![not_a_sentinel.clone()], ErrorKind::WrongServer, &plain),
        (
            vec![not_a_sentinel.clone(), sentinel_down.clone()],
            ErrorKind::WrongServer,
            &plain,
        ),
        (vec![sentinel_down.clone()], ErrorKind::Unavailable, &down),
    ] {
        let limiter = Limiter::builder()
            .sentinel(MASTER, urls.clone())
            .timeout(Duration::from_millis(500))
            .build()
            .unwrap();
        let error = limiter.ping().await.expect_err("no Sentinel to ask");
        let shown = error.to_string();
        assert_eq!(error.kind(), kind, "{urls:?}: {shown}");
        assert!(
            shown.contains(named.as_str()),
            "{urls:?}: names no Sentinel: {shown}"
        );
        for secret in ["WRONG-pw", "right-one"] {
            assert!(!shown.contains(secret), "{urls:?}: {shown}");
        }
    }
}
