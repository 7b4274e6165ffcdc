//! Exactly `limit` in any window of length `window`: the log of admitted
//! instants. Redis keeps it as a sorted set scored by the instant, with a
//! member unique per admission; its memory grows with `limit`.
//!
//! An instant `t` is inside the window at `now` while `now < t + window`.

use std::collections::VecDeque;

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
    let cutoff = now.saturating_sub(window);
    if !matches!(state, Some(State::Log(_))) {
        *state = None;
    }
    let (count, oldest_needed, newest) = match state.as_ref() {
        Some(State::Log(log)) => {
            // Instants after the cutoff count, including any ahead of a clock
            // that went backwards.
            let first_inside = log.partition_point(|&t| t <= cutoff);
            let count = (log.len() - first_inside) as u64;
            // The request fits once the oldest `excess` admissions have left.
            let excess = (count + cost).saturating_sub(limit) as usize;
            let oldest_needed = (excess > 0).then(|| log[first_inside + excess - 1]);
            (
                count,
                oldest_needed,
                log.back().copied().filter(|_| count > 0),
            )
        }
        _ => (0, None, None),
    };

    if let Some(oldest) = oldest_needed {
        let reset = newest.map_or(0, |t| t + window - now);
        // A lowered limit can find more admissions than it allows.
        let remaining = limit.saturating_sub(count);
        let d = decision(quota, false, remaining, oldest + window - now, reset, 0);
        return (d, false);
    }
    let reset = newest.map_or(now, |t| t.max(now)) + window - now;
    // The memory backend's entries are instants: the admission's, plus one
    // (0 means no tag), is its tag.
    let d = Decision {
        tag: now + 1,
        ..decision(quota, true, limit - count - cost, 0, reset, 0)
    };
    if cost == 0 {
        return (d, false);
    }
    // `state` holds a log or nothing (see above), so the `else` never runs.
    let State::Log(log) = state.get_or_insert_with(|| State::Log(VecDeque::new())) else {
        return (d, false);
    };
    while log.front().is_some_and(|&t| t <= cutoff) {
        log.pop_front();
    }
    let at = log.partition_point(|&t| t <= now);
    for _ in 0..cost {
        log.insert(at, now);
    }
    (d, true)
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::run;
    use crate::quota::Quota;
    use std::time::Duration;

    #[test]
    fn retry_after_names_when_the_oldest_admission_leaves() {
        let quota = Quota::sliding_log(2, Duration::from_secs(1)).unwrap();
        let t = 9_000_000;
        let d = run(
            &quota,
            &[
                (t, 1),
                (t + 300_000, 1),
                (t + 500_000, 1),
                (t + 999_999, 1),
                (t + 1_000_000, 1),
            ],
        );
        let allowed: Vec<bool> = d.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, false, false, true]);
        assert_eq!(d[2].retry_after.as_micros(), 500_000);
        assert_eq!(d[2].reset_after.as_micros(), 800_000);
    }
}
