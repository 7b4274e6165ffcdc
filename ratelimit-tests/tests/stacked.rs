//! Several `#[rate_limit]` on one function, combined with the other
//! features: the same key template twice, each attribute's own failure
//! policy, and the deny cache in front of an all-or-nothing check.

mod support;

use support::Decide;

use std::time::Duration;

use ratelimit::{
    rate_limit, DenialCause, FailurePolicy, Limiter, Quota, Rate, RateLimited, Request,
};
use support::RedisServer;

/// A timeout for calls that must get Redis's own answer (the first also
/// loads the function library), not the failure policy's, however loaded
/// the machine: none of these tests is about timeouts.
const ANSWER: Duration = Duration::from_secs(2);

fn redis_limiter(server: &RedisServer) -> Limiter {
    Limiter::builder()
        .redis(server.url())
        .timeout(ANSWER)
        .build()
        .unwrap()
}

/// The common pair: a burst limit and a sustained limit on one template.
#[rate_limit(key = "api:<user>", capacity = 10, rate = "10/min", limiter = limiter)]
#[rate_limit(key = "api:<user>", algorithm = fixed_window, limit = 1000, window = "1h", limiter = limiter)]
async fn api(limiter: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

/// The same template twice, the first exempt on some calls.
#[rate_limit(key = "s:<user>", capacity = 1, rate = "1/h", exempt = skip, limiter = limiter)]
#[rate_limit(key = "s:<user>", algorithm = fixed_window, limit = 3, window = "1h", limiter = limiter)]
async fn skippable(limiter: &Limiter, user: u32, skip: bool) -> Result<(), RateLimited> {
    Ok(())
}

/// The second check keeps its own key on calls where the first is exempt:
/// otherwise it decided on the first's key then, under its own algorithm,
/// and the first found that state on the next call.
#[tokio::test]
async fn a_check_keeps_its_own_key_on_calls_where_an_earlier_one_is_exempt() {
    let server = RedisServer::start();
    let redis = Limiter::builder()
        .redis(server.url())
        .timeout(ANSWER)
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    for limiter in [Limiter::memory(), redis] {
        skippable(&limiter, 7, true).await.unwrap();
        skippable(&limiter, 7, false).await.unwrap();
        let denied = skippable(&limiter, 7, false).await.unwrap_err();
        assert_eq!(denied.cause, DenialCause::Quota, "{denied:?}");
        assert_eq!(
            denied.limit, 1,
            "the first check's quota denies: {denied:?}"
        );
        // The second counted two calls (the denied one took nothing): one
        // more fits in its 3.
        skippable(&limiter, 7, true).await.unwrap();
        let fourth = skippable(&limiter, 7, true).await.unwrap_err();
        assert_eq!(fourth.limit, 3, "{fourth:?}");
    }
}

#[tokio::test]
async fn a_burst_and_a_sustained_limit_on_one_template_keep_state_of_their_own() {
    let server = RedisServer::start();
    let redis = redis_limiter(&server);
    for limiter in [Limiter::memory(), redis] {
        for i in 0..10 {
            api(&limiter, 7)
                .await
                .unwrap_or_else(|e| panic!("{}: call {i}: {e}", limiter.backend_name()));
        }
        let denied = api(&limiter, 7).await.unwrap_err();
        assert_eq!(denied.cause, DenialCause::Quota, "{denied:?}");
        assert_eq!(denied.key, "api:7", "denials report the key as built");
        assert!(denied.retry_after <= Duration::from_secs(6), "{denied:?}");
        // Both limits hold state: the sustained window counted every call.
        let hourly = Quota::fixed_window(1000, Duration::from_secs(3600)).unwrap();
        let sustained = limiter.decide(&hourly, "api:7~2", 0).await.unwrap();
        assert_eq!(sustained.remaining, 990, "{}", limiter.backend_name());
    }
}

#[rate_limit(key = "pay:<user>", capacity = 5, rate = "1/s", on_error = closed, limiter = limiter)]
#[rate_limit(key = "pay:all", capacity = 100, rate = "100/s", limiter = limiter)]
async fn pay(limiter: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn each_stacked_attribute_keeps_its_own_failure_policy() {
    let mut server = RedisServer::start();
    // The limiter fails open; the per-user attribute says closed.
    // The killed server refuses calls at once; the first call, which also
    // loads the function library, must get Redis's answer.
    let limiter = Limiter::builder()
        .redis(server.url())
        .timeout(ANSWER)
        .failure_policy(FailurePolicy::Open)
        .build()
        .unwrap();
    pay(&limiter, 1).await.unwrap();
    server.kill();
    let denied = pay(&limiter, 1).await.unwrap_err();
    assert!(
        matches!(denied.cause, DenialCause::BackendUnavailable { .. }),
        "the closed attribute must fail closed when stacked: {denied:?}"
    );
    assert_eq!(denied.key, "pay:1");
}

#[tokio::test]
async fn an_all_or_nothing_check_on_a_spent_dimension_is_answered_by_the_deny_cache() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server);
    let user = Quota::new(2, "1/min".parse().unwrap()).unwrap();
    let global = Quota::new(1_000, "1/h".parse().unwrap()).unwrap();
    let check = [
        Request::new(&user, "user:1"),
        Request::new(&global, "global"),
    ];
    limiter.check(&check[..]).await.unwrap();
    limiter.check(&check[..]).await.unwrap();
    let first = limiter.check(&check[..]).await.unwrap_err();
    assert_eq!(first.key, "user:1");
    let calls = server.script_calls().await;
    for _ in 0..100 {
        let denied = limiter.check(&check[..]).await.unwrap_err();
        assert_eq!(denied.key, "user:1");
        assert!(denied.retry_after <= first.retry_after);
    }
    assert_eq!(
        server.script_calls().await,
        calls,
        "denials of a spent dimension reached Redis"
    );
    // The global dimension was never consumed by the denied checks.
    let seen = limiter.decide(&global, "global", 0).await.unwrap();
    assert_eq!(seen.remaining, 998);
}

/// A cost no dimension's capacity can hold is named after that dimension:
/// its key and its rule, not the first dimension's.
#[tokio::test]
async fn a_cost_above_one_dimensions_capacity_names_that_dimension() {
    let limiter = ratelimit::Limiter::memory();
    let (roomy, small) = (
        ratelimit::Quota::per_minute(100).unwrap(),
        ratelimit::Quota::per_minute(3).unwrap(),
    );
    let denied = limiter
        .check([
            ratelimit::Request::new(&roomy, "user:7")
                .cost(5)
                .rule("user"),
            ratelimit::Request::new(&small, "ip:1").cost(5).rule("ip"),
        ])
        .await
        .unwrap_err();
    assert_eq!((denied.key.as_ref(), denied.rule), ("ip:1", Some("ip")));
    assert_eq!(
        denied.cause,
        ratelimit::DenialCause::CostExceedsCapacity { cost: 5 }
    );
    assert_eq!(denied.retry_after, std::time::Duration::MAX);
}

/// Stacked on two limiters: one per process, one shared, say. They are
/// asked one after the other, in the order written.
#[rate_limit(key = "export:<user>", capacity = 5, rate = "1/min", limiter = first)]
#[rate_limit(key = "export-all:<user>", capacity = 1, rate = "1/min", limiter = second)]
async fn export(first: &Limiter, second: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

/// The same pair, the later one waiting up to 20 s for its token.
#[rate_limit(key = "report:<user>", capacity = 5, rate = "1/min", limiter = first)]
#[rate_limit(key = "report-all:<user>", capacity = 1, rate = "1/10s", on_limit = wait(max = "20s"), limiter = second)]
async fn report(first: &Limiter, second: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

/// The attributes' `capacity = 5, rate = "1/min"`.
fn five_a_minute() -> Quota {
    Quota::token_bucket(5, Rate::per_minute(1).unwrap()).unwrap()
}

/// How many calls `limiter` still admits on `key`, asked one by one.
async fn admits_left(limiter: &Limiter, quota: &Quota, key: &str) -> u64 {
    let mut admitted = 0;
    while limiter.check(Request::new(quota, key)).await.is_ok() {
        admitted += 1;
        assert!(
            admitted <= quota.capacity(),
            "{key}: more than the capacity"
        );
    }
    admitted
}

/// What `key` has left once the refunds sent when calls were dropped have
/// landed: `expected`, or what it has after five seconds.
async fn remaining_once_given_back(
    limiter: &Limiter,
    quota: &Quota,
    key: &str,
    expected: u64,
) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = limiter.inspect(quota, key, 0).await.unwrap().remaining;
        if left == expected || tokio::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each pair of limiters a service could stack: memory and Redis, either way
/// round, and two of one kind.
fn pairs(server: &RedisServer) -> Vec<(Limiter, Limiter)> {
    let redis = || redis_limiter(server);
    vec![
        (Limiter::memory(), Limiter::memory()),
        (Limiter::memory(), redis()),
        (redis(), Limiter::memory()),
        (redis(), redis()),
    ]
}

#[tokio::test]
async fn stacked_attributes_on_two_limiters_take_nothing_when_the_later_one_denies() {
    let server = RedisServer::start();
    for (user, (first, second)) in (0..).zip(pairs(&server)) {
        let names = format!("{} then {}", first.backend_name(), second.backend_name());
        export(&first, &second, user).await.unwrap();
        for _ in 0..3 {
            let denied = export(&first, &second, user).await.unwrap_err();
            assert_eq!(denied.cause, DenialCause::Quota, "{names}: {denied:?}");
            assert_eq!(denied.key, format!("export-all:{user}"), "{names}");
        }
        // The admitted call took one of the first limit's five; the three
        // denied calls took nothing from it.
        let left = admits_left(&first, &five_a_minute(), &format!("export:{user}")).await;
        assert_eq!(left, 4, "{names}");
    }
}

#[tokio::test]
async fn stacked_attributes_on_two_limiters_take_nothing_when_dropped_at_the_later_one() {
    let server = RedisServer::start();
    for (user, (first, second)) in (0..).zip(pairs(&server)) {
        let names = format!("{} then {}", first.backend_name(), second.backend_name());
        report(&first, &second, user).await.unwrap();
        // The second limit's token is ten seconds away: the call waits for
        // it, and its caller gives up first, three times.
        for _ in 0..3 {
            let gone =
                tokio::time::timeout(Duration::from_millis(500), report(&first, &second, user));
            assert!(gone.await.is_err(), "{names}: the call waited");
        }
        // What the first limit gave those calls comes back: a refund sent
        // when each call was dropped, so it lands shortly after.
        let quota = five_a_minute();
        let key = format!("report:{user}");
        let left = remaining_once_given_back(&first, &quota, &key, 4).await;
        assert_eq!(left, 4, "{names}");
        assert_eq!(admits_left(&first, &quota, &key).await, 4, "{names}");
    }
}

/// A leaky bucket admits a call for its turn; the attribute sleeps until
/// then.
#[rate_limit(key = "crawl:<site>", algorithm = leaky_bucket, capacity = 3, rate = "1/min", limiter = limiter)]
async fn crawl(limiter: &Limiter, site: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[tokio::test]
async fn a_call_dropped_while_it_waits_its_turn_gives_the_turn_back() {
    let server = RedisServer::start();
    let redis = redis_limiter(&server);
    for limiter in [Limiter::memory(), redis] {
        let name = limiter.backend_name();
        // The first call's turn is now; the next ones' a minute apart.
        crawl(&limiter, 1).await.unwrap();
        for _ in 0..2 {
            let gone = tokio::time::timeout(Duration::from_millis(500), crawl(&limiter, 1));
            assert!(gone.await.is_err(), "{name}: the call waited its turn");
        }
        let quota = Quota::leaky_bucket(3, Rate::per_minute(1).unwrap()).unwrap();
        let left = remaining_once_given_back(&limiter, &quota, "crawl:1", 2).await;
        assert_eq!(
            left, 2,
            "{name}: the two dropped calls' turns are free again"
        );
    }
}

/// A call dropped where no runtime runs (its runtime shut down while it
/// waited) cannot send a refund: what it took stays taken, which admits
/// less, never more, and nothing panics.
#[test]
fn a_stacked_call_dropped_outside_any_runtime_keeps_its_tokens_and_panics_nowhere() {
    let (first, second) = (Limiter::memory(), Limiter::memory());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut waiting = Box::pin(report(&first, &second, 1));
    runtime.block_on(async {
        report(&first, &second, 1).await.unwrap();
        // The second limit's token is a second away: the call waits for it.
        assert!(futures::poll!(waiting.as_mut()).is_pending());
    });
    drop(runtime);
    drop(waiting);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let left = runtime.block_on(admits_left(&first, &five_a_minute(), "report:1"));
    assert_eq!(left, 3, "two calls took a token each");
}

/// A runtime shutting down drops its tasks: a stacked call waiting in one
/// is dropped while no new task can run. Its refund cannot be sent; what it
/// took stays taken, and nothing panics or recurses.
#[test]
fn a_stacked_call_dropped_by_its_runtime_shutting_down_keeps_its_tokens() {
    let (first, second) = (Limiter::memory(), Limiter::memory());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        report(&first, &second, 1).await.unwrap();
        let (one, two) = (first.clone(), second.clone());
        // The second limit's token is a second away: the call waits for it.
        tokio::spawn(async move { report(&one, &two, 1).await });
        while first
            .inspect(&five_a_minute(), "report:1", 0)
            .await
            .unwrap()
            .remaining
            > 3
        {
            tokio::task::yield_now().await;
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let left = runtime.block_on(admits_left(&first, &five_a_minute(), "report:1"));
    assert_eq!(left, 3, "two calls took a token each");
}
