//! The token bucket as pure logic over integers, the Rust twin of
//! `scripts/token_bucket.lua`. Both must make the same decision on the same
//! (state, time, cost); the differential tests hold them to it.
//!
//! The bucket is kept as one instant, `full_at`: when the bucket will be full
//! again (GCRA's theoretical arrival time). Time is counted in units of
//! `1 / rate.tokens` microseconds, so a token is worth exactly `rate.period_us`
//! units and refill is exact for any reduced rate, such as 3/s or 7/min.
//! `full_at` is stored as whole microseconds plus a remainder in those units.

use crate::decision::Decision;
use crate::quota::Quota;

/// The stored state of one key: the bucket is full again at
/// `full_at_us + rem / rate.tokens` microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketState {
    pub full_at_us: u64,
    pub rem: u64,
}

impl BucketState {
    /// Whether the bucket is full at `now_us`, so the state can be dropped.
    pub fn is_full_at(&self, now_us: u64) -> bool {
        self.full_at_us < now_us || (self.full_at_us == now_us && self.rem == 0)
    }
}

/// The result of one decision: the answer and, when tokens were consumed, the
/// state to store with its time to live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub decision: Decision,
    pub write: Option<BucketState>,
}

/// Decides one request of `cost` tokens at `now_us`. The caller has checked
/// `cost <= quota.capacity()`.
pub(crate) fn token_bucket(
    quota: &Quota,
    state: Option<BucketState>,
    now_us: u64,
    cost: u64,
) -> Outcome {
    let tokens = quota.rate().tokens();
    let period = quota.rate().period_us();
    let depth = quota.depth();
    let inc = cost * period;

    // A full_at in the past means a full bucket. A clock that went backwards
    // finds full_at further away, so it sees fewer tokens, never more.
    let (full_at, rem) = match state {
        Some(s) if s.full_at_us >= now_us => (s.full_at_us, s.rem),
        _ => (now_us, 0),
    };
    let debt = (full_at - now_us) * tokens + rem;
    let new_debt = debt + inc;
    let limit = quota.capacity();

    if new_debt > depth {
        // Denied: nothing is written. The request fits once the debt has
        // shrunk by the excess.
        let decision = Decision::from_micros(
            false,
            limit,
            (depth.saturating_sub(debt)) / period,
            (new_debt - depth).div_ceil(tokens),
            debt.div_ceil(tokens),
        );
        return Outcome {
            decision,
            write: None,
        };
    }

    let decision = Decision::from_micros(
        true,
        limit,
        (depth - new_debt) / period,
        0,
        new_debt.div_ceil(tokens),
    );
    let write = (inc > 0).then(|| {
        let total = rem + inc;
        BucketState {
            full_at_us: full_at + total / tokens,
            rem: total % tokens,
        }
    });
    Outcome { decision, write }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Rate;

    fn run(quota: &Quota, events: &[(u64, u64)]) -> Vec<bool> {
        let mut state = None;
        events
            .iter()
            .map(|&(now, cost)| {
                let out = token_bucket(quota, state, now, cost);
                if let Some(s) = out.write {
                    state = Some(s);
                }
                out.decision.allowed
            })
            .collect()
    }

    #[test]
    fn a_full_bucket_admits_its_capacity_then_denies_with_the_refill_time() {
        let quota = Quota::new(3, Rate::per_second(2).unwrap()).unwrap();
        let t = 1_000_000;
        assert_eq!(
            run(&quota, &[(t, 1), (t, 1), (t, 1), (t, 1)]),
            [true, true, true, false]
        );
        let mut state = None;
        for _ in 0..3 {
            state = token_bucket(&quota, state, t, 1).write;
        }
        let denied = token_bucket(&quota, state, t, 1).decision;
        assert_eq!(
            denied.retry_after.as_micros(),
            500_000,
            "one token takes 1/2 s"
        );
        assert_eq!(
            denied.reset_after.as_micros(),
            1_500_000,
            "three tokens take 1.5 s"
        );
        assert_eq!(denied.remaining, 0);
    }

    #[test]
    fn retry_after_is_exact_for_rates_that_do_not_divide_a_microsecond() {
        let quota = Quota::new(1, Rate::per_second(3).unwrap()).unwrap();
        let t = 10_000_000;
        let state = token_bucket(&quota, None, t, 1).write;
        let denied = token_bucket(&quota, state, t, 1).decision;
        let retry = denied.retry_after.as_micros() as u64;
        assert_eq!(retry, 333_334, "ceil(1e6 / 3)");
        assert!(
            !token_bucket(&quota, state, t + retry - 1, 1)
                .decision
                .allowed
        );
        assert!(token_bucket(&quota, state, t + retry, 1).decision.allowed);
    }

    #[test]
    fn saturated_buckets_admit_the_theoretical_count_with_no_drift() {
        // A million decisions per rate, each at the earliest instant the previous
        // denial named, plus one attempt a microsecond too early.
        for (capacity, rate) in [(1, "3/s"), (5, "7/min"), (1_000, "1000000/day")] {
            let quota = Quota::new(capacity, rate.parse().unwrap()).unwrap();
            let start = 1_700_000_000_000_000u64;
            let (mut now, mut state, mut admitted, mut decisions) = (start, None, 0u64, 0u64);
            while decisions < 1_000_000 {
                let out = token_bucket(&quota, state, now, 1);
                decisions += 1;
                if out.decision.allowed {
                    admitted += 1;
                    state = out.write;
                    continue;
                }
                let wait = out.decision.retry_after.as_micros() as u64;
                let early = token_bucket(&quota, state, now + wait - 1, 1);
                assert!(
                    !early.decision.allowed,
                    "{rate}: admitted before retry_after"
                );
                decisions += 1;
                now += wait;
            }
            let elapsed = now - start;
            let r = quota.rate();
            let theoretical = capacity + elapsed * r.tokens() / r.period_us();
            assert!(
                admitted.abs_diff(theoretical) <= 1,
                "{rate}: admitted {admitted}, theoretical {theoretical}"
            );
        }
    }

    #[test]
    fn time_going_backwards_mints_no_tokens() {
        let quota = Quota::new(2, Rate::per_second(1).unwrap()).unwrap();
        let t = 100_000_000;
        let mut state = None;
        for _ in 0..2 {
            state = token_bucket(&quota, state, t, 1).write;
        }
        for back in [1, 1_000, 1_000_000, 50_000_000] {
            let d = token_bucket(&quota, state, t - back, 1).decision;
            assert!(!d.allowed, "{back} µs back must not admit");
            assert_eq!(d.remaining, 0);
        }
    }

    #[test]
    fn zero_cost_peeks_without_writing() {
        let quota = Quota::per_second(5).unwrap();
        let out = token_bucket(&quota, None, 1, 0);
        assert!(out.decision.allowed);
        assert_eq!(out.decision.remaining, 5);
        assert_eq!(out.write, None);
    }
}
