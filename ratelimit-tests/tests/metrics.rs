//! The metrics a Prometheus exporter reads equal what the limiter did.
//! One test in this binary: the metrics recorder is process-wide.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use ratelimit::{rate_limit, FailurePolicy, Limiter, Quota, RateLimited, Request};
use support::RedisServer;

#[rate_limit(key = "search:<user>", capacity = 3, rate = "1/min", limiter = limiter)]
async fn search(limiter: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

#[rate_limit(key = "export:<user>", capacity = 1, rate = "1/h", mode = shadow, limiter = limiter)]
async fn export(limiter: &Limiter, user: u32) -> Result<(), RateLimited> {
    Ok(())
}

/// `name{labels} value` lines of the exposition, keyed by `name{labels}`.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn decisions(samples: &HashMap<String, f64>, rule_suffix: &str, outcome: &str) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| {
            series.starts_with("ratelimit_decisions_total{")
                && series.contains(&format!("outcome=\"{outcome}\""))
                && series
                    .split("rule=\"")
                    .nth(1)
                    .and_then(|r| r.split('"').next())
                    .is_some_and(|rule| rule.ends_with(rule_suffix))
        })
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test]
async fn exported_counters_equal_what_the_limiter_did() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("install the recorder");
    let memory = Limiter::memory();
    for user in 0..2 {
        for _ in 0..5 {
            let _ = search(&memory, user).await;
            let _ = export(&memory, user).await;
        }
    }
    // Refunds, under a rule name made at run time (leaked, as rules are
    // `&'static str`), so the counter's key is not a literal.
    let uploads: &'static str = Box::leak(format!("uploads-{}", 7).into_boxed_str());
    let per_file = Quota::per_minute(10).unwrap();
    for _ in 0..3 {
        let admitted = memory
            .check(Request::new(&per_file, "file:1").rule(uploads))
            .await
            .unwrap();
        memory.refund(admitted).await.unwrap();
    }

    // More rule names than the limiter keeps metric keys for (4,096): each
    // is still counted under its own name, past the bound as before it.
    let many: Vec<&'static str> = (0..5_000)
        .map(|i| &*Box::leak(format!("many-{i}").into_boxed_str()))
        .collect();
    let generous = Quota::per_second(1_000_000).unwrap();
    for (i, rule) in many.iter().enumerate() {
        for _ in 0..=i % 2 {
            memory
                .check(Request::new(&generous, "many").rule(rule))
                .await
                .unwrap();
        }
    }

    let mut server = RedisServer::start();
    // Redis's answers before the kill, refused connections after it: no
    // call here is meant to time out.
    let closed = Limiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(2))
        .failure_policy(FailurePolicy::Closed)
        .build()
        .unwrap();
    let quota = Quota::per_second(100).unwrap();
    for _ in 0..4 {
        closed
            .check(Request::new(&quota, "merchant:1").rule("payments"))
            .await
            .unwrap();
    }
    server.kill();
    for _ in 0..6 {
        closed
            .check(Request::new(&quota, "merchant:1").rule("payments"))
            .await
            .unwrap_err();
    }

    let text = handle.render();
    let s = samples(&text);
    let check = |rule: &str, outcome: &str, expected: f64| {
        assert_eq!(
            decisions(&s, rule, outcome),
            expected,
            "{rule} {outcome} in:\n{text}"
        );
    };
    check("::search", "allowed", 6.0);
    check("::search", "denied", 4.0);
    check("::export", "allowed", 2.0);
    check("::export", "shadow_denied", 8.0);
    check("payments", "allowed", 4.0);
    check("uploads-7", "allowed", 3.0);
    for i in [0, 1, 4_094, 4_095, 4_998, 4_999] {
        let series = format!("ratelimit_decisions_total{{rule=\"many-{i}\",outcome=\"allowed\"}}");
        assert_eq!(
            s.get(&series),
            Some(&((1 + i % 2) as f64)),
            "rule many-{i} of 5,000 is counted under its own name"
        );
    }
    assert_eq!(
        s.keys()
            .filter(|series| series.contains("rule=\"many-"))
            .count(),
        5_000
    );
    assert_eq!(
        s.get("ratelimit_refunds_total{rule=\"uploads-7\"}"),
        Some(&3.0),
        "refunds are counted per rule:\n{text}"
    );
    assert_eq!(memory.stats().refunded, 3);
    check("payments", "fallback_denied", 6.0);
    assert_eq!(closed.stats().fallback_denied, 6);
    // Each call Redis answered, at least, under the backend's label.
    let timed = s
        .get("ratelimit_backend_latency_seconds_count{backend=\"redis\"}")
        .copied()
        .unwrap_or(0.0);
    assert!(
        timed >= 4.0,
        "the backend latency histogram counts Redis's calls by backend:\n{text}"
    );
    assert!(
        s.iter()
            .any(|(series, v)| series.starts_with("ratelimit_circuit_state{") && *v == 1.0),
        "the breaker opened after the failures:\n{text}"
    );
}
