//! `examples/admin.rs`, the operator's command line, run as an operator
//! would against a private Redis.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output};

use ratelimit::Request;
use support::RedisServer;

/// The example's binary, which `cargo test` builds beside the tests.
fn admin() -> PathBuf {
    let deps = std::env::current_exe().expect("the test's own path");
    let binary = deps
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("admin"))
        .expect("the target directory");
    assert!(
        binary.exists(),
        "{} is missing; build it with `cargo build --example admin` (cargo test builds it)",
        binary.display()
    );
    binary
}

fn run(server: &RedisServer, args: &[&str]) -> (Output, String) {
    let out = Command::new(admin())
        .arg("--redis")
        .arg(server.url())
        .args(args)
        .output()
        .expect("run the admin example");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

#[test]
fn an_operator_sets_a_rule_inspects_and_resets_a_key_and_gets_clear_errors() {
    let server = RedisServer::start();
    let (out, text) = run(&server, &["set", "checkout", "capacity=2 rate=1/min"]);
    assert!(out.status.success(), "{text}");
    let (_, text) = run(&server, &["rules"]);
    assert!(
        text.contains("checkout: token_bucket of 2 at 1/min"),
        "{text}"
    );
    for _ in 0..2 {
        let (_, text) = run(&server, &["inspect", "checkout", "cart:7"]);
        assert!(
            text.contains("would be admitted; 1 of 2 remaining"),
            "inspecting consumes nothing: {text}"
        );
    }
    // Spend the key as the service would, then look and give it back.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let limiter = ratelimit::Limiter::builder()
            .redis(server.url())
            .build()
            .unwrap();
        let quota: ratelimit::Quota = "capacity=2 rate=1/min".parse().unwrap();
        limiter
            .check(Request::new(&quota, "cart:7").cost(2))
            .await
            .unwrap();
    });
    let (_, text) = run(&server, &["inspect", "capacity=2 rate=1/min", "cart:7"]);
    assert!(text.contains("would be denied; 0 of 2 remaining"), "{text}");
    let (out, text) = run(&server, &["reset", "cart:7"]);
    assert!(out.status.success(), "{text}");
    let (_, text) = run(&server, &["inspect", "checkout", "cart:7"]);
    assert!(
        text.contains("would be admitted"),
        "after the reset: {text}"
    );

    let (out, text) = run(&server, &["inspect", "nosuch", "cart:7"]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("no rule named `nosuch`"), "{text}");
    let (out, text) = run(&server, &["set", "bad", "capacity=0 rate=1/s"]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("capacity must be greater than 0"), "{text}");
    let (out, text) = run(&server, &["frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("usage:"), "{text}");
    let (out, text) = run(&server, &["remove", "checkout"]);
    assert!(out.status.success() && text.contains("removed"), "{text}");
}
