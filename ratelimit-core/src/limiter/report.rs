//! Reporting what the limiter did beyond the counters: sampled denial logs,
//! and throttled warnings while the backend fails.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{FailurePolicy, Limiter};
use crate::denial::RateLimited;
use crate::error::Error;

impl Limiter {
    /// Logs one denial in `denial_log_every`: a flood of denials must not
    /// flood the logs.
    pub(super) fn log_denial(&self, denied: &RateLimited, shadow: bool) {
        let every = self.inner.denial_log_every;
        if every == 0 {
            return;
        }
        // Counted per thread: a denial answered in process costs a few
        // nanoseconds, and reading the shared counters on each would cost
        // more than the answer.
        thread_local! {
            static DENIALS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        }
        let seen = DENIALS.with(|seen| {
            let next = seen.get().wrapping_add(1);
            seen.set(next);
            next
        });
        if !seen.is_multiple_of(every) {
            return;
        }
        tracing::info!(
            rule = denied.rule.unwrap_or(""),
            key = %denied.key,
            retry_after = ?denied.retry_after,
            cause = ?denied.cause,
            shadow,
            sampled_one_in = every,
            "rate limited"
        );
    }

    pub(super) fn warn_throttled(&self, key: &str, error: &Error, policy: FailurePolicy) {
        if once_a_second(&self.inner.last_warning) {
            let backend = self.inner.backend.name();
            let kind = error.kind();
            // Skipped by an open breaker: what kept it open says whether
            // waiting or fixing the deployment ends the fault.
            let cause = match error {
                Error::CircuitOpen { cause } => *cause,
                _ => kind,
            };
            if cause.is_misconfiguration() {
                // A service with no subscriber would hear nothing of a
                // limiter that decides nothing until it is fixed.
                if !tracing::dispatcher::has_been_set() {
                    use std::io::Write as _;
                    // Never a panic for a standard error that is gone.
                    let _ = writeln!(
                        std::io::stderr().lock(),
                        "ratelimit: the {backend} backend refuses this limiter's configuration \
                         ({cause}): {error}; applying the failure policy {policy:?} until it is \
                         fixed (printed at most once a second, as no tracing subscriber is set)"
                    );
                }
                tracing::error!(
                    backend,
                    key,
                    ?policy,
                    %kind,
                    %cause,
                    %error,
                    "rate limit backend refuses this limiter's configuration; applying the failure \
                     policy until it is fixed (logged at most once a second)"
                );
            } else {
                tracing::warn!(
                    backend,
                    key,
                    ?policy,
                    %kind,
                    %cause,
                    %error,
                    "rate limit backend failed; applying the failure policy (logged at most once a second)"
                );
            }
        }
    }
}

/// Whether a log kept to once a second, whose last second `last` holds, is
/// written now: by one caller a second, however many call.
pub(crate) fn once_a_second(last: &AtomicU64) -> bool {
    let second = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let seen = last.load(Ordering::Relaxed);
    seen != second
        && last
            .compare_exchange(seen, second, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
