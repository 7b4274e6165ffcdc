//! At most `limit` per window, windows aligned to the Unix epoch. The state is
//! the instant the counted window began and its count, written with the
//! window's expiry in one script, so a counter can never be left without
//! expiry. Redis stores `"<start_us>:<count>"`.
//!
//! The state is an instant, not a window number, so it keeps its meaning
//! when the quota changes: a count whose window began inside the current
//! window (of the quota deciding now) was consumed inside it and counts; an
//! older one does not. A count above a lowered limit is a denial with
//! nothing remaining until the current window ends.

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
    let current = now - now % window;
    let (start, count) = match *state {
        // Counted in a window that began in ours, or later (the clock went
        // back): it still counts, from the start of its window as this
        // quota cuts windows, which a refund of an admission counted here
        // names (a count carried from a shorter window began inside it).
        Some(State::Window { start, count }) if start >= current => (start - start % window, count),
        _ => (current, 0),
    };
    let until_end = window_end(start, current, window).saturating_sub(now);

    if count + cost > limit {
        let d = decision(
            quota,
            false,
            limit.saturating_sub(count),
            until_end,
            until_end,
            0,
        );
        return (d, false);
    }
    let count = count + cost;
    let d = decision(quota, true, limit - count, 0, until_end, 0);
    if cost == 0 {
        return (d, false);
    }
    *state = Some(State::Window { start, count });
    (d, true)
}

/// The end of the window a count begun at `start` belongs to: the current
/// window's (beginning at `current`) when it began inside it, else (only
/// after the clock went back) the end of the window holding `start`.
pub(crate) fn window_end(start: u64, current: u64, window: u64) -> u64 {
    if start < current + window {
        current + window
    } else {
        start - start % window + window
    }
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
