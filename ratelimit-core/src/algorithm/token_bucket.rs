//! The token bucket as it is usually drawn: a level and the time it was last
//! refilled. The level is kept in units of `1 / rate.tokens` microseconds
//! (a token is `rate.period_us` units), so refill is exact for any rate.
//! Redis stores `"<level>:<updated>"`.
//!
//! On a clock that only moves forward it admits exactly what GCRA admits.
//! When the clock goes backwards it refills nothing until the clock is past
//! `updated` again, so it never mints tokens.

use super::{decision, State};
use crate::decision::Decision;
use crate::quota::Quota;

pub(super) fn decide(
    quota: &Quota,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
) -> (Decision, bool) {
    let tokens = quota.rate().tokens();
    let period = quota.rate().period_us();
    let depth = quota.depth();
    let inc = cost * period;

    let (mut level, mut updated) = match *state {
        Some(State::Bucket { level, updated }) => (level, updated),
        _ => (depth, now),
    };
    if now > updated {
        // Compare in time rather than multiply, so a long idle gap cannot
        // overflow.
        let gap = depth - level;
        let elapsed = now - updated;
        level = if elapsed >= gap.div_ceil(tokens) {
            depth
        } else {
            level + elapsed * tokens
        };
        updated = now;
    }
    // How long until refill resumes (non-zero only after the clock went back).
    let lag = updated - now;
    let d = decide_level(quota, level, lag, cost);
    // A denial writes nothing, nor does a request of no cost.
    if !d.allowed || inc == 0 {
        return (d, false);
    }
    *state = Some(State::Bucket {
        level: level - inc,
        updated,
    });
    (d, true)
}

/// The decision on a request of `cost` when the bucket holds `level` units
/// after refill, which resumes in `lag` µs (non-zero only after the clock
/// went back). The Redis script answers with the level and lag alone and this
/// turns them into the decision, for both backends.
pub(crate) fn decide_level(quota: &Quota, level: u64, lag: u64, cost: u64) -> Decision {
    let tokens = quota.rate().tokens();
    let period = quota.rate().period_us();
    let depth = quota.depth();
    let inc = cost * period;
    if inc > level {
        return decision(
            quota,
            false,
            level / period,
            lag + (inc - level).div_ceil(tokens),
            lag + (depth - level).div_ceil(tokens),
            0,
        );
    }
    let level = level - inc;
    decision(
        quota,
        true,
        level / period,
        0,
        lag + (depth - level).div_ceil(tokens),
        0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::run;

    #[test]
    fn refills_exactly_and_reports_the_time_to_full() {
        let quota = Quota::token_bucket(3, "3/s".parse().unwrap()).unwrap();
        let t = 1_000_000;
        let d = run(
            &quota,
            &[(t, 3), (t, 1), (t + 333_333, 1), (t + 333_334, 1)],
        );
        assert!(d[0].allowed && !d[1].allowed && !d[2].allowed && d[3].allowed);
        assert_eq!(d[1].retry_after.as_micros(), 333_334);
        assert_eq!(d[1].reset_after.as_micros(), 1_000_000);
    }

    #[test]
    fn time_going_backwards_mints_no_tokens() {
        let quota = Quota::token_bucket(2, "1/s".parse().unwrap()).unwrap();
        let t = 100_000_000;
        let mut state = None;
        decide(&quota, &mut state, t, 2);
        for back in [1, 1_000_000, 50_000_000] {
            let d = decide(&quota, &mut state, t - back, 1).0;
            assert!(!d.allowed, "{back} µs back must not admit");
            assert_eq!(d.retry_after.as_micros(), u128::from(back) + 1_000_000);
        }
    }
}
