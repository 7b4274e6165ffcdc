//! Refunds: giving back the cost an admission took. The Rust twin of
//! `scripts/refund.lua`, which the differential tests hold it to.
//!
//! What a refund gives back, by algorithm:
//! - the token bucket, GCRA and the leaky bucket: the part of the
//!   admission's cost the bucket has not refilled yet. A bucket's debt
//!   drains oldest first, and the admission's cost was the newest part of
//!   the debt its decision left, so what is left of it is that debt less
//!   what has drained since, at most the cost: the tokens given back are
//!   exactly those the bucket would not yet hold had the admission not been
//!   made;
//! - the fixed window: the count of the admission's window falls by the cost
//!   while that window lasts; once it has ended there is nothing to give;
//! - the sliding window counter: the count of the admission's window falls
//!   by the cost while it is the current or the previous window (it still
//!   weighs on the estimate);
//! - in both, only a count begun in the admission's window, as its own
//!   quota cuts windows: one begun under another window (the rule changed
//!   since) is left as it is;
//! - the sliding log: the admission's entries leave the log, by their tag,
//!   so a refund applied twice removes nothing more.

use super::{fixed_window, State};
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};

/// What a refund of one admission needs besides the key and quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refund {
    pub cost: u64,
    /// The sliding log's tag of the admission's entries (the memory backend
    /// logs the admitted instant; Redis a tag unique to the request).
    pub tag: u64,
    /// The buckets: the debt to take off, in the algorithm's units (a token
    /// is `rate.period_us` of them).
    pub units: u64,
    /// The windows: microseconds from the refund to the end of the
    /// admission's window, as the refunding process measured it. The
    /// backend rounds `now + until_end` to the nearest window boundary, so
    /// the refund finds the admission's window whatever the clocks' offset,
    /// as long as the round trips stay below half a window.
    pub until_end: i64,
}

impl Refund {
    /// The refund of `decision`, an admission of `cost` on `quota` made
    /// `elapsed_us` ago, whose tokens (a bucket's) refunds of older
    /// admissions have since moved up the debt by `moved_up` units; `None`
    /// when there is nothing left to give back (no cost, a window that has
    /// ended, a log entry with no tag).
    pub(crate) fn of(
        quota: &Quota,
        decision: &Decision,
        cost: u64,
        elapsed_us: u64,
        moved_up: u64,
    ) -> Option<Self> {
        if cost == 0 || !decision.allowed {
            return None;
        }
        let elapsed = i64::try_from(elapsed_us).unwrap_or(i64::MAX);
        let reset = i64::try_from(decision.reset_after.as_micros()).unwrap_or(i64::MAX);
        let window = i64::try_from(quota.window_us()).unwrap_or(i64::MAX);
        let refund = Self {
            cost,
            tag: 0,
            units: 0,
            until_end: 0,
        };
        match quota.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket => {
                // Without the debt its decision left (a token served from a
                // lease), what is left of the admission is unknown.
                let debt = u128::from(decision.debt?);
                let drained = u128::from(elapsed_us) * u128::from(quota.rate().tokens());
                let cost_units = u128::from(cost) * u128::from(quota.rate().period_us());
                let units = debt
                    .saturating_sub(drained)
                    .saturating_sub(u128::from(moved_up))
                    .min(cost_units);
                (units > 0).then(|| Self {
                    units: u64::try_from(units).unwrap_or(u64::MAX),
                    ..refund
                })
            }
            // An admission's reset is its window's end.
            Algorithm::FixedWindow => {
                let until_end = reset.saturating_sub(elapsed);
                (until_end > 0).then_some(Self {
                    until_end,
                    ..refund
                })
            }
            // An admission's reset is a window after its window's end, and
            // its count weighs until a window after that end too.
            Algorithm::SlidingWindow => {
                let until_end = reset.saturating_sub(window).saturating_sub(elapsed);
                (until_end > -window).then_some(Self {
                    until_end,
                    ..refund
                })
            }
            Algorithm::SlidingLog => (decision.tag != 0).then_some(Self {
                tag: decision.tag,
                ..refund
            }),
        }
    }
}

/// The end of the window a refund names: `now + until_end` at the nearest
/// window boundary.
fn admission_end(now: u64, until_end: i64, window: u64) -> i128 {
    let estimate = i128::from(now) + i128::from(until_end) + i128::from(window / 2);
    let window = i128::from(window);
    estimate.div_euclid(window) * window
}

/// Applies `refund` to a key's `state` at `now`; the state becomes `None`
/// when nothing is owed any longer.
pub(crate) fn refund(quota: &Quota, state: &mut Option<State>, now: u64, refund: &Refund) {
    let now = now.min(super::MAX_NOW);
    let window = quota.window_us();
    let cost = refund.cost;
    match state.as_mut() {
        Some(State::Tat { full_at, rem }) if !quota.algorithm().is_windowed() => {
            // Nothing to give back leaves the key as it is (as the script).
            if *full_at < now || refund.units == 0 {
                return;
            }
            let tokens = quota.rate().tokens();
            let debt = u128::from(*full_at - now) * u128::from(tokens) + u128::from(*rem);
            let Some(debt) = debt.checked_sub(u128::from(refund.units)) else {
                *state = None;
                return;
            };
            if debt == 0 {
                *state = None;
                return;
            }
            let debt = u64::try_from(debt).unwrap_or(u64::MAX);
            *full_at = now + debt / tokens;
            *rem = debt % tokens;
        }
        Some(State::Window { start, count }) if quota.algorithm() == Algorithm::FixedWindow => {
            let current = now - now % window;
            let end = admission_end(now, refund.until_end, window);
            // The count must be the one begun in the admission's window:
            // one begun later under another window (the rule changed since)
            // never held the admission, and giving it back there would
            // admit more than that window's limit.
            if *start < current
                || i128::from(*start) != end - i128::from(window)
                || i128::from(fixed_window::window_end(*start, current, window)) != end
                || cost == 0
            {
                return;
            }
            *count = count.saturating_sub(cost);
            if *count == 0 {
                *state = None;
            }
        }
        Some(State::Windows {
            start,
            current,
            previous,
        }) if quota.algorithm() == Algorithm::SlidingWindow => {
            let stored = *start - *start % window;
            // A count begun off this quota's windows was begun under
            // another window (the rule changed since), and holds the
            // admission in another place than this quota's, if at all.
            if stored != *start || stored.saturating_add(2 * window) <= now {
                return;
            }
            let admitted = admission_end(now, refund.until_end, window) - i128::from(window);
            let count = if i128::from(stored) == admitted {
                &mut *current
            } else if i128::from(stored) == admitted + i128::from(window) {
                &mut *previous
            } else {
                return;
            };
            // A count already at 0 gives nothing back: the key is left as it
            // is (as the script).
            if *count == 0 {
                return;
            }
            *count = count.saturating_sub(cost);
            if *current == 0 && *previous == 0 {
                *state = None;
            }
        }
        Some(State::Log(log)) if quota.algorithm() == Algorithm::SlidingLog => {
            // The memory backend's tag is the admitted instant plus one.
            let Some(instant) = refund.tag.checked_sub(1) else {
                return;
            };
            let from = log.partition_point(|&t| t < instant);
            let mut to = from;
            while to < log.len() && log[to] == instant && ((to - from) as u64) < cost {
                to += 1;
            }
            log.drain(from..to);
            if log.is_empty() {
                *state = None;
            }
        }
        // Nothing, or another algorithm's state: nothing of this admission.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::decide;
    use std::time::Duration;

    /// A refund that gives nothing back leaves the state as it is (no key
    /// removed, no expiry moved), as the script's does: a bucket given no
    /// units, a fixed window given no cost, a window whose count is 0.
    #[test]
    fn a_refund_of_nothing_leaves_the_state_as_it_is() {
        let now = 10_000_000;
        let second = Duration::from_secs(1);
        let nothing = |cost, units, until_end| Refund {
            cost,
            tag: 0,
            units,
            until_end,
        };
        let cases = [
            (
                Quota::new(5, "1/s".parse().unwrap()).unwrap(),
                State::Tat {
                    full_at: now,
                    rem: 0,
                },
                nothing(1, 0, 0),
            ),
            (
                Quota::fixed_window(5, second).unwrap(),
                State::Window {
                    start: now,
                    count: 0,
                },
                nothing(0, 0, 1_000_000),
            ),
            (
                Quota::sliding_window(5, second).unwrap(),
                State::Windows {
                    start: now,
                    current: 0,
                    previous: 0,
                },
                nothing(2, 0, 1_000_000),
            ),
        ];
        for (quota, state, given) in cases {
            let mut held = Some(state.clone());
            refund(&quota, &mut held, now, &given);
            assert_eq!(held, Some(state), "{quota:?} {given:?}");
        }
    }

    /// A rule changed to a longer window carries the count of the shorter
    /// one: an admission under the new rule is counted there, and its
    /// refund gives it back.
    #[test]
    fn a_refund_under_a_lengthened_window_gives_back() {
        let minute = 60_000_000;
        let m = 30_000_000 * minute;
        for (short, long) in [
            (
                Quota::fixed_window(10, Duration::from_secs(10)).unwrap(),
                Quota::fixed_window(3, Duration::from_secs(60)).unwrap(),
            ),
            (
                Quota::sliding_window(10, Duration::from_secs(10)).unwrap(),
                Quota::sliding_window(3, Duration::from_secs(60)).unwrap(),
            ),
        ] {
            let mut state = None;
            assert!(decide(&short, &mut state, m + 22_000_000, 1).0.allowed);
            let at = m + 25_000_000;
            let (admission, _) = decide(&long, &mut state, at, 1);
            assert!(admission.allowed);
            assert!(decide(&long, &mut state, at, 1).0.allowed);
            assert!(
                !decide(&long, &mut state, at, 1).0.allowed,
                "{long:?} spent"
            );
            let given = Refund::of(&long, &admission, 1, 0, 0).unwrap();
            refund(&long, &mut state, at, &given);
            assert!(
                decide(&long, &mut state, at, 1).0.allowed,
                "{long:?}: the refund of its own admission gave nothing back"
            );
        }
    }

    /// A rule changed to a shorter window while an admission of the old
    /// one is out: the new window's count, begun after the admission, never
    /// held it, and its refund leaves that count alone (else the new window
    /// admits past its limit).
    #[test]
    fn a_refund_leaves_a_count_begun_under_another_window() {
        let minute = 60_000_000;
        let m = 30_000_000 * minute;
        for (old, new) in [
            (
                Quota::fixed_window(100, Duration::from_secs(60)).unwrap(),
                Quota::fixed_window(10, Duration::from_secs(10)).unwrap(),
            ),
            (
                Quota::sliding_window(100, Duration::from_secs(60)).unwrap(),
                Quota::sliding_window(10, Duration::from_secs(10)).unwrap(),
            ),
        ] {
            let mut state = None;
            let (admission, _) = decide(&old, &mut state, m + 5_000_000, 1);
            assert!(admission.allowed);
            let at = m + 12_000_000;
            let mut admitted = 0;
            while decide(&new, &mut state, at, 1).0.allowed {
                admitted += 1;
            }
            let given = Refund::of(&old, &admission, 1, at - (m + 5_000_000), 0).unwrap();
            refund(&old, &mut state, at, &given);
            let (after, _) = decide(&new, &mut state, at, 1);
            assert!(
                !after.allowed,
                "{new:?}: {admitted} admitted, then one more after the old refund"
            );
        }
    }

    /// Decides `cost` at `at`, refunds it at `later`: the state is what it
    /// was before the admission, in every algorithm, while the admission
    /// still counts.
    fn round(
        quota: &Quota,
        before: &Option<State>,
        at: u64,
        cost: u64,
        later: u64,
    ) -> Option<State> {
        let mut state = before.clone();
        let (d, _) = decide(quota, &mut state, at, cost);
        assert!(d.allowed, "{quota:?} admits");
        let r = Refund::of(quota, &d, cost, later - at, 0).expect("something to refund");
        refund(quota, &mut state, later, &r);
        state
    }

    #[test]
    fn a_refund_right_after_an_admission_undoes_it() {
        let second = Duration::from_secs(1);
        let quotas = [
            Quota::builder(Algorithm::TokenBucket)
                .capacity(5)
                .rate("5/s".parse().unwrap())
                .build()
                .unwrap(),
            Quota::builder(Algorithm::Gcra)
                .capacity(5)
                .rate("3/s".parse().unwrap())
                .build()
                .unwrap(),
            Quota::builder(Algorithm::LeakyBucket)
                .capacity(5)
                .rate("5/s".parse().unwrap())
                .build()
                .unwrap(),
            Quota::fixed_window(5, second).unwrap(),
            Quota::sliding_window(5, second).unwrap(),
            Quota::sliding_log(5, second).unwrap(),
        ];
        let t = 7_000_250_000;
        for quota in &quotas {
            // From nothing: nothing again.
            assert_eq!(round(quota, &None, t, 2, t), None, "{quota:?}");
            // From some use: that use again.
            let mut used = None;
            decide(quota, &mut used, t - 100_000, 1);
            let after = round(quota, &used, t, 2, t);
            let mut expected = used.clone();
            // The log and the buckets compare as stored; the windows too.
            if let (Some(State::Log(a)), Some(State::Log(b))) = (&after, &mut expected) {
                assert_eq!(a, b, "{quota:?}");
            } else {
                assert_eq!(after, expected, "{quota:?}");
            }
        }
    }

    #[test]
    fn a_window_refund_finds_its_window_or_gives_nothing() {
        let quota = Quota::fixed_window(3, Duration::from_secs(1)).unwrap();
        let t = 5_000_900_000;
        let mut state = None;
        let (d, _) = decide(&quota, &mut state, t, 1);
        // 0.2 s later the window ended: the next one's count is not touched.
        let (_, _) = decide(&quota, &mut state, t + 200_000, 1);
        assert_eq!(
            Refund::of(&quota, &d, 1, 200_000, 0),
            None,
            "its window ended"
        );
        // Measured on a clock 30 ms off: still the right window.
        let mut state = None;
        let (d, _) = decide(&quota, &mut state, t, 2);
        let r = Refund::of(&quota, &d, 2, 10_000, 0).unwrap();
        refund(&quota, &mut state, t + 40_000, &r);
        assert_eq!(state, None);

        let sliding = Quota::sliding_window(3, Duration::from_secs(1)).unwrap();
        let mut state = None;
        let (d, _) = decide(&sliding, &mut state, t, 2);
        // In the next window the admission is the previous window's count.
        decide(&sliding, &mut state, t + 600_000, 0);
        let r = Refund::of(&sliding, &d, 2, 600_000, 0).unwrap();
        let mut after = state.clone();
        refund(&sliding, &mut after, t + 600_000, &r);
        assert_eq!(after, None, "the previous window's count is given back");
        // Two windows on, it weighs nothing: nothing to give.
        assert_eq!(Refund::of(&sliding, &d, 2, 1_200_000, 0), None);
    }

    #[test]
    fn a_log_refund_removes_its_entries_once() {
        let quota = Quota::sliding_log(5, Duration::from_secs(1)).unwrap();
        let mut state = None;
        let (first, _) = decide(&quota, &mut state, 1_000, 2);
        decide(&quota, &mut state, 2_000, 1);
        let r = Refund::of(&quota, &first, 2, 1_500, 0).unwrap();
        refund(&quota, &mut state, 2_500, &r);
        refund(&quota, &mut state, 2_500, &r);
        assert_eq!(
            state,
            Some(State::Log([2_000].into())),
            "the other admission stays"
        );
    }

    /// A refund gives back only the part of its admission the bucket has
    /// not refilled: an admission whose tokens came back before later ones
    /// were taken gives nothing, and the later ones stay taken.
    #[test]
    fn a_bucket_refund_never_gives_back_tokens_that_already_refilled() {
        let quota = Quota::builder(Algorithm::TokenBucket)
            .capacity(2)
            .rate("1/s".parse().unwrap())
            .build()
            .unwrap();
        let mut state = None;
        let (first, _) = decide(&quota, &mut state, 0, 1);
        // Two seconds on, the bucket is full again; two more are taken.
        decide(&quota, &mut state, 2_000_000, 1);
        decide(&quota, &mut state, 2_000_000, 1);
        assert_eq!(Refund::of(&quota, &first, 1, 2_000_000, 0), None);
        // Half a second on, half of an admission is still owed.
        let (third, _) = decide(&quota, &mut state, 2_500_000, 0);
        assert!(third.allowed);
        let mut state = None;
        let (one, _) = decide(&quota, &mut state, 0, 1);
        let r = Refund::of(&quota, &one, 1, 500_000, 0).unwrap();
        assert_eq!(r.units, 500_000, "half a token's units");
        refund(&quota, &mut state, 500_000, &r);
        assert_eq!(state, None, "the bucket is full again");
    }

    #[test]
    fn a_bucket_refund_never_fills_past_full() {
        let quota = Quota::builder(Algorithm::TokenBucket)
            .capacity(4)
            .rate("1/s".parse().unwrap())
            .build()
            .unwrap();
        let mut state = None;
        let (d, _) = decide(&quota, &mut state, 10_000_000, 3);
        // 2.5 s later the bucket owes half a token: the refund fills it.
        let r = Refund::of(&quota, &d, 3, 2_500_000, 0).unwrap();
        assert_eq!(r.units, 500_000, "what is left of the three tokens");
        refund(&quota, &mut state, 12_500_000, &r);
        assert_eq!(state, None);
    }
}
