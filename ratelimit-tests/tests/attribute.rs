//! `#[rate_limit]` end to end on the memory backend: what runs, what is
//! denied, and what the caller gets.

use std::future::Future as _;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ratelimit::{rate_limit, DenialCause, Limiter, ManualClock, RateLimited};

#[derive(Debug, PartialEq)]
enum AppError {
    Limited(RateLimited),
    NotFound,
}

impl From<RateLimited> for AppError {
    fn from(denied: RateLimited) -> Self {
        AppError::Limited(denied)
    }
}

fn limited(result: Result<impl std::fmt::Debug, AppError>) -> RateLimited {
    match result {
        Err(AppError::Limited(denied)) => denied,
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn manual_limiter() -> (Limiter, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000_000);
    let limiter = Limiter::builder()
        .memory()
        .clock(clock.clone())
        .build()
        .unwrap();
    (limiter, clock)
}

static BODY_RUNS: AtomicU32 = AtomicU32::new(0);

#[rate_limit(key = "order:submit:<user_id>", capacity = 2, rate = "1/s", limiter = limiter)]
async fn submit_order(limiter: &Limiter, user_id: u64, quantity: u32) -> Result<u32, AppError> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    if quantity == 0 {
        return Err(AppError::NotFound);
    }
    Ok(quantity)
}

#[tokio::test]
async fn a_denial_returns_rate_limited_without_running_the_body() {
    let (limiter, clock) = manual_limiter();
    let before = BODY_RUNS.load(Ordering::SeqCst);
    assert_eq!(submit_order(&limiter, 7, 1).await, Ok(1));
    assert_eq!(submit_order(&limiter, 7, 0).await, Err(AppError::NotFound));
    let denied = limited(submit_order(&limiter, 7, 1).await);
    assert_eq!(
        BODY_RUNS.load(Ordering::SeqCst) - before,
        2,
        "the denied call ran its body"
    );
    assert_eq!(denied.key, "order:submit:7");
    assert_eq!(denied.limit, 2);
    assert_eq!(denied.remaining, 0);
    assert_eq!(denied.retry_after, Duration::from_secs(1));
    assert_eq!(denied.cause, DenialCause::Quota);
    assert!(
        denied.rule.unwrap().ends_with("submit_order"),
        "{:?}",
        denied.rule
    );
    assert_eq!(
        denied.to_string(),
        "rate limited on `order:submit:7`; retry after 1s"
    );
    // Another user has a bucket of their own.
    assert_eq!(submit_order(&limiter, 8, 3).await, Ok(3));
    // After retry_after, the same user is admitted again.
    clock.advance(denied.retry_after);
    assert_eq!(submit_order(&limiter, 7, 5).await, Ok(5));
}

struct Tenant {
    name: String,
    limiter: Limiter,
}

impl Tenant {
    #[rate_limit(key = "report:<self.name>:<kind>", capacity = 1, rate = "1/min", limiter = &self.limiter)]
    async fn report(&self, kind: &str) -> Result<String, AppError> {
        Ok(format!("{} {kind}", self.name))
    }
}

#[tokio::test]
async fn methods_key_on_fields_of_self_and_values_are_escaped() {
    let (limiter, _) = manual_limiter();
    let acme = Tenant {
        name: "acme:{eu}".into(),
        limiter,
    };
    assert_eq!(acme.report("daily").await, Ok("acme:{eu} daily".into()));
    let denied = limited(acme.report("daily").await);
    assert_eq!(denied.key, "report:acme%3A%7Beu%7D:daily");
    assert!(acme.report("weekly").await.is_ok());
}

#[rate_limit(key = "import:<user>", capacity = 10, rate = "10/s", cost = rows.len(), limiter = limiter)]
async fn import(limiter: &Limiter, user: &str, rows: Vec<u32>) -> Result<usize, AppError> {
    Ok(rows.len())
}

#[tokio::test]
async fn cost_comes_from_the_arguments_and_too_large_a_cost_is_never() {
    let (limiter, _) = manual_limiter();
    assert_eq!(import(&limiter, "ann", vec![1; 7]).await, Ok(7));
    let denied = limited(import(&limiter, "ann", vec![1; 4]).await);
    assert_eq!(denied.remaining, 3);
    assert_eq!(import(&limiter, "ann", vec![1; 3]).await, Ok(3));
    let never = limited(import(&limiter, "bob", vec![1; 11]).await);
    assert_eq!(never.cause, DenialCause::CostExceedsCapacity { cost: 11 });
    assert_eq!(never.retry_after, Duration::MAX);
    assert!(!never.is_retryable());
}

static STACK_BODY: AtomicU32 = AtomicU32::new(0);

#[rate_limit(key = "stack:user:<user>", capacity = 3, rate = "1/min", limiter = limiter)]
#[rate_limit(key = "stack:global", capacity = 4, rate = "1/min", limiter = limiter)]
async fn stacked(limiter: &Limiter, user: u32) -> Result<(), AppError> {
    STACK_BODY.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn stacked_attributes_admit_all_or_nothing() {
    let (limiter, _) = manual_limiter();
    for _ in 0..3 {
        stacked(&limiter, 1).await.unwrap();
    }
    // The per-user limit denies; the global one is not consumed.
    let denied = limited(stacked(&limiter, 1).await);
    assert_eq!(denied.key, "stack:user:1");
    stacked(&limiter, 2).await.unwrap();
    // Four admitted globally: the global limit now denies user 3, and user 3's
    // own bucket is left untouched.
    let denied = limited(stacked(&limiter, 3).await);
    assert_eq!(denied.key, "stack:global");
    let quota = ratelimit::Quota::new(3, "1/min".parse().unwrap()).unwrap();
    let user3 = limiter.inspect(&quota, "stack:user:3", 0).await.unwrap();
    assert_eq!(
        user3.remaining, 3,
        "the denied call took nothing from user 3"
    );
    assert_eq!(STACK_BODY.load(Ordering::SeqCst), 4);
}

#[rate_limit(key = "generic:<id>", capacity = 1, rate = 1, limiter = limiter)]
async fn generic<T: std::fmt::Display + Send + Sync>(
    limiter: &Limiter,
    id: T,
) -> Result<String, AppError> {
    Ok(id.to_string())
}

#[tokio::test]
async fn generic_functions_are_limited_per_value() {
    let (limiter, _) = manual_limiter();
    assert_eq!(generic(&limiter, "a").await, Ok("a".into()));
    assert_eq!(generic(&limiter, 5u8).await, Ok("5".into()));
    assert!(generic(&limiter, "a").await.is_err());
}

#[rate_limit(key = format!("{}/{}", region, user), capacity = 1, rate = 1, limiter = limiter)]
async fn by_expression(limiter: &Limiter, region: &str, user: u64) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn key_expressions_are_used_whole_but_cannot_choose_a_hash_tag() {
    let (limiter, _) = manual_limiter();
    by_expression(&limiter, "eu", 1).await.unwrap();
    let denied = limited(by_expression(&limiter, "eu", 1).await);
    assert_eq!(denied.key, "eu/1");
    by_expression(&limiter, "{x}", 1).await.unwrap();
    let denied = limited(by_expression(&limiter, "{x}", 1).await);
    assert_eq!(denied.key, "%7Bx%7D/1");
}

#[rate_limit(key = name, capacity = 1, rate = "1/h", limiter = limiter)]
async fn by_name(limiter: &Limiter, name: &str) -> Result<(), AppError> {
    Ok(())
}

/// A key is written in logs: a whole key escapes every control character
/// (NEL, U+0085, among them) and the line and paragraph separators, so it
/// cannot start a line of its own; an empty one is `%_`, as an empty
/// template value is.
#[tokio::test]
async fn whole_keys_escape_unicode_line_breaks_and_are_never_empty() {
    for (name, key) in [
        ("a\u{85}b", "a%C2%85b"),
        ("a\u{2028}b\u{2029}", "a%E2%80%A8b%E2%80%A9"),
        ("", "%_"),
    ] {
        let (limiter, _) = manual_limiter();
        by_name(&limiter, name).await.unwrap();
        let denied = limited(by_name(&limiter, name).await);
        assert_eq!(denied.key, key, "{name:?}");
    }
}

struct Left;
struct Right;

impl Left {
    #[rate_limit(key = "rule:left", capacity = 1, rate = "1/h", limiter = limiter)]
    async fn get(&self, limiter: &Limiter) -> Result<(), AppError> {
        Ok(())
    }

    #[rate_limit(rule = "left_put", key = "rule:left:put", capacity = 1, rate = "1/h", limiter = limiter)]
    async fn put(&self, limiter: &Limiter) -> Result<(), AppError> {
        Ok(())
    }
}

impl Right {
    #[rate_limit(key = "rule:right", capacity = 1, rate = "1/h", limiter = limiter)]
    async fn get(&self, limiter: &Limiter) -> Result<(), AppError> {
        Ok(())
    }

    #[rate_limit(rule = "right_put", key = "rule:right:put", capacity = 1, rate = "1/h", limiter = limiter)]
    async fn put(&self, limiter: &Limiter) -> Result<(), AppError> {
        Ok(())
    }
}

/// The default rule is the module path and the function's name: the
/// attribute cannot see the impl's type, so `Left::get` and `Right::get`
/// report one rule, as documented, and `rule = "..."` tells them apart.
#[tokio::test]
async fn methods_of_one_name_in_one_module_share_the_default_rule() {
    let (limiter, _) = manual_limiter();
    Left.get(&limiter).await.unwrap();
    Right.get(&limiter).await.unwrap();
    let left = limited(Left.get(&limiter).await).rule;
    let right = limited(Right.get(&limiter).await).rule;
    assert_eq!(left, Some(concat!(module_path!(), "::get")));
    assert_eq!(right, left);
    Left.put(&limiter).await.unwrap();
    Right.put(&limiter).await.unwrap();
    assert_eq!(limited(Left.put(&limiter).await).rule, Some("left_put"));
    assert_eq!(limited(Right.put(&limiter).await).rule, Some("right_put"));
}

#[rate_limit(key = "shadow-macro:<x>", capacity = 100, rate = 1, limiter = limiter, refund_on = err)]
async fn shadowing_macros(limiter: &Limiter, x: u32) -> Result<(u32, u32, u32), AppError> {
    fn before() -> u32 {
        ten()
    }
    fn ten() -> u32 {
        10
    }
    macro_rules! m {
        () => {
            1
        };
    }
    let a = m!();
    macro_rules! m {
        () => {
            2
        };
    }
    let b = m!();
    // Sees the second `m` only where it is written, after it.
    fn after() -> u32 {
        m!()
    }
    Ok((a + x, b, after() + before()))
}

/// With `refund_on` the body runs in an async block; it means what it
/// means without: a `macro_rules!` that shadows another takes effect where
/// it is written, and an item after it sees it. The body's items were
/// moved above its statements, so both `m!()` gave the second `m`.
#[tokio::test]
async fn refund_on_keeps_the_bodys_macros_in_order() {
    let (limiter, _) = manual_limiter();
    assert_eq!(shadowing_macros(&limiter, 0).await, Ok((1, 2, 12)));
}

#[rate_limit(key = "moved:<name>", capacity = 5, rate = 1, limiter = limiter)]
async fn takes_ownership(limiter: &Limiter, name: String) -> Result<String, AppError> {
    // The key was built before the body; the body may move the argument.
    let owned = name;
    Ok(owned)
}

#[tokio::test]
async fn the_body_may_move_arguments_and_the_future_is_send() {
    let (limiter, _) = manual_limiter();
    fn assert_send<T: Send>(t: T) -> T {
        t
    }
    let out = assert_send(takes_ownership(&limiter, "zoe".to_string())).await;
    assert_eq!(out, Ok("zoe".to_string()));
    let handle = tokio::spawn(async move { takes_ownership(&limiter, "max".into()).await });
    assert_eq!(handle.await.unwrap(), Ok("max".into()));
}

static LEAKY_STARTS: std::sync::Mutex<Vec<std::time::Instant>> = std::sync::Mutex::new(Vec::new());

#[rate_limit(key = "paced", algorithm = leaky_bucket, capacity = 3, rate = "10/s", limiter = limiter)]
async fn paced(limiter: &Limiter) -> Result<(), AppError> {
    LEAKY_STARTS.lock().unwrap().push(std::time::Instant::now());
    Ok(())
}

#[tokio::test]
async fn the_leaky_bucket_runs_queued_bodies_at_its_pace() {
    let limiter = Limiter::memory();
    let interval = Duration::from_millis(100);
    // Every call is made after `t0`, so the k-th body's turn is at least
    // k intervals after it: a late timer only makes a body later, while a
    // body run ahead of its turn is still caught.
    let t0 = std::time::Instant::now();
    let calls: Vec<_> = (0..4).map(|_| paced(&limiter)).collect();
    let results = futures::future::join_all(calls).await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 3, "the queue holds three: {results:?}");
    let mut starts = LEAKY_STARTS.lock().unwrap().clone();
    starts.sort();
    assert_eq!(starts.len(), 3, "one body per admitted call");
    for (k, start) in starts.iter().enumerate() {
        // A millisecond for the limiter's clock and the timer's rounding.
        let turn = (interval * k as u32).saturating_sub(Duration::from_millis(1));
        assert!(
            *start >= t0 + turn,
            "body {k} started {:?} after the calls were made, before its turn at 10/s",
            *start - t0
        );
    }
}

#[rate_limit(key = "daily:<user>", algorithm = fixed_window, limit = 2, window = "1d", limiter = limiter)]
async fn daily(limiter: &Limiter, user: u32) -> Result<(), AppError> {
    Ok(())
}

#[rate_limit(key = "log:<user>", algorithm = sliding_log, limit = 1, window = "1m", limiter = limiter)]
#[rate_limit(key = "sw:<user>", algorithm = sliding_window, limit = 5, window = "10s", limiter = limiter)]
#[rate_limit(key = "gcra:<user>", algorithm = gcra, capacity = 5, rate = "1/min", limiter = limiter)]
async fn windowed(limiter: &Limiter, user: u32) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn window_algorithms_take_a_limit_per_window() {
    let (limiter, clock) = manual_limiter();
    daily(&limiter, 1).await.unwrap();
    daily(&limiter, 1).await.unwrap();
    let denied = limited(daily(&limiter, 1).await);
    assert_eq!(denied.limit, 2);
    assert!(denied.retry_after <= Duration::from_secs(86_400));
    windowed(&limiter, 1).await.unwrap();
    let denied = limited(windowed(&limiter, 1).await);
    assert_eq!(denied.key, "log:1");
    assert_eq!(denied.retry_after, Duration::from_secs(60));
    clock.advance(Duration::from_secs(60));
    windowed(&limiter, 1).await.unwrap();
}

#[rate_limit(key = "job:<tenant>", capacity = 1, rate = "5/s", on_limit = wait(max = "2s"), limiter = limiter)]
async fn patient(limiter: &Limiter, tenant: u32) -> Result<(), AppError> {
    Ok(())
}

#[rate_limit(key = "job2:<tenant>", capacity = 1, rate = "1/min", on_limit = wait(max = "50ms"), limiter = limiter)]
async fn impatient(limiter: &Limiter, tenant: u32) -> Result<(), AppError> {
    Ok(())
}

#[tokio::test]
async fn on_limit_wait_sleeps_for_retry_after_and_gives_up_past_max() {
    let limiter = Limiter::memory();
    // One token at 5/s: each of three calls waits ~200 ms for the next token
    // (a stall between calls would have to last that long to spare a wait).
    for _ in 0..3 {
        patient(&limiter, 1).await.unwrap();
    }
    assert_eq!(limiter.stats().allowed, 3);
    assert!(
        limiter.stats().denied >= 2,
        "the waits came from denials: {:?}",
        limiter.stats()
    );
    impatient(&limiter, 1).await.unwrap();
    // The next token is a minute away, past the 50 ms the call may wait: it
    // returns the denial at once rather than sleeping.
    let denied = limited(impatient(&limiter, 1).await);
    assert!(denied.retry_after > Duration::from_secs(50));
}

#[rate_limit(key = "unpaced", algorithm = leaky_bucket, capacity = 3, rate = "1/s", limiter = limiter)]
async fn unpaced(limiter: &Limiter) -> Result<(), AppError> {
    Ok(())
}

/// Outside a Tokio runtime (here `futures`' executor, with the memory
/// backend, which needs none) nothing can sleep: a leaky bucket's call
/// admitted for later is denied, its turn given back, and `on_limit = wait`
/// returns its denial at once; neither panics in Tokio's sleep.
#[test]
fn calls_that_would_sleep_outside_a_tokio_runtime_are_denied() {
    // The manual clock stands still between the calls, so each denial's
    // retry_after is exact however slowly the thread runs.
    let (limiter, _clock) = manual_limiter();
    futures::executor::block_on(async {
        unpaced(&limiter).await.unwrap();
        for _ in 0..3 {
            let denied = limited(unpaced(&limiter).await);
            assert_eq!(denied.cause, DenialCause::Quota);
            assert_eq!(denied.key, "unpaced");
            assert!(
                denied.retry_after > Duration::from_millis(900)
                    && denied.retry_after <= Duration::from_secs(1),
                "one turn away, as the turn was given back: {denied:?}"
            );
        }
        impatient(&limiter, 2).await.unwrap();
        let denied = limited(impatient(&limiter, 2).await);
        assert!(denied.retry_after > Duration::from_secs(50));
        patient(&limiter, 2).await.unwrap();
        let denied = limited(patient(&limiter, 2).await);
        assert!(
            denied.retry_after <= Duration::from_millis(200),
            "{denied:?}"
        );
    });
}

#[rate_limit(key = "shadow:<user>", capacity = 1, rate = "1/min", mode = shadow, limiter = limiter)]
async fn shadowed(limiter: &Limiter, user: u32) -> Result<u32, AppError> {
    Ok(user)
}

#[tokio::test]
async fn shadow_mode_counts_denials_but_never_denies() {
    let limiter = Limiter::memory();
    for _ in 0..5 {
        assert_eq!(shadowed(&limiter, 9).await, Ok(9));
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.allowed, stats.shadow_denied, stats.denied),
        (1, 4, 0),
        "{stats:?}"
    );
}

#[rate_limit(rule = "export_report", key = "export:<user>", capacity = 2, rate = "1/h", limiter = limiter)]
async fn export_report(limiter: &Limiter, user: u32) -> Result<u32, AppError> {
    Ok(user)
}

/// Calls admitted in a row on a fresh key (the quotas here refill hourly).
async fn admitted<F: std::future::Future<Output = Result<u32, AppError>>>(
    mut call: impl FnMut() -> F,
) -> usize {
    let mut admitted = 0;
    while call().await.is_ok() {
        admitted += 1;
        assert!(admitted <= 100, "no limit applied");
    }
    admitted
}

#[tokio::test]
async fn a_named_rule_set_at_run_time_applies_from_the_next_call() {
    let limiter = Limiter::memory();
    assert_eq!(
        admitted(|| export_report(&limiter, 1)).await,
        2,
        "the attribute's numbers apply while the rule is not set"
    );
    limiter
        .rules()
        .set_text("export_report", "capacity=5 rate=1/h")
        .unwrap();
    assert_eq!(admitted(|| export_report(&limiter, 2)).await, 5);
    // Any algorithm, and the denial names the rule.
    limiter.rules().set(
        "export_report",
        ratelimit::Quota::fixed_window(3, Duration::from_secs(3_600)).unwrap(),
    );
    assert_eq!(admitted(|| export_report(&limiter, 3)).await, 3);
    let denied = limited(export_report(&limiter, 3).await);
    assert_eq!(denied.rule, Some("export_report"));
    assert_eq!(denied.limit, 3);
    // Removed: back to the attribute's numbers.
    limiter.rules().remove("export_report");
    assert_eq!(admitted(|| export_report(&limiter, 4)).await, 2);
    // Rules belong to their limiter (and its clones).
    let other = Limiter::memory();
    other
        .rules()
        .set_text("export_report", "capacity=9 rate=1/h")
        .unwrap();
    assert_eq!(admitted(|| export_report(&limiter, 5)).await, 2);
    let clone = other.clone();
    assert_eq!(admitted(|| export_report(&clone, 5)).await, 9);
}

/// A named rule that moved a key to another algorithm keeps its state
/// under `key~<algorithm>`; the denial names the key as written, and a
/// reset of that key (as an operator's tool makes it) gives the quota back.
/// It deleted nothing before, and the next call was denied.
#[tokio::test]
async fn a_reset_of_a_denied_key_applies_whatever_algorithm_a_rule_moved_it_to() {
    let limiter = Limiter::memory();
    limiter.rules().set(
        "export_report",
        ratelimit::Quota::fixed_window(3, Duration::from_secs(3_600)).unwrap(),
    );
    assert_eq!(admitted(|| export_report(&limiter, 7)).await, 3);
    let denied = limited(export_report(&limiter, 7).await);
    assert_eq!(denied.key, "export:7");
    limiter.reset(&denied.key).await.unwrap();
    assert_eq!(
        admitted(|| export_report(&limiter, 7)).await,
        3,
        "the reset gave the key its quota back"
    );
}

struct Account {
    id: u32,
    vip: bool,
    admin: bool,
}

static NORMAL: std::sync::LazyLock<ratelimit::Quota> =
    std::sync::LazyLock::new(|| ratelimit::Quota::new(2, "1/h".parse().unwrap()).unwrap());
static VIP: std::sync::LazyLock<ratelimit::Quota> =
    std::sync::LazyLock::new(|| ratelimit::Quota::new(6, "1/h".parse().unwrap()).unwrap());

fn tier_quota(account: &Account) -> &'static ratelimit::Quota {
    if account.vip {
        &VIP
    } else {
        &NORMAL
    }
}

static TIERED_BODY: AtomicU32 = AtomicU32::new(0);

#[rate_limit(key = "tiered:<account.id>", quota = tier_quota(&account), exempt = account.admin, limiter = limiter)]
async fn tiered(limiter: &Limiter, account: Account) -> Result<u32, AppError> {
    TIERED_BODY.fetch_add(1, Ordering::SeqCst);
    // The key and the quota were taken from references: the body owns the account.
    let owned = account;
    Ok(owned.id)
}

#[tokio::test]
async fn a_per_call_quota_gives_each_tier_its_own_limit() {
    let (limiter, _) = manual_limiter();
    let account = |id, vip| Account {
        id,
        vip,
        admin: false,
    };
    assert_eq!(admitted(|| tiered(&limiter, account(1, false))).await, 2);
    assert_eq!(admitted(|| tiered(&limiter, account(2, true))).await, 6);
    let denied = limited(tiered(&limiter, account(2, true)).await);
    assert_eq!((denied.key.as_str(), denied.limit), ("tiered:2", 6));
}

#[tokio::test]
async fn an_exempt_call_runs_its_body_without_asking_the_limiter() {
    let (limiter, _) = manual_limiter();
    let before = TIERED_BODY.load(Ordering::SeqCst);
    for _ in 0..20 {
        let admin = Account {
            id: 7,
            vip: false,
            admin: true,
        };
        assert_eq!(tiered(&limiter, admin).await, Ok(7));
    }
    assert!(TIERED_BODY.load(Ordering::SeqCst) - before >= 20);
    let stats = limiter.stats();
    assert_eq!(
        (stats.allowed, stats.denied),
        (0, 0),
        "exempt calls make no decision: {stats:?}"
    );
    // The same account, not exempt, is limited as usual.
    let normal = || Account {
        id: 7,
        vip: false,
        admin: false,
    };
    assert_eq!(admitted(|| tiered(&limiter, normal())).await, 2);
}

#[rate_limit(key = "stack-ex:user:<user>", capacity = 1, rate = "1/h", exempt = user == 0, limiter = limiter)]
#[rate_limit(rule = "stack_global", key = "stack-ex:global", capacity = 3, rate = "1/h", limiter = limiter)]
async fn stacked_exempt(limiter: &Limiter, user: u32) -> Result<u32, AppError> {
    Ok(user)
}

#[tokio::test]
async fn stacked_attributes_exempt_and_resolve_rules_each_on_its_own() {
    let limiter = Limiter::memory();
    // User 0 skips the per-user limit, not the global one.
    assert_eq!(admitted(|| stacked_exempt(&limiter, 0)).await, 3);
    let denied = limited(stacked_exempt(&limiter, 0).await);
    assert_eq!(
        (denied.key.as_str(), denied.rule),
        ("stack-ex:global", Some("stack_global"))
    );
    // All or nothing: the global limit denies user 1, whose own bucket is
    // left untouched.
    let denied = limited(stacked_exempt(&limiter, 1).await);
    assert_eq!(denied.key, "stack-ex:global");
    let per_user = ratelimit::Quota::new(1, "1/h".parse().unwrap()).unwrap();
    let user1 = limiter
        .inspect(&per_user, "stack-ex:user:1", 0)
        .await
        .unwrap();
    assert_eq!(user1.remaining, 1);
    // Each attribute looks up its own rule.
    let raised = Limiter::memory();
    raised
        .rules()
        .set_text("stack_global", "capacity=5 rate=1/h")
        .unwrap();
    assert_eq!(admitted(|| stacked_exempt(&raised, 0)).await, 5);
}

#[rate_limit(key = "partner:<id>", capacity = 2, rate = "1/h", limiter = limiter, refund_on = err)]
async fn only_successes_count(limiter: &Limiter, id: u64, fail: bool) -> Result<u64, AppError> {
    if fail {
        Err(AppError::NotFound)?;
    }
    Ok(id)
}

#[rate_limit(key = "login:<user>", capacity = 2, rate = "1/h", limiter = limiter, refund_on = ok)]
async fn only_failures_count(limiter: &Limiter, user: &str, fail: bool) -> Result<(), AppError> {
    if fail {
        return Err(AppError::NotFound);
    }
    Ok(())
}

#[tokio::test]
async fn refund_on_counts_only_the_outcome_it_keeps() {
    let (limiter, _clock) = manual_limiter();
    for _ in 0..10 {
        assert_eq!(
            only_successes_count(&limiter, 7, true).await,
            Err(AppError::NotFound),
            "failures are given back"
        );
    }
    assert_eq!(only_successes_count(&limiter, 7, false).await, Ok(7));
    assert_eq!(only_successes_count(&limiter, 7, false).await, Ok(7));
    let denied = limited(only_successes_count(&limiter, 7, false).await);
    assert_eq!(denied.key, "partner:7");

    for _ in 0..10 {
        assert_eq!(only_failures_count(&limiter, "ann", false).await, Ok(()));
    }
    assert_eq!(
        only_failures_count(&limiter, "ann", true).await,
        Err(AppError::NotFound)
    );
    assert_eq!(
        only_failures_count(&limiter, "ann", true).await,
        Err(AppError::NotFound)
    );
    limited(only_failures_count(&limiter, "ann", false).await);
    assert_eq!(limiter.stats().refunded, 20);
}

#[rate_limit(key = "slow", capacity = 2, rate = "1/h", limiter = limiter, refund_on = err)]
async fn slow_failure(limiter: &Limiter) -> Result<(), AppError> {
    tokio::task::yield_now().await;
    Err(AppError::NotFound)
}

#[tokio::test]
async fn a_call_dropped_in_its_body_keeps_its_admission() {
    let (limiter, _clock) = manual_limiter();
    // Polled once: admitted, then dropped at the body's first await. No
    // outcome, so nothing is given back.
    for _ in 0..2 {
        let mut call = std::pin::pin!(slow_failure(&limiter));
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(call.as_mut().poll(&mut cx).is_pending());
    }
    limited(slow_failure(&limiter).await);
    assert_eq!(limiter.stats().refunded, 0);
}
