//! The algorithms as pure logic over integers: the Rust twins of
//! `scripts/*.lua`. A twin and its script must make the same decision on the
//! same (state, time, cost); the differential tests hold them to it.
//!
//! Conventions shared by every algorithm and script:
//! - time in integer microseconds; every number stays below 2^53, so Lua's
//!   doubles hold them exactly (the quota constructors check the bounds);
//! - a denial writes nothing (the sliding log is no exception: it counts
//!   without trimming when it denies);
//! - when a decision writes, the state expires at `now + reset_after`, when it
//!   no longer changes any decision;
//! - a clock that goes backwards never admits more than it would have.

mod fixed_window;
pub(crate) mod gcra;
mod refund;
mod sliding_log;
mod sliding_window;

use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};

#[cfg(feature = "native")]
pub(crate) use fixed_window::window_end;
pub(crate) use refund::{refund, Refund};

/// One key's state in the memory backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// Token bucket, GCRA and leaky bucket: full (or drained) at
    /// `full_at + rem / tokens` µs.
    Tat { full_at: u64, rem: u64 },
    /// Fixed window: `count` in the window that began at `start` µs.
    Window { start: u64, count: u64 },
    /// Sliding log: admitted instants, ascending.
    Log(std::collections::VecDeque<u64>),
    /// Sliding window: counts of the window that began at `start` µs and
    /// of the one before.
    Windows {
        start: u64,
        current: u64,
        previous: u64,
    },
}

/// The latest instant the algorithms decide at: 2^53 µs after the epoch
/// (the year 2255). A clock read later than that (a custom [`Clock`], a
/// `ManualClock` set far ahead) is taken as this, so that every sum of an
/// instant and a quota's span stays within `u64` and Lua's doubles.
///
/// [`Clock`]: crate::Clock
pub(crate) const MAX_NOW: u64 = 1 << 53;

/// Decides one request of `cost` tokens at `now`, updating `state` when the
/// decision consumes. Returns the decision and whether `state` was written.
/// The caller has checked `cost <= quota.capacity()`.
pub(crate) fn decide(
    quota: &Quota,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
) -> (Decision, bool) {
    let now = now.min(MAX_NOW);
    match quota.algorithm() {
        // The token bucket kept as the instant it is full again: GCRA's state.
        Algorithm::TokenBucket | Algorithm::Gcra => gcra::decide(quota, state, now, cost, false),
        Algorithm::LeakyBucket => gcra::decide(quota, state, now, cost, true),
        Algorithm::FixedWindow => fixed_window::decide(quota, state, now, cost),
        Algorithm::SlidingLog => sliding_log::decide(quota, state, now, cost),
        Algorithm::SlidingWindow => sliding_window::decide(quota, state, now, cost),
    }
}

/// A decision in microseconds.
#[inline]
pub(crate) fn decision(
    quota: &Quota,
    allowed: bool,
    remaining: u64,
    retry_after_us: u64,
    reset_after_us: u64,
    delay_us: u64,
) -> Decision {
    Decision::from_micros(
        allowed,
        quota.capacity(),
        remaining,
        retry_after_us,
        reset_after_us,
        delay_us,
    )
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// Runs `events` of (now, cost) from an empty state; returns each decision.
    pub fn run(quota: &Quota, events: &[(u64, u64)]) -> Vec<Decision> {
        let mut state = None;
        events
            .iter()
            .map(|&(now, cost)| decide(quota, &mut state, now, cost).0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock read near the end of `u64` (a custom clock, a manual one set
    /// far ahead) decides as at [`MAX_NOW`], with no overflow, and its
    /// refunds too.
    #[test]
    fn a_clock_past_the_latest_instant_decides_as_at_it() {
        let (hour, rate) = (
            std::time::Duration::from_secs(3600),
            crate::quota::Rate::per_hour(5).unwrap(),
        );
        for quota in [
            Quota::token_bucket(5, rate),
            Quota::gcra(5, rate),
            Quota::leaky_bucket(5, rate),
            Quota::fixed_window(5, hour),
            Quota::sliding_log(5, hour),
            Quota::sliding_window(5, hour),
        ] {
            let quota = quota.unwrap();
            let algorithm = quota.algorithm();
            let (mut late, mut latest) = (None, None);
            for _ in 0..6 {
                let at_end = decide(&quota, &mut late, u64::MAX - 10, 1);
                assert_eq!(
                    at_end,
                    decide(&quota, &mut latest, MAX_NOW, 1),
                    "{algorithm}"
                );
            }
            assert_eq!(late, latest, "{algorithm}");
            let admitted = decide(&quota, &mut None, MAX_NOW, 1).0;
            let given = Refund::of(&quota, &admitted, 1, 0, 0).unwrap();
            refund(&quota, &mut late, u64::MAX, &given);
            refund(&quota, &mut latest, MAX_NOW, &given);
            assert_eq!(late, latest, "{algorithm}");
        }
    }

    /// A million decisions, each at the earliest instant the previous denial
    /// named (plus a probe a microsecond too early): the count admitted, and
    /// the instants of the first and the last admission.
    fn saturate(quota: &Quota) -> (u64, u64, u64) {
        let start = 1_700_000_000_000_000u64;
        let (mut now, mut state, mut admitted, mut decisions) = (start, None, 0u64, 0u64);
        let mut last_admitted = start;
        // Stops at a denial, so the last window or burst is complete.
        loop {
            let (d, _) = decide(quota, &mut state, now, 1);
            decisions += 1;
            if d.allowed {
                admitted += 1;
                last_admitted = now;
                continue;
            }
            if decisions >= 1_000_000 {
                break;
            }
            let wait = d.retry_after.as_micros() as u64;
            assert!(wait > 0, "{quota:?}: denied with no wait");
            let early = decide(quota, &mut state.clone(), now + wait - 1, 1).0;
            assert!(
                !early.allowed,
                "{quota:?}: admitted 1 µs before retry_after"
            );
            decisions += 1;
            now += wait;
        }
        (admitted, start, last_admitted)
    }

    #[test]
    fn saturated_limits_admit_the_theoretical_count_with_no_drift() {
        for (capacity, rate) in [(1, "3/s"), (5, "7/min"), (1_000, "1000000/day")] {
            for algorithm in [
                Algorithm::TokenBucket,
                Algorithm::Gcra,
                Algorithm::LeakyBucket,
            ] {
                let quota = Quota::builder(algorithm)
                    .capacity(capacity)
                    .rate(rate.parse().unwrap())
                    .build()
                    .unwrap();
                let (admitted, start, end) = saturate(&quota);
                let r = quota.rate();
                let theoretical = capacity + (end - start) * r.tokens() / r.period_us();
                assert!(
                    admitted.abs_diff(theoretical) <= 1,
                    "{quota:?}: admitted {admitted}, theoretical {theoretical}"
                );
            }
        }
        for (limit, window) in [(3, "1s"), (7, "1m"), (10_000, "1d")] {
            let window = Quota::parse_window(window).unwrap();
            let w = window.as_micros() as u64;
            for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog] {
                let quota = Quota::builder(algorithm)
                    .limit(limit)
                    .window(window)
                    .build()
                    .unwrap();
                let (admitted, start, end) = saturate(&quota);
                let windows = match algorithm {
                    // Every aligned window from the first to the last.
                    Algorithm::FixedWindow => end / w - start / w + 1,
                    // A full burst every window length from the first admission.
                    _ => (end - start) / w + 1,
                };
                let theoretical = limit * windows;
                assert!(
                    admitted.abs_diff(theoretical) <= 1,
                    "{quota:?}: admitted {admitted}, theoretical {theoretical}"
                );
            }
            // The sliding window's estimate loses at most one admission per
            // window to whole-millisecond weights, and never exceeds the limit
            // per aligned window.
            let quota = Quota::sliding_window(limit, window).unwrap();
            let (admitted, start, end) = saturate(&quota);
            let windows = end / w - start / w + 1;
            assert!(
                admitted <= limit * windows,
                "{quota:?}: {admitted} over {windows} windows"
            );
            assert!(
                admitted + windows >= limit * (windows - 1),
                "{quota:?}: admitted {admitted} over {windows} windows"
            );
        }
    }
}
