//! The sliding window counter: the current fixed window's count plus the
//! previous window's, weighted by the share of the previous window the
//! sliding window still covers. Weights move in whole milliseconds. Redis
//! stores `"<start_us>:<current>:<previous>"`: the instant the current
//! window began, which keeps its meaning when the quota changes (a count
//! begun inside the current window is current, one begun in the window
//! before is previous, an older one is gone).
//!
//! Error bound: the estimate assumes the previous window's requests were
//! spread evenly. The count admitted in any window of length `window` never
//! exceeds `2 * limit` (the fixed window's bound), and within each aligned
//! window it never exceeds `limit`.

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
    let window_ms = window / 1_000;
    let limit = quota.capacity();
    let this = now - now % window;
    let (start, current, previous) = match *state {
        // Begun in this window, or later (the clock went back): it counts,
        // in the window holding it.
        Some(State::Windows {
            start,
            current,
            previous,
        }) if start >= this => ((start - start % window).max(this), current, previous),
        Some(State::Windows { start, current, .. }) if start + window >= this => (this, 0, current),
        _ => (this, 0, 0),
    };
    let end = start + window;
    // Before the window's start only after the clock went back: count the
    // previous window fully then.
    let elapsed_ms = now.saturating_sub(start) / 1_000;
    let weight = window_ms - elapsed_ms;
    // Everything is scaled by window_ms to stay in integers.
    let used = previous * weight + current * window_ms;
    let capacity = limit * window_ms;

    if used + cost * window_ms > capacity {
        let retry_at = retry_at(limit, cost, current, previous, window_ms, start, end);
        let d = decision(
            quota,
            false,
            capacity.saturating_sub(used) / window_ms,
            retry_at - now,
            reset_at(current, previous, end, window).saturating_sub(now),
            0,
        );
        return (d, false);
    }
    let current = current + cost;
    let used = used + cost * window_ms;
    let d = decision(
        quota,
        true,
        (capacity - used) / window_ms,
        0,
        reset_at(current, previous, end, window).saturating_sub(now),
        0,
    );
    if cost == 0 {
        return (d, false);
    }
    *state = Some(State::Windows {
        start,
        current,
        previous,
    });
    (d, true)
}

/// The first instant at which `cost` fits, in this window (as the previous
/// window's weight fades) or in a later one.
fn retry_at(
    limit: u64,
    cost: u64,
    current: u64,
    previous: u64,
    window_ms: u64,
    start: u64,
    end: u64,
) -> u64 {
    // In this window: previous * (window_ms - e) <= (limit - current - cost) * window_ms.
    if let Some(room) = limit.checked_sub(current + cost) {
        if let Some(share) = (room * window_ms).checked_div(previous) {
            let e = window_ms - share.min(window_ms);
            if e < window_ms {
                return start + e * 1_000;
            }
        }
    }
    // In the next window, where this window's count becomes the previous one:
    // current * (window_ms - e) <= (limit - cost) * window_ms.
    let room = limit - cost;
    let e = (room * window_ms)
        .checked_div(current)
        .map_or(0, |share| window_ms - share.min(window_ms));
    end + e * 1_000
}

/// When the estimate is back to zero.
fn reset_at(current: u64, previous: u64, end: u64, window: u64) -> u64 {
    if current > 0 {
        end + window
    } else if previous > 0 {
        end
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::run;
    use crate::quota::Quota;
    use std::time::Duration;

    #[test]
    fn the_previous_window_fades_by_the_millisecond() {
        let quota = Quota::sliding_window(4, Duration::from_secs(1)).unwrap();
        let start = 20_000_000;
        // Four at the end of one window; in the next, at 50% overlap the
        // estimate is 2, so two more fit, and the third waits for the weight
        // to fall to 1 at 75%.
        let mut events: Vec<(u64, u64)> = vec![(start - 1_000, 1); 4];
        events.extend([
            (start + 500_000, 1),
            (start + 500_000, 1),
            (start + 500_000, 1),
        ]);
        let d = run(&quota, &events);
        let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, true, true, true, false]);
        assert_eq!(d[6].retry_after.as_micros(), 250_000);
    }
}
