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
    // Everything is scaled by window_ms to stay in integers. A count within
    // this quota's limit keeps `used` under 2^52, but one kept under another
    // quota (a limit of bytes a second, then of requests a day) or stored by
    // another hand need not: so the estimate is taken in 128 bits, where it
    // cannot wrap round to room that is not there.
    let used =
        u128::from(previous) * u128::from(weight) + u128::from(current) * u128::from(window_ms);
    let capacity = limit * window_ms;
    let asked = u128::from(cost * window_ms);

    if used + asked > u128::from(capacity) {
        let retry_at = retry_at(limit, cost, current, previous, window_ms, start, end);
        let room = u128::from(capacity).saturating_sub(used) as u64;
        let d = decision(
            quota,
            false,
            room / window_ms,
            retry_at - now,
            reset_at(current, previous, end, window).saturating_sub(now),
            0,
        );
        return (d, false);
    }
    let current = current + cost;
    // Admitted: `used` and the cost fit in the capacity.
    let room = capacity - (used + asked) as u64;
    let d = decision(
        quota,
        true,
        room / window_ms,
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

    /// A count kept under a quota of bytes a second weighs, under a quota of
    /// requests a day, more than 64 bits hold once scaled by the day's
    /// milliseconds: the key is denied, as the script's doubles deny it.
    #[test]
    fn a_count_kept_under_another_quota_is_weighed_without_wrapping() {
        let bytes = Quota::sliding_window(1_000_000_000_000, Duration::from_secs(1)).unwrap();
        let daily = Quota::sliding_window(50_000_000, Duration::from_secs(86_400)).unwrap();
        let now = 1_780_000_000_000_000;
        let mut state = None;
        let (admitted, wrote) = super::decide(&bytes, &mut state, now, 500_000_000_000);
        assert!(admitted.allowed && wrote);
        for later in [0, 1_000, 999_000] {
            let (d, wrote) = super::decide(&daily, &mut state, now + later, 1);
            assert!(!d.allowed && !wrote, "{d:?}");
            assert_eq!(d.remaining, 0);
            assert!(d.retry_after > Duration::from_secs(86_400), "{d:?}");
        }
    }

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
