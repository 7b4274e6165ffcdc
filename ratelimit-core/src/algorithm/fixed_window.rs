//! At most `limit` per window, windows aligned to the Unix epoch. The state is
//! the window's number and its count, written with the window's expiry in
//! one script, so a counter can never be left without expiry. Redis stores
//! `"<index>:<count>"`.

use super::{decision, State};
use crate::decision::Decision;
use crate::quota::Quota;

pub(super) fn decide(
    quota: &Quota,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
) -> (Decision, bool) {
    let window = quota.window_us();
    let limit = quota.capacity();
    let (index, count) = match *state {
        // A stored window at or after ours (the clock went back) still counts.
        Some(State::Window { index, count }) if index >= now / window => (index, count),
        _ => (now / window, 0),
    };
    let end = (index + 1) * window;
    let until_end = end.saturating_sub(now);

    if count + cost > limit {
        let d = decision(quota, false, limit - count, until_end, until_end, 0);
        return (d, false);
    }
    let count = count + cost;
    let d = decision(quota, true, limit - count, 0, until_end, 0);
    if cost == 0 {
        return (d, false);
    }
    *state = Some(State::Window { index, count });
    (d, true)
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::run;
    use crate::quota::Quota;
    use std::time::Duration;

    #[test]
    fn allows_the_boundary_double_burst_and_resets_at_the_window_end() {
        let quota = Quota::fixed_window(2, Duration::from_secs(1)).unwrap();
        let end = 5_000_000;
        let d = run(
            &quota,
            &[
                (end - 10, 1),
                (end - 5, 1),
                (end - 1, 1),
                (end, 1),
                (end, 1),
                (end + 1, 1),
            ],
        );
        let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, false, true, true, false]);
        assert_eq!(d[2].retry_after.as_micros(), 1);
        assert_eq!(d[5].retry_after.as_micros(), 999_999);
    }
}
