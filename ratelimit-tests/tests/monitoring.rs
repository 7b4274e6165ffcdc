//! `monitoring/`: the Grafana dashboard and the Prometheus alerts ask only
//! for metrics, labels and label values the limiter's exporter emits, and
//! the alerts pass `promtool` (their syntax, and their unit tests in
//! `monitoring/alerts.test.yml`).
//!
//! The emitted names come from a real run: a limiter driven through allowed,
//! denied, shadow-denied, cached, fallback and circuit-open decisions with
//! `metrics-exporter-prometheus` installed, as `ratelimit-tests/tests/metrics.rs` does, and
//! its rendered text read back. One test installs the recorder, which is
//! process-wide.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use ratelimit::{FailurePolicy, Limiter, Quota, Request};
use serde_json::Value;
use support::RedisServer;

const DASHBOARD: &str = include_str!("../../monitoring/grafana-dashboard.json");
const ALERTS: &str = include_str!("../../monitoring/alerts.yml");

/// Labels a Prometheus scrape adds to every series, which no exporter emits.
const SCRAPE_LABELS: [&str; 2] = ["job", "instance"];

/// What the exporter rendered: metric name, then label name, then the
/// values seen.
type Emitted = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// Drives limiters through every kind of decision and returns what the
/// exporter rendered.
async fn emitted_by_a_real_run() -> (Emitted, String) {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");

    let memory = Limiter::memory();
    let one = Quota::new(1, "1/h".parse().unwrap()).unwrap();
    memory
        .check(Request::new(&one, "user:1").rule("search"))
        .await
        .expect("the first call is allowed");
    memory
        .check(Request::new(&one, "user:1").rule("search"))
        .await
        .expect_err("the second is denied");
    for call in 0..2 {
        let admitted = memory
            .check(
                Request::new(&one, "user:1:export")
                    .rule("export")
                    .shadow(true),
            )
            .await
            .expect("shadow mode never denies");
        assert_eq!(
            admitted.would_deny().is_some(),
            call == 1,
            "the first call spends the quota of one"
        );
    }

    let mut server = RedisServer::start();
    let build = |policy| {
        // Redis's answers before the kill, refused connections after it:
        // no call here is meant to time out.
        Limiter::builder()
            .redis(server.url())
            .timeout(Duration::from_secs(2))
            .failure_policy(policy)
            .build()
            .expect("a Redis limiter")
    };
    let closed = build(FailurePolicy::Closed);
    let open = build(FailurePolicy::Open);
    closed
        .check(Request::new(&one, "merchant:1").rule("payments"))
        .await
        .expect("allowed by Redis");
    for _ in 0..2 {
        // Denied by Redis, then by the deny cache with no Redis call.
        closed
            .check(Request::new(&one, "merchant:1").rule("payments"))
            .await
            .expect_err("denied");
    }
    assert!(closed.stats().denied_from_cache >= 1, "a deny cache hit");

    server.kill();
    for _ in 0..10 {
        closed
            .check(Request::new(&one, "merchant:2").rule("payments"))
            .await
            .expect_err("a closed policy denies while Redis is down");
        open.check(Request::new(&one, "merchant:2").rule("catalog"))
            .await
            .expect("an open policy admits while Redis is down");
    }
    // A check that names one key twice can never be decided: an `error`.
    let twice = [
        Request::new(&one, "merchant:3"),
        Request::new(&one, "merchant:3"),
    ];
    open.check(twice)
        .await
        .expect_err("a key named twice is denied");
    assert!(closed.stats().fallback_denied > 0 && open.stats().fallback_allowed > 0);
    assert!(
        open.stats().errors > 0,
        "the key named twice is counted as an error"
    );

    let text = handle.render();
    (parse_exposition(&text), text)
}

/// The samples of a Prometheus text exposition, by name and label.
fn parse_exposition(text: &str) -> Emitted {
    let mut emitted = Emitted::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = emitted.entry(line[..name_end].to_owned()).or_default();
        if line[name_end..].starts_with('{') {
            let (matchers, _) = read_matchers(line, name_end);
            for (label, _, value) in matchers {
                labels.entry(label).or_default().insert(value);
            }
        }
    }
    emitted
}

/// A series selector of a PromQL expression: a metric name and its label
/// matchers (`label`, `op`, `value`).
#[derive(Debug, PartialEq)]
struct Selector {
    metric: String,
    matchers: Vec<(String, String, String)>,
}

/// Aggregation operators, which take `by (...)` or `without (...)` after
/// them as well as before the parenthesis.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Keywords followed by a list of label names.
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset", "atan2"];

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// The index just past the string starting at `start`.
fn skip_string(b: &[u8], start: usize) -> usize {
    let quote = b[start];
    let mut i = start + 1;
    while i < b.len() && b[i] != quote {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// The index just past the first `close` from `start`, outside strings.
fn skip_past(b: &[u8], start: usize, close: u8) -> usize {
    let mut i = start + 1;
    while i < b.len() && b[i] != close {
        i = if matches!(b[i], b'"' | b'\'' | b'`') {
            skip_string(b, i)
        } else {
            i + 1
        };
    }
    i + 1
}

/// The matchers of the `{...}` at `start`, and the index past it.
fn read_matchers(text: &str, start: usize) -> (Vec<(String, String, String)>, usize) {
    let b = text.as_bytes();
    let end = skip_past(b, start, b'}');
    let mut matchers = Vec::new();
    let mut i = start + 1;
    while i < end - 1 {
        while i < end && (b[i].is_ascii_whitespace() || b[i] == b',') {
            i += 1;
        }
        let label_start = i;
        while i < end && is_ident(b[i]) {
            i += 1;
        }
        if label_start == i {
            break;
        }
        let label = text[label_start..i].to_owned();
        while b[i].is_ascii_whitespace() {
            i += 1;
        }
        let op_start = i;
        while matches!(b[i], b'=' | b'!' | b'~') {
            i += 1;
        }
        let op = text[op_start..i].to_owned();
        while b[i].is_ascii_whitespace() {
            i += 1;
        }
        let value_end = skip_string(b, i);
        let value = text[i + 1..value_end - 1].replace("\\\"", "\"");
        matchers.push((label, op, value));
        i = value_end;
    }
    (matchers, end)
}

/// Every series selector of a PromQL expression. Grafana's `$variables`
/// and `[$__rate_interval]` ranges are skipped, as Grafana replaces them.
fn selectors(expr: &str) -> Vec<Selector> {
    let b = expr.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => i = skip_string(b, i),
            b'[' => i = skip_past(b, i, b']'),
            b'{' => {
                let (matchers, end) = read_matchers(expr, i);
                found.push(Selector {
                    metric: String::new(),
                    matchers,
                });
                i = end;
            }
            // Numbers and durations (`0.99`, `5m`), and Grafana variables.
            c if c.is_ascii_digit() || c == b'$' => {
                i += 1;
                while i < b.len() && (is_ident(b[i]) || b[i] == b'.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let mut next = i;
                while next < b.len() && b[next].is_ascii_whitespace() {
                    next += 1;
                }
                if GROUPING.contains(&word) {
                    if b.get(next) == Some(&b'(') {
                        i = skip_past(b, next, b')');
                    }
                    continue;
                }
                if KEYWORDS.contains(&word)
                    || AGGREGATIONS.contains(&word)
                    || b.get(next) == Some(&b'(')
                {
                    continue;
                }
                let matchers = if b.get(next) == Some(&b'{') {
                    let (matchers, end) = read_matchers(expr, next);
                    i = end;
                    matchers
                } else {
                    Vec::new()
                };
                found.push(Selector {
                    metric: word.to_owned(),
                    matchers,
                });
            }
            _ => i += 1,
        }
    }
    found
}

/// What in `expr` the exporter does not emit: metrics, label names, and
/// literal label values (`outcome="denied"`, each of `outcome=~"a|b"`).
fn unknown_in(expr: &str, emitted: &Emitted) -> Vec<String> {
    let mut unknown = Vec::new();
    for selector in selectors(expr) {
        let Some(labels) = emitted.get(&selector.metric) else {
            unknown.push(format!("metric `{}`", selector.metric));
            continue;
        };
        for (label, op, value) in &selector.matchers {
            if SCRAPE_LABELS.contains(&label.as_str()) {
                continue;
            }
            let Some(values) = labels.get(label) else {
                unknown.push(format!("label `{label}` of `{}`", selector.metric));
                continue;
            };
            let literal = !value.contains('$')
                && value
                    .bytes()
                    .all(|b| is_ident(b) || matches!(b, b'.' | b'-' | b'|'));
            if !literal || !matches!(op.as_str(), "=" | "=~") {
                continue;
            }
            let alternatives: Vec<&str> = if op == "=~" {
                value.split('|').collect()
            } else {
                vec![value.as_str()]
            };
            for alternative in alternatives {
                if !values.contains(alternative) {
                    unknown.push(format!(
                        "`{label}=\"{alternative}\"` of `{}`",
                        selector.metric
                    ));
                }
            }
        }
    }
    unknown
}

/// The dashboard's PromQL: every panel target's `expr`, and the metric
/// selector of every `label_values(<selector>, <label>)` variable with its
/// label as a matcher of any value.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    fn walk(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(expr)) = map.get("expr") {
                    out.push(expr.clone());
                }
                for value in map.values() {
                    walk(value, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("a list of panels") {
        walk(panel, &mut queries);
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("a list of variables")
    {
        let Some(query) = variable["query"]["query"].as_str() else {
            continue;
        };
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("an unexpected variable query `{query}`"));
        let (selector, label) = inner.rsplit_once(',').expect("label_values(metric, label)");
        let label = label.trim();
        // The label as a matcher, so it is checked like the others.
        let selector = match selector.trim().strip_suffix('}') {
            Some(open) => format!("{open}, {label}=~\"$any\"}}"),
            None => format!("{}{{{label}=~\"$any\"}}", selector.trim()),
        };
        queries.push(selector);
    }
    queries
}

/// The `expr` of every rule of `monitoring/alerts.yml`, read from the
/// subset of YAML the file uses: `expr: <one line>` or a `expr: |` block.
/// `promtool check rules` validates the whole file, and its count of rules
/// is checked against this reading.
fn alert_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut exprs = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        i += 1;
        let Some(value) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if !value.starts_with('|') && !value.starts_with('>') {
            exprs.push(value.to_owned());
            continue;
        }
        let mut block = Vec::new();
        while i < lines.len() {
            let next = lines[i];
            let next_indent = next.len() - next.trim_start().len();
            if !next.trim().is_empty() && next_indent <= indent {
                break;
            }
            block.push(next.trim());
            i += 1;
        }
        exprs.push(block.join(" ").trim().to_owned());
    }
    exprs
}

#[test]
fn the_promql_reader_finds_every_selector() {
    let found = selectors(
        r#"sum by (rule, outcome) (rate(ratelimit_decisions_total{job=~"$job", outcome=~"denied|fallback_denied"}[$__rate_interval])) / ignoring (outcome) group_left max(up) > 0.2 and on (job) x_total offset 5m"#,
    );
    let names: Vec<&str> = found.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(names, ["ratelimit_decisions_total", "up", "x_total"]);
    assert_eq!(
        found[0].matchers,
        [
            ("job".into(), "=~".into(), "$job".into()),
            (
                "outcome".into(),
                "=~".into(),
                "denied|fallback_denied".into()
            )
        ]
    );

    // Names, labels and values the exporter does not emit are reported.
    let emitted = parse_exposition(
        "# TYPE ratelimit_decisions_total counter\n\
         ratelimit_decisions_total{rule=\"a\",outcome=\"denied\"} 1\n",
    );
    assert!(unknown_in(
        r#"rate(ratelimit_decisions_total{outcome="denied"}[5m])"#,
        &emitted
    )
    .is_empty());
    assert_eq!(
        unknown_in(
            r#"rate(ratelimit_decision_total[5m]) + ratelimit_decisions_total{outcome=~"denied|fallback_deny", rules="x"}"#,
            &emitted
        ),
        [
            "metric `ratelimit_decision_total`",
            "`outcome=\"fallback_deny\"` of `ratelimit_decisions_total`",
            "label `rules` of `ratelimit_decisions_total`",
        ]
    );
    assert_eq!(
        alert_exprs(
            "- alert: A\n  expr: up > 0\n- alert: B\n  expr: |\n    a\n      or b\n  for: 1m\n"
        ),
        ["up > 0", "a or b"]
    );
}

#[tokio::test]
async fn the_dashboard_and_the_alerts_ask_only_for_what_the_exporter_emits() {
    let (emitted, text) = emitted_by_a_real_run().await;
    for metric in [
        "ratelimit_decisions_total",
        "ratelimit_backend_latency_seconds",
        "ratelimit_backend_latency_seconds_sum",
        "ratelimit_backend_latency_seconds_count",
        "ratelimit_circuit_state",
        "ratelimit_deny_cache_hits_total",
    ] {
        assert!(
            emitted.contains_key(metric),
            "the run emitted `{metric}`:\n{text}"
        );
    }
    assert!(
        text.contains("# TYPE ratelimit_backend_latency_seconds summary"),
        "the exporter renders the latency as a summary, which the PromQL assumes; \
         if it is a histogram now, use histogram_quantile over `_bucket`:\n{text}"
    );
    let outcomes = &emitted["ratelimit_decisions_total"]["outcome"];
    for outcome in [
        "allowed",
        "denied",
        "shadow_denied",
        "fallback_allowed",
        "fallback_denied",
        "error",
    ] {
        assert!(outcomes.contains(outcome), "outcome {outcome}:\n{text}");
    }
    assert!(
        emitted["ratelimit_circuit_state"].contains_key("backend"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("ratelimit_circuit_state{") && l.ends_with(" 1")),
        "the circuit opened:\n{text}"
    );

    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let queries = dashboard_queries(&dashboard);
    let alerts = alert_exprs(ALERTS);
    assert_eq!(
        alerts.len(),
        ALERTS.matches("- alert:").count(),
        "one expr read per alert"
    );
    let mut used = BTreeSet::new();
    for (file, expr) in queries
        .iter()
        .map(|q| ("monitoring/grafana-dashboard.json", q))
        .chain(alerts.iter().map(|q| ("monitoring/alerts.yml", q)))
    {
        let found = selectors(expr);
        assert!(!found.is_empty(), "{file}: no metric in `{expr}`");
        used.extend(found.into_iter().map(|s| s.metric));
        let unknown = unknown_in(expr, &emitted);
        assert!(
            unknown.is_empty(),
            "{file}: `{expr}` asks for {unknown:?}, which the exporter does not emit; \
             it emitted:\n{text}"
        );
    }
    for metric in emitted.keys() {
        assert!(
            used.contains(metric),
            "`{metric}` is emitted but neither shown nor alerted on"
        );
    }

    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for subject in [
        "by outcome per rule",
        "Denial share",
        "Fallbacks",
        "Circuit breaker",
        "latency percentiles",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(subject)),
            "a panel on {subject}: {titles:?}"
        );
    }
    for alert in [
        "RateLimitFallbacks",
        "RateLimitCircuitOpen",
        "RateLimitBackendSlow",
        "RateLimitDenialShareHigh",
    ] {
        assert!(ALERTS.contains(&format!("- alert: {alert}\n")), "{alert}");
    }
}

/// The `promtool` to run: the one on `PATH`.
fn promtool() -> PathBuf {
    let binary = PathBuf::from("promtool");
    match Command::new(&binary).arg("--version").output() {
        Ok(out) if out.status.success() => binary,
        Ok(out) => panic!(
            "`promtool --version` failed ({}): {}; reinstall it with `apt-get install prometheus`",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => panic!(
            "`promtool` could not be run ({e}), so monitoring/alerts.yml cannot be checked; \
             apt-get install prometheus (Debian ships promtool in the `prometheus` package; \
             the service need not run), or put Prometheus's promtool on PATH"
        ),
    }
}

fn run_promtool(args: &[&str]) -> String {
    // The workspace root, where `monitoring/` is.
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let out = Command::new(promtool())
        .args(args)
        .current_dir(&dir)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "`promtool {}` failed:\n{text}",
        args.join(" ")
    );
    text
}

#[test]
fn the_alerts_pass_promtool_and_their_unit_tests() {
    let checked = run_promtool(&["check", "rules", "monitoring/alerts.yml"]);
    let rules = alert_exprs(ALERTS).len();
    assert!(
        checked.contains(&format!("SUCCESS: {rules} rules found")),
        "promtool read the {rules} rules this test reads:\n{checked}"
    );
    let tested = run_promtool(&["test", "rules", "monitoring/alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}
