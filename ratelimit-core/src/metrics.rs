//! What the limiter reports: counters it keeps itself ([`StatsSnapshot`]),
//! and the same events through the `metrics` facade, for whichever exporter
//! the application installs.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `ratelimit_decisions_total` | counter | `rule` (for the attribute, its `rule = "..."`, else the module path and the function's name, which methods of one name in one module share; the [`Request::rule`](crate::Request::rule); or `unnamed`), `outcome`: `allowed`, `denied`, `fallback_allowed`, `fallback_denied`, `shadow_denied`, `error` (a check naming one key twice), `exempt` (a request an HTTP layer's allowlist let through unasked) |
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
    /// Admissions given back, one per limit ([`Limiter::refund`](crate::Limiter::refund)); a
    /// refund the backend failed, or whose caller gave up before its answer, is not counted.
    pub refunded: u64,
    /// Denials answered by the local deny cache, with no backend call (also
    /// counted in `denied`, or in `shadow_denied` in shadow mode).
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
    use std::cell::Cell;
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        // Set at a thread's first count; a constant start keeps each read
        // free of the lazy initialisation check.
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX
        .try_with(|index| {
            if index.get() == usize::MAX {
                index.set(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
            }
            index.get()
        })
        .unwrap_or(0)
}

impl Stats {
    pub(crate) fn record(&self, rule: &'static str, outcome: Outcome) {
        self.add(outcome as usize);
        #[cfg(feature = "metrics")]
        keys::increment(keys::DECISIONS, rule, outcome.label());
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
        keys::increment(keys::REFUNDS, rule, "");
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
    keys::record(keys::LATENCY, backend, elapsed.as_secs_f64());
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

/// The keys of the metrics counted at every decision (the decisions and
/// refunds by rule, the backend's latency), made once per label value and
/// outcome. A `metrics::Key` built at each decision (what `counter!` does
/// with a label known only at run time) allocates its labels and hashes
/// them: a third of a decision's work on the memory backend. Rule and
/// backend names are `&'static str`, so each distinct one is a key made once
/// and kept, of static parts: a recorder that copies the key it is given at
/// each registration (Prometheus's does) then copies two pointers, where the
/// labels of a key made at run time are copied into an allocation each time.
#[cfg(feature = "metrics")]
mod keys {
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::{Mutex, PoisonError};

    use metrics::{Key, Label, Level, Metadata, Recorder};

    pub(super) const DECISIONS: &str = "ratelimit_decisions_total";
    pub(super) const REFUNDS: &str = "ratelimit_refunds_total";
    pub(super) const LATENCY: &str = "ratelimit_backend_latency_seconds";

    /// The most keys kept; past it (rule names made at run time by the
    /// thousand), each count builds its key as `counter!` would.
    const MAX_KEYS: usize = 4_096;
    /// Keys a thread remembers without taking the lock.
    const PER_THREAD: usize = 16;

    static METADATA: Metadata<'static> = Metadata::new(
        "ratelimit_core::metrics",
        Level::INFO,
        Some("ratelimit_core::metrics"),
    );

    /// A metric's name, its label's name and value, and its outcome (empty
    /// for none).
    type Parts = (&'static str, &'static str, &'static str, &'static str);
    /// The same, with the label's value by address and length, and without
    /// the label's name, which each metric's name fixes: what a thread
    /// remembers a key by.
    type Id = (&'static str, usize, usize, &'static str);
    /// A metric's name, its label's value and its outcome, by text: what the
    /// kept keys are found by.
    type Text = (&'static str, &'static str, &'static str);

    static KEYS: Mutex<Option<HashMap<Text, &'static Key>>> = Mutex::new(None);

    thread_local! {
        static RECENT: RefCell<Vec<(Id, &'static Key)>> = const { RefCell::new(Vec::new()) };
    }

    /// Adds one to the counter `name` of `rule` (labelled `unnamed` when
    /// empty) and, unless empty, `outcome`.
    pub(super) fn increment(name: &'static str, rule: &'static str, outcome: &'static str) {
        // Calls without a rule name share one label value.
        let rule = if rule.is_empty() { "unnamed" } else { rule };
        registered((name, "rule", rule, outcome), |recorder, key| {
            recorder.register_counter(key, &METADATA)
        })
        .increment(1);
    }

    /// Records `value` in the histogram `name` of `backend`.
    pub(super) fn record(name: &'static str, backend: &'static str, value: f64) {
        registered((name, "backend", backend, ""), |recorder, key| {
            recorder.register_histogram(key, &METADATA)
        })
        .record(value);
    }

    /// The handle `register` gets from the installed recorder for the key of
    /// `parts`.
    fn registered<H>(parts: Parts, register: impl FnOnce(&dyn Recorder, &Key) -> H) -> H {
        let (name, _, value, outcome) = parts;
        let id: Id = (name, value.as_ptr() as usize, value.len(), outcome);
        let key = RECENT
            .try_with(|recent| {
                let mut recent = recent.borrow_mut();
                if let Some((_, key)) = recent.iter().find(|(seen, _)| same(seen, &id)) {
                    return Some(*key);
                }
                let key = kept(parts)?;
                if recent.len() == PER_THREAD {
                    recent.remove(0);
                }
                recent.push((id, key));
                Some(key)
            })
            .ok()
            .flatten();
        match key {
            Some(key) => metrics::with_recorder(|recorder| register(recorder, key)),
            None => {
                let key = Key::from_parts(name, labels(parts));
                metrics::with_recorder(|recorder| register(recorder, &key))
            }
        }
    }

    /// Whether `a` and `b` are the same names, by address: the names are
    /// constants and rule names `&'static`, so this is almost always what
    /// comparing their text would say, at a fraction of the cost; where the
    /// same text has two addresses, `kept` still gives both one key.
    fn same(a: &Id, b: &Id) -> bool {
        std::ptr::eq(a.0, b.0) && a.1 == b.1 && a.2 == b.2 && std::ptr::eq(a.3, b.3)
    }

    /// The key of `parts`, made once of static parts; `None` once `MAX_KEYS`
    /// are kept.
    fn kept(parts: Parts) -> Option<&'static Key> {
        let text: Text = (parts.0, parts.2, parts.3);
        let mut keys = KEYS.lock().unwrap_or_else(PoisonError::into_inner);
        let keys = keys.get_or_insert_with(HashMap::new);
        if let Some(key) = keys.get(&text) {
            return Some(key);
        }
        if keys.len() >= MAX_KEYS {
            return None;
        }
        let labels: &'static [Label] = Box::leak(labels(parts).into_boxed_slice());
        let key: &'static Key = Box::leak(Box::new(Key::from_static_parts(parts.0, labels)));
        keys.insert(text, key);
        Some(key)
    }

    fn labels((_, label, value, outcome): Parts) -> Vec<Label> {
        let mut labels = vec![Label::from_static_parts(label, value)];
        if !outcome.is_empty() {
            labels.push(Label::from_static_parts("outcome", outcome));
        }
        labels
    }
}
