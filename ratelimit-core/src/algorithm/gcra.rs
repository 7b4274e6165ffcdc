//! GCRA, which is also how the token bucket is kept, and the leaky bucket as
//! a queue on the same arithmetic.
//!
//! A token bucket of `capacity` refilled at `rate` holds `capacity` minus
//! the tokens still owed: keeping the instant it is full again instead of a
//! level and the time of its last refill is one number instead of two, and
//! admits exactly the same requests.
//!
//! The bucket is kept as one instant, `full_at`: when the bucket will be full
//! again (the theoretical arrival time). Time is counted in units of
//! `1 / rate.tokens` microseconds, so a token is worth exactly
//! `rate.period_us` units and refill is exact for any reduced rate, such as
//! 3/s or 7/min. `full_at` is whole microseconds plus a remainder in those
//! units; Redis stores `"<full_at>"` (one integer) when the remainder is zero,
//! `"<full_at>:<rem>"` otherwise.
//!
//! The state is an instant, so it keeps its meaning when the quota changes:
//! the tokens owed carry over as time. A debt deeper than the new bucket (a
//! slower rate or a larger capacity before) is waited out as it is: the key
//! is denied until the debt has shrunk to fit, and each denial names that
//! wait.
//!
//! The leaky bucket reads `full_at` as the instant its queue has drained: a
//! request is admitted while the queue has room, and waits `delay`, the time
//! the requests ahead of it take to drain.

use super::{decision, State};
use crate::decision::Decision;
use crate::quota::Quota;

#[inline(always)]
pub(super) fn decide(
    quota: &Quota,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    leaky: bool,
) -> (Decision, bool) {
    let tokens = quota.rate().tokens();
    let inc = cost * quota.rate().period_us();

    // A full_at in the past means a full bucket. A clock that went backwards
    // finds full_at further away, so it sees fewer tokens, never more.
    let (full_at, rem) = match *state {
        Some(State::Tat { full_at, rem }) if full_at >= now => (full_at, rem),
        _ => (now, 0),
    };
    // A debt deeper than this quota's bucket was run up under another quota
    // (a slower rate, a larger capacity) or on a clock that went back. It is
    // waited out as it is, and no denial writes: counted as an empty bucket
    // of this quota, it would have to be stored as one (or every later
    // request would find it again), and a clock behind the one that wrote
    // it (another instance's, a failover's) would so mint tokens each time.
    let debt = (full_at - now)
        .saturating_mul(tokens)
        .saturating_add(rem)
        .min(MAX_DEBT);
    let d = decide_debt(quota, debt, cost, leaky);
    // A denial writes nothing, nor does a request of no cost.
    if !d.allowed || inc == 0 {
        return (d, false);
    }
    let total = rem + inc;
    *state = Some(State::Tat {
        full_at: full_at + total / tokens,
        rem: total % tokens,
    });
    (d, true)
}

/// The deepest debt a decision reads, in units: deeper ones (run up under a
/// quota whose rate has a far smaller numerator) are read as this, a wait of
/// at least 2^53 / tokens µs, below which Lua's doubles hold the debt
/// exactly.
pub(crate) const MAX_DEBT: u64 = (1 << 53) - 1;

/// The decision on a request of `cost` when the bucket owes `debt` units
/// before it (possibly more than the bucket holds, after a quota change). The Redis script answers with the debt alone and this turns it
/// into the decision, for both backends.
#[inline(always)]
pub(crate) fn decide_debt(quota: &Quota, debt: u64, cost: u64, leaky: bool) -> Decision {
    let tokens = quota.rate().tokens();
    let period = quota.rate().period_us();
    let depth = quota.depth();
    let new_debt = debt.saturating_add(cost * period);
    if !fits(quota, debt, cost) {
        // The request fits once the debt has shrunk by the excess.
        let denial = decision(
            quota,
            false,
            depth.saturating_sub(debt) / period,
            (new_debt - depth).div_ceil(tokens),
            debt.div_ceil(tokens),
            0,
        );
        return Decision {
            debt: Some(debt),
            ..denial
        };
    }
    let delay = if leaky { debt.div_ceil(tokens) } else { 0 };
    let admission = decision(
        quota,
        true,
        depth.saturating_sub(new_debt) / period,
        0,
        new_debt.div_ceil(tokens),
        delay,
    );
    Decision {
        debt: Some(new_debt),
        ..admission
    }
}

/// Whether a request of `cost` fits in the bucket when it owes `debt` units
/// (the cost at most its capacity). A request of no cost always does: it
/// only reads the bucket, however deep its debt.
pub(crate) fn fits(quota: &Quota, debt: u64, cost: u64) -> bool {
    cost == 0 || debt.saturating_add(cost * quota.rate().period_us()) <= quota.depth()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::run;
    use crate::quota::Rate;

    fn gcra(capacity: u64, rate: &str) -> Quota {
        Quota::gcra(capacity, rate.parse().unwrap()).unwrap()
    }

    #[test]
    fn a_full_bucket_admits_its_capacity_then_denies_with_the_refill_time() {
        let quota = gcra(3, "2/s");
        let t = 1_000_000;
        let d = run(&quota, &[(t, 1), (t, 1), (t, 1), (t, 1)]);
        let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, false]);
        assert_eq!(
            d[3].retry_after.as_micros(),
            500_000,
            "one token takes 1/2 s"
        );
        assert_eq!(
            d[3].reset_after.as_micros(),
            1_500_000,
            "three tokens take 1.5 s"
        );
        assert_eq!(d[3].remaining, 0);
    }

    #[test]
    fn the_token_bucket_refills_exactly_and_reports_the_time_to_full() {
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
    fn retry_after_is_exact_for_rates_that_do_not_divide_a_microsecond() {
        let quota = gcra(1, "3/s");
        let t = 10_000_000;
        let mut state = None;
        decide(&quota, &mut state, t, 1, false);
        let denied = decide(&quota, &mut state.clone(), t, 1, false).0;
        let retry = denied.retry_after.as_micros() as u64;
        assert_eq!(retry, 333_334, "ceil(1e6 / 3)");
        assert!(
            !decide(&quota, &mut state.clone(), t + retry - 1, 1, false)
                .0
                .allowed
        );
        assert!(
            decide(&quota, &mut state.clone(), t + retry, 1, false)
                .0
                .allowed
        );
    }

    #[test]
    fn time_going_backwards_mints_no_tokens() {
        let quota = Quota::gcra(2, Rate::per_second(1).unwrap()).unwrap();
        let t = 100_000_000;
        let mut state = None;
        for _ in 0..2 {
            decide(&quota, &mut state, t, 1, false);
        }
        for back in [1, 1_000, 1_000_000, 50_000_000] {
            let d = decide(&quota, &mut state, t - back, 1, false).0;
            assert!(!d.allowed, "{back} µs back must not admit");
            assert_eq!(d.remaining, 0);
        }
    }

    #[test]
    fn zero_cost_peeks_without_writing() {
        let quota = gcra(5, "5/s");
        let mut state = None;
        let (d, wrote) = decide(&quota, &mut state, 1, 0, false);
        assert!(d.allowed && !wrote && state.is_none());
        assert_eq!(d.remaining, 5);
    }

    #[test]
    fn the_leaky_bucket_queues_with_delays_one_interval_apart() {
        let quota = Quota::leaky_bucket(3, "4/s".parse().unwrap()).unwrap();
        let t = 7_000_000;
        let d = run(&quota, &[(t, 1), (t, 1), (t, 1), (t, 1)]);
        let delays: Vec<u128> = d.iter().map(|d| d.delay.as_micros()).collect();
        assert_eq!(delays, [0, 250_000, 500_000, 0]);
        assert!(!d[3].allowed, "the queue holds 3");
        assert_eq!(d[3].retry_after.as_micros(), 250_000);
    }
}
