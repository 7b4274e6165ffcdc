//! What the limiter reports: counters it keeps itself ([`StatsSnapshot`]),
//! and the same events through the `metrics` facade, for whichever exporter
//! the application installs.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `ratelimit_decisions_total` | counter | `rule` (the function's path for the attribute, the [`Request::rule`](crate::Request::rule), or `unnamed`), `outcome`: `allowed`, `denied`, `fallback_allowed`, `fallback_denied`, `shadow_denied`, `error` (a check naming one key twice), `exempt` (a request an HTTP layer's allowlist let through unasked) |
//! | `ratelimit_refunds_total` | counter | `rule`: admissions given back ([`Limiter::refund`](crate::Limiter::refund)), one per limit |
//! | `ratelimit_backend_latency_seconds` | histogram | `backend` |
//! | `ratelimit_backend_errors_total` | counter | `backend`, `kind` ([`ErrorKind::as_str`](crate::ErrorKind::as_str): `timeout`, `unavailable`, `authentication`, `tls`, `permission`, `wrong_server`, ...) |
//! | `ratelimit_circuit_state` | gauge (0 closed, 1 open, 2 half-open) | `backend`; `node` (a master's address) for Redis Cluster, which keeps a breaker per master |
//! | `ratelimit_deny_cache_hits_total` | counter | |

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::breaker::CircuitState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    FallbackAllowed,
    FallbackDenied,
    ShadowDenied,
    Error,
    Exempt,
}

impl Outcome {
    /// This denial as shadow mode counts it: a would-be denial.
    pub(crate) fn shadowed(self, shadow: bool) -> Self {
        if shadow {
            Outcome::ShadowDenied
        } else {
            self
        }
    }

    #[cfg(feature = "metrics")]
    fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::FallbackAllowed => "fallback_allowed",
            Outcome::FallbackDenied => "fallback_denied",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::Error => "error",
            Outcome::Exempt => "exempt",
        }
    }
}

/// Counts of what a [`Limiter`](crate::Limiter) decided, across its clones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Admitted by the backend.
    pub allowed: u64,
    /// Denied by the quota (or for a cost above the capacity).
    pub denied: u64,
    /// Admitted by the failure policy while the backend failed.
    pub fallback_allowed: u64,
    /// Denied by the failure policy while the backend failed.
    pub fallback_denied: u64,
    /// Would have been denied, in shadow mode.
    pub shadow_denied: u64,
    /// Checks that could never be decided as asked (a key named twice):
    /// the caller's mistake, denied and logged as an error.
    pub errors: u64,
    /// Requests let through unasked by an HTTP layer's allowlist.
    pub exempt: u64,
    /// Admissions given back, one per limit ([`Limiter::refund`](crate::Limiter::refund)).
    pub refunded: u64,
    /// Denials answered by the local deny cache, with no backend call (also
    /// counted in `denied`, in `shadow_denied` in shadow mode, or as
    /// decisions by callers of `decide`).
    pub denied_from_cache: u64,
}

impl StatsSnapshot {
    /// Every call the failure policy answered.
    pub fn fallbacks(&self) -> u64 {
        self.fallback_allowed + self.fallback_denied
    }
}

/// Counters striped over cache lines by thread, so threads deciding at once
/// do not contend on one line; a snapshot sums the stripes.
pub(crate) struct Stats {
    stripes: Box<[Stripe]>,
}

const STRIPES: usize = 8;
/// Where `cache_hit` counts, after the outcomes.
const CACHE_HITS: usize = 7;
/// Where `refunded` counts.
const REFUNDS: usize = 8;

#[repr(align(64))]
#[derive(Default)]
struct Stripe {
    counts: [AtomicU64; 9],
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
        }
    }
}

fn stripe_index() -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    INDEX.with(|i| *i)
}

impl Stats {
    pub(crate) fn record(&self, rule: &'static str, outcome: Outcome) {
        self.add(outcome as usize);
        // Direct calls without a rule name share one label value.
        #[cfg(feature = "metrics")]
        {
            let rule = if rule.is_empty() { "unnamed" } else { rule };
            metrics::counter!("ratelimit_decisions_total", "rule" => rule, "outcome" => outcome.label()).increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = rule;
    }

    fn add(&self, counter: usize) {
        self.stripes[stripe_index()].counts[counter].fetch_add(1, Ordering::Relaxed);
    }

    fn total(&self, counter: usize) -> u64 {
        self.stripes
            .iter()
            .map(|s| s.counts[counter].load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn cache_hit(&self) {
        self.add(CACHE_HITS);
        #[cfg(feature = "metrics")]
        metrics::counter!("ratelimit_deny_cache_hits_total").increment(1);
    }

    pub(crate) fn refunded(&self, rule: &'static str) {
        self.add(REFUNDS);
        #[cfg(feature = "metrics")]
        {
            let rule = if rule.is_empty() { "unnamed" } else { rule };
            metrics::counter!("ratelimit_refunds_total", "rule" => rule).increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = rule;
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let get = |o: Outcome| self.total(o as usize);
        StatsSnapshot {
            allowed: get(Outcome::Allowed),
            denied: get(Outcome::Denied),
            fallback_allowed: get(Outcome::FallbackAllowed),
            fallback_denied: get(Outcome::FallbackDenied),
            shadow_denied: get(Outcome::ShadowDenied),
            errors: get(Outcome::Error),
            exempt: get(Outcome::Exempt),
            refunded: self.total(REFUNDS),
            denied_from_cache: self.total(CACHE_HITS),
        }
    }
}

pub(crate) fn backend_latency(backend: &'static str, elapsed: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("ratelimit_backend_latency_seconds", "backend" => backend)
        .record(elapsed.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, elapsed);
}

/// The breaker's state; `node` for a breaker per Redis Cluster master.
pub(crate) fn circuit_state(backend: &'static str, node: Option<&str>, state: CircuitState) {
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, node, state);
    #[cfg(feature = "metrics")]
    match node {
        None => metrics::gauge!("ratelimit_circuit_state", "backend" => backend),
        Some(node) => {
            metrics::gauge!("ratelimit_circuit_state", "backend" => backend, "node" => node.to_owned())
        }
    }
    .set(state as u8 as f64);
}

/// A backend call failed: counted by the fault's kind, so a dashboard tells
/// a misconfiguration from an outage.
pub(crate) fn backend_error(backend: &'static str, kind: crate::ErrorKind) {
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, kind);
    #[cfg(feature = "metrics")]
    metrics::counter!("ratelimit_backend_errors_total", "backend" => backend, "kind" => kind.as_str())
        .increment(1);
}
