//! Named rules changed at run time through Redis: two instances (two
//! limiters, each with its own `RedisRuleSource`) on one private
//! redis-server, and a `#[rate_limit(rule = ...)]` function whose admissions
//! show which quota each instance applies.

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit::{rate_limit, Limiter, PublishError, RateLimited, RedisRuleSource, RuleError};
use redis::AsyncCommands;
use support::RedisServer;
use tokio::time::Instant;

const HASH: &str = ratelimit::DEFAULT_RULES_HASH;
const CHANNEL: &str = ratelimit::DEFAULT_RULES_CHANNEL;

/// How soon every instance must apply an announced change: it takes
/// milliseconds, and the bound allows for a loaded machine while staying
/// far inside the periodic read (a minute, or never), so only the
/// announcement can have brought the change.
const ANNOUNCED: Duration = Duration::from_secs(5);

#[rate_limit(rule = "probe", key = "probe:<round>", capacity = 2, rate = "1/h", limiter = limiter)]
async fn probe(limiter: &Limiter, round: u64) -> Result<(), RateLimited> {
    Ok(())
}

static ROUND: AtomicU64 = AtomicU64::new(0);

/// How many calls in a row `limiter` admits on a key no call used before.
async fn admitted(limiter: &Limiter) -> usize {
    let round = ROUND.fetch_add(1, Ordering::Relaxed);
    let mut admitted = 0;
    while admitted < 20 && probe(limiter, round).await.is_ok() {
        admitted += 1;
    }
    admitted
}

/// One instance of a service: its limiter and the source keeping its rules.
struct Instance {
    limiter: Limiter,
    _source: RedisRuleSource,
}

async fn instance(server: &RedisServer, reload_every: Duration) -> Instance {
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a limiter on the private redis-server");
    let source = RedisRuleSource::builder(server.url())
        .reload_every(reload_every)
        .start(&limiter)
        .expect("a rule source on the private redis-server");
    support::read_rules(
        &source,
        Duration::from_secs(10),
        &format!("the rule source never read the rules\n{}", server.log()),
    )
    .await;
    Instance {
        limiter,
        _source: source,
    }
}

async fn two_instances(server: &RedisServer, reload_every: Duration) -> [Instance; 2] {
    logs();
    [
        instance(server, reload_every).await,
        instance(server, reload_every).await,
    ]
}

/// Waits until `check` holds on every instance, failing past `within` with
/// what each instance last showed.
async fn on_every_instance<T, F>(
    instances: &[Instance],
    within: Duration,
    what: &str,
    check: impl Fn(Limiter) -> F,
) where
    F: Future<Output = Result<(), T>>,
    T: std::fmt::Debug,
{
    let deadline = Instant::now() + within;
    loop {
        let mut last = Vec::new();
        for instance in instances {
            if let Err(seen) = check(instance.limiter.clone()).await {
                last.push(seen);
            }
        }
        if last.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not on every instance within {within:?}; last seen {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every instance admits `expected` calls on a fresh key, within `within`.
async fn admits(instances: &[Instance], expected: usize, within: Duration, what: &str) {
    on_every_instance(instances, within, what, |limiter| async move {
        match admitted(&limiter).await {
            n if n == expected => Ok(()),
            n => Err(n),
        }
    })
    .await;
}

/// Whether `limiter`'s rule `name` has `capacity` within `within`.
async fn rule_within(limiter: &Limiter, name: &str, capacity: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while limiter.rules().get(name).map(|q| q.capacity()) != Some(capacity) {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("ratelimit=info")
        .with_test_writer()
        .try_init();
}

#[tokio::test]
async fn a_published_rule_reaches_every_instance_within_a_second() {
    let server = RedisServer::start();
    let instances = two_instances(&server, Duration::from_secs(60)).await;
    admits(&instances, 2, ANNOUNCED, "the attribute's own capacity").await;

    let quota = RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
        .await
        .expect("publish a valid rule");
    assert_eq!(quota.capacity(), 5);
    admits(&instances, 5, ANNOUNCED, "capacity 2 -> 5").await;

    // Any algorithm: a fixed window of 3 an hour.
    RedisRuleSource::publish(
        &server.url(),
        "probe",
        "algorithm=fixed_window limit=3 window=1h",
    )
    .await
    .unwrap();
    admits(&instances, 3, ANNOUNCED, "a fixed window of 3").await;
    let mut redis = server.connection().await;
    let stored: String = redis.hget(HASH, "probe").await.unwrap();
    assert_eq!(stored, "algorithm=fixed_window limit=3 window=1h");
    for instance in &instances {
        let stats = instance.limiter.stats();
        assert_eq!(
            stats.fallbacks(),
            0,
            "every decision was Redis's: {stats:?}"
        );
    }
}

#[rate_limit(rule = "switch", key = "switch:<user>", capacity = 2, rate = "1/h", limiter = limiter)]
async fn switch(limiter: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_rule_can_change_algorithm_under_keys_that_hold_state() {
    let server = RedisServer::start();
    let instances = two_instances(&server, Duration::from_secs(60)).await;
    let limiter = &instances[0].limiter;
    switch(limiter, 1).await.unwrap();
    switch(limiter, 1).await.unwrap();
    let denied = switch(limiter, 1).await.unwrap_err();
    assert_eq!(denied.key, "switch:1");

    // The key holds a token bucket's state; the rule moves to a sliding log,
    // and back.
    RedisRuleSource::publish(
        &server.url(),
        "switch",
        "algorithm=sliding_log limit=1 window=1h",
    )
    .await
    .unwrap();
    on_every_instance(&instances, ANNOUNCED, "the sliding log", |limiter| {
        let rule = limiter.rules().get("switch");
        async move { rule.map(|_| ()).ok_or("not yet") }
    })
    .await;
    switch(limiter, 1).await.expect("a fresh log for the key");
    let denied = switch(limiter, 1).await.unwrap_err();
    assert_eq!(
        (denied.key.as_str(), denied.limit, denied.rule),
        ("switch:1", 1, Some("switch")),
        "denials name the attribute's key"
    );
    RedisRuleSource::remove(&server.url(), "switch")
        .await
        .unwrap();
    on_every_instance(&instances, ANNOUNCED, "the defaults", |limiter| {
        let rule = limiter.rules().get("switch");
        async move { rule.map_or(Ok(()), Err) }
    })
    .await;
    assert!(
        switch(limiter, 1).await.is_err(),
        "the token bucket's state is still spent"
    );
    let stats = limiter.stats();
    assert_eq!(
        (stats.fallbacks(), stats.errors),
        (0, 0),
        "no key met another algorithm's state: {stats:?}"
    );
}

#[tokio::test]
async fn an_invalid_rule_is_rejected_and_the_old_one_keeps_working() {
    let server = RedisServer::start();
    let instances = two_instances(&server, Duration::from_secs(60)).await;
    RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
        .await
        .unwrap();
    admits(&instances, 5, ANNOUNCED, "capacity 5").await;

    // The helper validates before it writes anything.
    let err = RedisRuleSource::publish(&server.url(), "probe", "capacity=0 rate=1/h")
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            PublishError::InvalidRule {
                error: RuleError::Quota(ratelimit::QuotaError::ZeroCapacity),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "invalid rule `probe`: capacity must be greater than 0"
    );
    let err = RedisRuleSource::publish(&server.url(), "*", "capacity=1 rate=1/h")
        .await
        .unwrap_err();
    assert!(matches!(err, PublishError::InvalidName(_)), "{err:?}");
    let mut redis = server.connection().await;
    let stored: String = redis.hget(HASH, "probe").await.unwrap();
    assert_eq!(stored, "capacity=5 rate=1/h", "nothing was written");

    // Written by hand, past the helper: every instance rejects it.
    let _: () = redis
        .hset(HASH, "probe", "capacity=lots rate=1/h")
        .await
        .unwrap();
    let _: () = redis.publish(CHANNEL, "probe").await.unwrap();
    // Messages are applied in order: once the next one is applied, the
    // invalid one was handled.
    RedisRuleSource::publish(&server.url(), "marker", "capacity=1 rate=1/s")
        .await
        .unwrap();
    on_every_instance(&instances, ANNOUNCED, "the marker rule", |limiter| {
        let marker = limiter.rules().get("marker");
        async move { marker.map(|_| ()).ok_or("no marker") }
    })
    .await;
    admits(
        &instances,
        5,
        Duration::ZERO,
        "the old rule after an invalid one",
    )
    .await;
    // A full read keeps it too.
    let _: () = redis.publish(CHANNEL, "*").await.unwrap();
    RedisRuleSource::publish(&server.url(), "marker", "capacity=2 rate=1/s")
        .await
        .unwrap();
    on_every_instance(&instances, ANNOUNCED, "the second marker", |limiter| {
        let marker = limiter.rules().get("marker").map(|q| q.capacity());
        async move { (marker == Some(2)).then_some(()).ok_or(marker) }
    })
    .await;
    admits(
        &instances,
        5,
        Duration::ZERO,
        "the old rule after a full read",
    )
    .await;
}

#[tokio::test]
async fn removing_a_rule_reverts_every_instance_to_the_attribute_defaults() {
    let server = RedisServer::start();
    let instances = two_instances(&server, Duration::from_secs(60)).await;
    RedisRuleSource::publish(&server.url(), "probe", "capacity=7 rate=1/h")
        .await
        .unwrap();
    admits(&instances, 7, ANNOUNCED, "capacity 7").await;

    assert!(RedisRuleSource::remove(&server.url(), "probe")
        .await
        .unwrap());
    admits(&instances, 2, ANNOUNCED, "back to the attribute's capacity").await;
    assert!(
        !RedisRuleSource::remove(&server.url(), "probe")
            .await
            .unwrap(),
        "removed already"
    );
}

#[tokio::test]
async fn the_periodic_read_applies_changes_made_without_a_message() {
    let server = RedisServer::start();
    let instances = two_instances(&server, Duration::from_millis(200)).await;
    // A rule the application set itself is not the source's to remove.
    for instance in &instances {
        instance
            .limiter
            .rules()
            .set_text("local_only", "capacity=1 rate=1/s")
            .unwrap();
    }
    let mut redis = server.connection().await;
    let _: () = redis
        .hset(HASH, "probe", "algorithm=gcra capacity=4 rate=1/h")
        .await
        .unwrap();
    let period = Duration::from_secs(3);
    admits(&instances, 4, period, "an HSET with no PUBLISH").await;

    let _: () = redis.hdel(HASH, "probe").await.unwrap();
    admits(&instances, 2, period, "an HDEL with no PUBLISH").await;
    for instance in &instances {
        assert!(instance.limiter.rules().get("local_only").is_some());
    }
}

#[tokio::test]
async fn the_source_follows_redis_through_a_restart() {
    let mut server = RedisServer::start();
    let instances = two_instances(&server, Duration::from_millis(500)).await;
    RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
        .await
        .unwrap();
    admits(&instances, 5, ANNOUNCED, "capacity 5").await;

    // Restarted with nothing saved: the hash is gone, so are its rules.
    server.restart();
    let reconnect = Duration::from_secs(5);
    on_every_instance(
        &instances,
        reconnect,
        "the rule gone with Redis",
        |limiter| {
            let rule = limiter.rules().get("probe");
            async move { rule.map_or(Ok(()), Err) }
        },
    )
    .await;
    // Announced on the new server: applied by the new subscriptions.
    RedisRuleSource::publish(&server.url(), "probe", "capacity=4 rate=1/h")
        .await
        .unwrap();
    admits(
        &instances,
        4,
        reconnect,
        "a rule published after the restart",
    )
    .await;
}

/// Publishes a marker rule of `capacity` and waits until `instance` applies
/// it: messages are applied in order, so every earlier one was handled.
async fn marked(server: &RedisServer, instance: &Instance, capacity: u64, within: Duration) {
    RedisRuleSource::publish(
        &server.url(),
        "marker",
        &format!("capacity={capacity} rate=1/s"),
    )
    .await
    .unwrap();
    on_every_instance(
        std::slice::from_ref(instance),
        within,
        "the marker rule",
        |limiter| {
            let marker = limiter.rules().get("marker").map(|q| q.capacity());
            async move { (marker == Some(capacity)).then_some(()).ok_or(marker) }
        },
    )
    .await;
}

/// Anyone who may publish on the channel can send it messages as fast as
/// Redis takes them: each instance reads the hash at most ten times a
/// second, answering every message that came meanwhile with one read, not
/// once a message. (Passes of at most 1,024 messages, ten a second, left a
/// flood of 60,000 to be read for six seconds after it ended, a backlog
/// held in memory.)
#[tokio::test]
async fn a_flood_of_announcements_costs_redis_a_few_reads() {
    let server = RedisServer::start();
    let _instance = instance(&server, Duration::from_secs(60)).await;
    let mut redis = server.connection().await;
    let before = server.command_calls(&["hgetall", "hget"]).await;
    let started = Instant::now();
    for _ in 0..20 {
        let mut flood = redis::pipe();
        for i in 0..3_000 {
            let message = match i % 3 {
                0 => "*",
                1 => "probe",
                _ => "not a rule name",
            };
            flood.cmd("PUBLISH").arg(CHANNEL).arg(message).ignore();
        }
        let _: () = flood.query_async(&mut redis).await.unwrap();
    }
    let sent_in = started.elapsed();
    // The whole hash is read at the first message, so no marker tells when
    // the rest are handled: until the reads stop.
    let (mut reads, deadline) = (0, Instant::now() + Duration::from_secs(120));
    let ended = Instant::now();
    let mut last_read = ended;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = server.command_calls(&["hgetall", "hget"]).await - before;
        if now == reads || Instant::now() > deadline {
            break;
        }
        reads = now;
        last_read = Instant::now();
    }
    let after = last_read.duration_since(ended);
    assert!(
        after <= Duration::from_secs(2),
        "the rules were read for {after:?} after the flood ended ({reads} reads; sent in {sent_in:?})"
    );
    let most = 20 + 10 * sent_in.as_secs();
    assert!(
        reads <= most,
        "{reads} reads of the rules for 60,000 messages sent in {sent_in:?}"
    );
}

/// `Duration::MAX` says "never" to the periodic read; announced changes
/// still apply.
#[tokio::test]
async fn a_source_that_never_reads_on_a_timer_still_follows_announcements() {
    let server = RedisServer::start();
    let instance = instance(&server, Duration::MAX).await;
    RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
        .await
        .unwrap();
    admits(std::slice::from_ref(&instance), 5, ANNOUNCED, "capacity 5").await;
}

/// An invalid field is logged once while it stays, and forgotten once it
/// is gone: tools that write fields of their own do not grow the source.
#[tokio::test]
async fn an_invalid_field_is_forgotten_once_it_leaves_the_hash() {
    let server = RedisServer::start();
    let ((), logs) = support::logged(async {
        let instance = instance(&server, Duration::from_secs(60)).await;
        let mut redis = server.connection().await;
        for (present, capacity) in [(true, 1), (true, 2), (false, 3), (true, 4)] {
            if present {
                let _: () = redis
                    .hset(HASH, "tenant 42", "capacity=9 rate=1/s")
                    .await
                    .unwrap();
            } else {
                let _: () = redis.hdel(HASH, "tenant 42").await.unwrap();
            }
            let _: () = redis.publish(CHANNEL, "*").await.unwrap();
            marked(&server, &instance, capacity, ANNOUNCED * 5).await;
        }
    })
    .await;
    assert_eq!(
        logs.matches("not a valid rule name").count(),
        2,
        "logged when it came, and again when it came back: {logs}"
    );
}

/// A hash Redis will not read (another type at its key, here) is named as
/// such, and read again on the timer, not by reconnecting at once; once it
/// can be read, the source is ready.
#[tokio::test]
async fn a_hash_redis_refuses_to_read_is_named_and_read_again_later() {
    let server = RedisServer::start();
    let mut redis = server.connection().await;
    let _: () = redis.set(HASH, "not a hash").await.unwrap();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let (limiter, server_ref, redis_ref) = (&limiter, &server, &mut redis);
    let (connections, logs) = support::logged_with(|log| async move {
        let (server, redis) = (server_ref, redis_ref);
        let connections = || async {
            let info: String = redis::cmd("INFO")
                .arg("stats")
                .query_async(&mut server.connection().await)
                .await
                .unwrap();
            info.lines()
                .find_map(|l| l.strip_prefix("total_connections_received:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap()
        };
        let source = RedisRuleSource::builder(server.url())
            .reload_every(Duration::from_millis(300))
            .start(limiter)
            .unwrap();
        // The source is connected once it has read the hash (and been
        // refused); from there, counted 300 ms apart, only the count's own
        // connection is new.
        let started = Instant::now();
        while !log.text().contains("WRONGTYPE") {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the source never read the hash"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut first = connections().await;
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = connections().await;
            if now - first == 1 {
                first = now;
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the source kept connecting"
            );
            first = now;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let made = connections().await - first;
        let _: () = redis.del(HASH).await.unwrap();
        let _: () = redis
            .hset(HASH, "probe", "capacity=5 rate=1/h")
            .await
            .unwrap();
        support::read_rules(
            &source,
            Duration::from_secs(5),
            "ready once the hash can be read",
        )
        .await;
        made
    })
    .await;
    // One connection a call to INFO; the source's own stay open.
    assert!(
        connections <= 1,
        "{connections} connections made meanwhile: {logs}"
    );
    assert!(logs.contains("WRONGTYPE"), "{logs}");
    assert!(!logs.contains("cannot reach Redis"), "{logs}");
    assert_eq!(limiter.rules().get("probe").map(|q| q.capacity()), Some(5));
}

/// A read Redis refuses for a while only (here a replica whose master is
/// away, which will not serve stale data) is tried again on the reconnect
/// backoff, not left for the periodic read, here a minute away.
#[tokio::test]
async fn a_read_refused_for_a_while_is_tried_again_soon() {
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = nowhere.local_addr().unwrap().port().to_string();
    drop(nowhere);
    let server = RedisServer::start();
    let mut redis = server.connection().await;
    support::config_set(&mut redis, "replica-serve-stale-data", "no").await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&port)
        .query_async(&mut redis)
        .await
        .unwrap();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let source = RedisRuleSource::builder(server.url())
        .reload_every(Duration::from_secs(60))
        .start(&limiter)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis
        .hset(HASH, "probe", "capacity=5 rate=1/h")
        .await
        .unwrap();
    support::read_rules(
        &source,
        Duration::from_secs(5),
        "ready soon after the server serves reads",
    )
    .await;
    assert_eq!(limiter.rules().get("probe").map(|q| q.capacity()), Some(5));
}

#[tokio::test]
async fn a_refused_read_named_by_many_announcements_is_logged_once_a_second() {
    let server = RedisServer::start();
    let mut redis = server.connection().await;
    let _: () = redis.set(HASH, "not a hash").await.unwrap();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let ((), logs) = support::logged(async {
        let _source = RedisRuleSource::builder(server.url())
            .reload_every(Duration::from_secs(60))
            .start(&limiter)
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Each message names a rule, which the source reads at once.
        for _ in 0..300 {
            let _: () = redis.publish(CHANNEL, "probe").await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    })
    .await;
    let lines = logs.matches("could not read the rules").count();
    assert!(lines >= 1, "the refusal was never named: {logs}");
    assert!(lines <= 3, "{lines} lines for 300 announcements in 0.5 s");
}

#[tokio::test]
async fn a_rule_longer_than_any_is_refused_unread_and_logged_once() {
    let server = RedisServer::start();
    let huge = format!("capacity=5 rate=1/h {}", "x".repeat(2 << 20));
    let refused = RedisRuleSource::publish(&server.url(), "probe", &huge)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &refused,
            PublishError::InvalidRule { error: RuleError::TooLong(n), .. } if *n == huge.len()
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().len() < 200, "{refused}");
    RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
        .await
        .unwrap();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let ((), logs) = support::logged(async {
        let _source = reading_source(&server, &limiter, Duration::from_millis(100)).await;
        // Written past the publisher's check, as another client may.
        let mut redis = server.connection().await;
        let _: () = redis.hset(HASH, "probe", &huge).await.unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
    })
    .await;
    assert_eq!(
        logs.matches("invalid rule in Redis rejected").count(),
        1,
        "{logs}"
    );
    assert!(logs.contains("at most 1024 bytes"), "{logs}");
    assert!(logs.len() < 4096, "the text was logged whole");
    assert_eq!(limiter.rules().get("probe").map(|q| q.capacity()), Some(5));
}

#[tokio::test]
async fn a_hash_too_large_to_read_in_time_is_named_and_announced_rules_still_apply() {
    let server = RedisServer::start();
    let mut redis = server.connection().await;
    // 500,000 fields: more than the whole-hash read takes within 500 ms
    // (a `PING` meanwhile is answered within it).
    for chunk in 0..20 {
        let _: () = redis::cmd("EVAL")
            .arg(
                "for i = 1, 25000 do \
                 redis.call('HSET', KEYS[1], ARGV[1] .. ':' .. i, 'capacity=1 rate=1/s') end",
            )
            .arg(1)
            .arg(HASH)
            .arg(chunk)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let (applied, logs) = support::logged(async {
        let _source = RedisRuleSource::builder(server.url())
            .timeout(Duration::from_millis(500))
            .reload_every(Duration::from_secs(60))
            .start(&limiter)
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
            .await
            .unwrap();
        rule_within(&limiter, "probe", 5, Duration::from_secs(5)).await
    })
    .await;
    assert!(applied, "the announced rule never applied: {logs}");
    assert!(logs.contains("not read within"), "{logs}");
    assert!(!logs.contains("cannot reach Redis"), "{logs}");
}

#[tokio::test]
async fn a_frozen_server_is_an_outage_not_a_hash_too_large() {
    let server = RedisServer::start();
    RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
        .await
        .unwrap();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let (followed, logs) = support::logged(async {
        let _source = RedisRuleSource::builder(server.url())
            .timeout(Duration::from_millis(300))
            .reload_every(Duration::from_millis(200))
            .start(&limiter)
            .unwrap();
        assert!(rule_within(&limiter, "probe", 5, Duration::from_secs(5)).await);
        server.freeze();
        tokio::time::sleep(Duration::from_secs(2)).await;
        server.thaw();
        RedisRuleSource::publish(&server.url(), "probe", "capacity=7 rate=1/h")
            .await
            .unwrap();
        rule_within(&limiter, "probe", 7, ANNOUNCED).await
    })
    .await;
    assert!(followed, "never followed after the thaw: {logs}");
    assert!(logs.contains("cannot reach Redis"), "{logs}");
    assert!(
        !logs.contains("not read within"),
        "a frozen server was called a hash too large: {logs}"
    );
}

#[tokio::test]
async fn the_reads_connection_outlives_the_servers_idle_timeout() {
    // `timeout 2` in redis.conf closes a connection idle for three seconds:
    // the periodic read four seconds after the first one finds its
    // connection open, not lost.
    let server = RedisServer::start_with(&["--timeout", "2"]);
    RedisRuleSource::publish(&server.url(), "probe", "capacity=5 rate=1/h")
        .await
        .unwrap();
    let limiter = Limiter::builder().redis(server.url()).build().unwrap();
    let ((), logs) = support::logged(async {
        let _source = reading_source(&server, &limiter, Duration::from_secs(4)).await;
        tokio::time::sleep(Duration::from_millis(4_500)).await;
    })
    .await;
    assert!(!logs.contains("cannot reach Redis"), "{logs}");
}

/// A rule source of `server` for `limiter`, reloading `every`, once it has
/// read the rules.
async fn reading_source(
    server: &RedisServer,
    limiter: &Limiter,
    every: Duration,
) -> RedisRuleSource {
    let source = RedisRuleSource::builder(server.url())
        .reload_every(every)
        .start(limiter)
        .unwrap();
    support::read_rules(&source, Duration::from_secs(5), "read the rules").await;
    source
}
