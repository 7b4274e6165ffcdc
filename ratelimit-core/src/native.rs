//! What the native Redis module (`ratelimit-module`) runs: the memory
//! backend's arithmetic on the values the Lua scripts store, so that a key
//! decided by the module and by the function path reads and writes the same
//! values. Not part of the public API: its shape follows the wire format,
//! which changes with [`WIRE_VERSION`].
//!
//! The module decides each group of the call's arguments (see
//! `scripts/entry.lua`) with a [`Group`], key by key, and answers with the
//! numbers the script would. The sliding log keeps a sorted set, which the
//! module reads and writes itself, as its script does.

use std::time::Duration;

use crate::algorithm::{self, Refund, State};
use crate::quota::{Algorithm, Quota, Rate, MAX_EXACT};

pub use crate::wire_version::WIRE_VERSION;

/// The largest number a stored value may hold: the integers a double holds
/// exactly, which the scripts read. A bucket's `full_at` goes past
/// `MAX_EXACT`: it is an instant (up to 2^52 µs) plus up to a whole depth's
/// wait (up to 2^52 µs), as a slow bucket's does after a few admissions (a
/// bucket of 10 that refills one every ten years: 9 admitted put it 90
/// years from now).
const MAX_STORED: u64 = 1 << 53;

/// One group of a call: an algorithm and its three numbers, as the caller
/// sent them.
#[derive(Debug, Clone)]
pub struct Group {
    quota: Quota,
    /// The third number (the sliding log's tag; a refund's units or
    /// `until_end`).
    p3: u64,
}

/// One key's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What the script answers for the key, `reply[..len]`: one number for
    /// the buckets (the debt before the request), five for the windows
    /// (allowed, remaining, retry after, reset after and delay in µs);
    /// -1 first for a value no algorithm here wrote.
    reply: [i64; 5],
    len: usize,
    /// Whether the key admitted.
    pub admitted: bool,
    /// The value to store, and for how long it matters, in µs.
    pub write: Option<(Value, u64)>,
}

impl Verdict {
    /// The key's numbers in the call's reply.
    pub fn reply(&self) -> &[i64] {
        &self.reply[..self.len]
    }
}

/// What a refund does to a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refunded {
    /// Nothing.
    Unchanged,
    /// Deletes it: nothing is owed any more.
    Delete,
    /// Stores this value, which matters for this many µs.
    Store(Value, u64),
}

impl Group {
    /// The group of `algorithm` (its wire id) and `params`, or `None` for an
    /// id or numbers no quota has. A refund's group (`refund`) has no
    /// capacity among its numbers for the buckets: any will do, as a refund
    /// reads only the rate.
    pub fn new(algorithm: u64, params: [u64; 3], refund: bool) -> Option<Self> {
        let algorithm = Algorithm::ALL
            .into_iter()
            .find(|a| a.wire_id() == algorithm)?;
        let [p1, p2, p3] = params;
        // A bucket's refund takes units off its debt: none is negative.
        if refund && !algorithm.is_windowed() && (p3 as i64) < 0 {
            return None;
        }
        let quota = if algorithm.is_windowed() {
            Quota::builder(algorithm)
                .limit(p1)
                .window(Duration::from_micros(p2))
                .build()
        } else {
            let capacity = if refund { 1 } else { p3 };
            Quota::builder(algorithm)
                .capacity(capacity)
                .rate(Rate::new(p1, Duration::from_micros(p2)).ok()?)
                .build()
        }
        .ok()?;
        // A quota reduces its rate; the caller sends it reduced.
        let same = if algorithm.is_windowed() {
            quota.capacity() == p1 && quota.window_us() == p2
        } else {
            quota.rate().tokens() == p1 && quota.rate().period_us() == p2
        };
        same.then_some(Self { quota, p3 })
    }

    /// Whether this is the sliding log, which the module keeps in a sorted
    /// set itself.
    pub fn is_sliding_log(&self) -> bool {
        self.quota.algorithm() == Algorithm::SlidingLog
    }

    /// The limit (the windows' first number), or the buckets' capacity.
    pub fn limit(&self) -> u64 {
        self.quota.capacity()
    }

    /// Whether the caller may send a request of `cost` at `now` (`None`:
    /// this server's clock): never above the capacity (the caller denies
    /// those itself), which the arithmetic assumes, nor at an instant a
    /// double does not hold exactly. A bucket's refund carries no capacity
    /// and takes any cost.
    pub fn accepts(&self, cost: u64, now: Option<u64>, refund: bool) -> bool {
        let windowed = self.quota.algorithm().is_windowed();
        (cost <= self.quota.capacity() || (refund && !windowed))
            && now.is_none_or(|now| now <= MAX_EXACT)
    }

    /// The answer to a key that holds what no algorithm here wrote.
    pub fn foreign(&self) -> Verdict {
        Verdict {
            reply: [-1, 0, 0, 0, 0],
            len: if self.quota.algorithm().is_windowed() {
                5
            } else {
                1
            },
            admitted: false,
            write: None,
        }
    }

    /// The window in µs (the windows' second number).
    pub fn window_us(&self) -> u64 {
        self.quota.window_us()
    }

    /// The third number as sent.
    pub fn p3(&self) -> u64 {
        self.p3
    }

    /// Decides a request of `cost` at `now` on a key holding `stored`, as
    /// the script does. Not for the sliding log.
    pub fn decide(&self, stored: Option<&[u8]>, now: u64, cost: u64) -> Verdict {
        let quota = &self.quota;
        let mut state = match stored.map(|value| parse(quota.algorithm(), value)) {
            None => None,
            Some(None) => return self.foreign(),
            Some(state) => state,
        };
        let (decision, wrote) = algorithm::decide(quota, &mut state, now, cost);
        let (reply, len) = if quota.algorithm().is_windowed() {
            let us = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
            let numbers = [
                i64::from(decision.allowed),
                i64::try_from(decision.remaining).unwrap_or(i64::MAX),
                us(decision.retry_after),
                us(decision.reset_after),
                us(decision.delay),
            ];
            (numbers, 5)
        } else {
            // The debt before the request: an admission's decision carries
            // the debt after it.
            let debt = decision.debt.unwrap_or(0);
            let paid = if decision.allowed {
                cost * quota.rate().period_us()
            } else {
                0
            };
            ([(debt - paid) as i64, 0, 0, 0, 0], 1)
        };
        let write = match (&state, wrote) {
            (Some(state), true) => {
                // A written state matters until the key is whole again.
                let ttl = u64::try_from(decision.reset_after.as_micros()).unwrap_or(u64::MAX);
                Some((format(state), ttl))
            }
            _ => None,
        };
        Verdict {
            reply,
            len,
            admitted: decision.allowed,
            write,
        }
    }

    /// Gives `cost` back to a key holding `stored` at `now`, as the script's
    /// refund does; the group's third number is the buckets' units or the
    /// windows' `until_end` (as sent: signed). Not for the sliding log.
    pub fn refund(&self, stored: Option<&[u8]>, now: u64, cost: u64) -> Refunded {
        let quota = &self.quota;
        let Some(mut state) = stored.and_then(|value| parse(quota.algorithm(), value)) else {
            return Refunded::Unchanged;
        };
        let before = state.clone();
        let refund = Refund {
            cost,
            tag: 0,
            units: self.p3,
            until_end: self.p3 as i64,
        };
        let mut held = Some(state);
        algorithm::refund(quota, &mut held, now, &refund);
        match held {
            None => Refunded::Delete,
            Some(after) if after == before => Refunded::Unchanged,
            Some(after) => {
                state = after;
                let ttl = match &state {
                    State::Tat { full_at, rem } => {
                        let tokens = quota.rate().tokens();
                        ((full_at - now) * tokens + rem).div_ceil(tokens)
                    }
                    State::Window { start, .. } => {
                        let window = quota.window_us();
                        algorithm::window_end(*start, now - now % window, window) - now
                    }
                    State::Windows { start, .. } => {
                        let window = quota.window_us();
                        (start - start % window + 2 * window).saturating_sub(now)
                    }
                    State::Log(_) => 0,
                };
                Refunded::Store(format(&state), ttl)
            }
        }
    }
}

/// A number argument as `str::parse::<u64>` reads it (an optional `+`,
/// then digits), read in one pass: a call carries a dozen numbers a check
/// of three keys.
pub fn unsigned(text: &[u8]) -> Option<u64> {
    let digits = text.strip_prefix(b"+").unwrap_or(text);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &byte| {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The state a stored value holds, as the algorithm's script parses it, or
/// `None` for a value it did not write.
fn parse(algorithm: Algorithm, value: &[u8]) -> Option<State> {
    // Up to three numbers joined by colons: digits only, as the scripts'
    // patterns match, none above `MAX_STORED` (no script here writes one).
    // Read in one pass: a decision's cost to Redis is counted in
    // instructions, and a value is read at every decision.
    let mut numbers = [0u64; 3];
    let mut count = 0;
    let mut digits = 0;
    for &byte in value {
        if byte == b':' {
            if digits == 0 {
                return None;
            }
            count += 1;
            digits = 0;
            continue;
        }
        let digit = byte.wrapping_sub(b'0');
        let slot = numbers.get_mut(count)?;
        if digit > 9 {
            return None;
        }
        *slot = slot
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(digit)))
            .filter(|&n| n <= MAX_STORED)?;
        digits += 1;
    }
    if digits == 0 {
        return None;
    }
    count += 1;
    match (algorithm, count, numbers) {
        (
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket,
            1 | 2,
            [full_at, rem, _],
        ) => Some(State::Tat { full_at, rem }),
        (Algorithm::FixedWindow, 2, [start, count, _]) => Some(State::Window { start, count }),
        (Algorithm::SlidingWindow, 3, [start, current, previous]) => Some(State::Windows {
            start,
            current,
            previous,
        }),
        _ => None,
    }
}

/// A value as the scripts store it (up to three numbers joined by colons),
/// held in place: written at every decision, it allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Value {
    /// Three numbers of 20 digits at most and two colons, in the first
    /// `len` bytes.
    text: [u8; 62],
    len: u8,
}

impl Value {
    /// Its bytes: ASCII digits and colons.
    pub fn as_bytes(&self) -> &[u8] {
        &self.text[..usize::from(self.len)]
    }

    /// Appends `bytes`; a value holds at most 62.
    fn push(&mut self, bytes: &[u8]) {
        let at = usize::from(self.len);
        self.text[at..at + bytes.len()].copy_from_slice(bytes);
        // At most 62.
        self.len = (at + bytes.len()) as u8;
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

/// A state as its script stores it.
fn format(state: &State) -> Value {
    let numbers: &[u64] = match state {
        State::Tat { full_at, rem: 0 } => &[*full_at],
        State::Tat { full_at, rem } => &[*full_at, *rem],
        State::Window { start, count } => &[*start, *count],
        State::Windows {
            start,
            current,
            previous,
        } => &[*start, *current, *previous],
        State::Log(_) => &[],
    };
    // itoa, not `format!`: the formatting machinery took most of what a
    // decision's arithmetic costs.
    let mut value = Value {
        text: [0; 62],
        len: 0,
    };
    let mut digits = itoa::Buffer::new();
    for (i, &n) in numbers.iter().enumerate() {
        if i > 0 {
            value.push(b":");
        }
        value.push(digits.format(n).as_bytes());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_back_as_written() {
        for (algorithm, value) in [
            (Algorithm::Gcra, "1700000000000000"),
            (Algorithm::Gcra, "1700000000000000:7"),
            (Algorithm::FixedWindow, "1700000000000000:3"),
            (Algorithm::SlidingWindow, "1700000000000000:3:9"),
        ] {
            let state = parse(algorithm, value.as_bytes()).unwrap();
            let written = format(&state);
            assert_eq!(written.as_bytes(), value.as_bytes());
        }
    }

    /// The reading of the scripts' patterns one number at a time, which
    /// `parse` does in one pass.
    fn parsed_by_parts(algorithm: Algorithm, value: &[u8]) -> Option<State> {
        let mut n = Vec::new();
        for part in std::str::from_utf8(value).ok()?.split(':') {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            n.push(part.parse::<u64>().ok().filter(|&n| n <= MAX_STORED)?);
        }
        match (algorithm, n.as_slice()) {
            (Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket, &[full_at]) => {
                Some(State::Tat { full_at, rem: 0 })
            }
            (
                Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::LeakyBucket,
                &[full_at, rem],
            ) => Some(State::Tat { full_at, rem }),
            (Algorithm::FixedWindow, &[start, count]) => Some(State::Window { start, count }),
            (Algorithm::SlidingWindow, &[start, current, previous]) => Some(State::Windows {
                start,
                current,
                previous,
            }),
            _ => None,
        }
    }

    /// `format`, as `format!` writes it.
    fn formatted_by_fmt(state: &State) -> String {
        match state {
            State::Tat { full_at, rem: 0 } => full_at.to_string(),
            State::Tat { full_at, rem } => format!("{full_at}:{rem}"),
            State::Window { start, count } => format!("{start}:{count}"),
            State::Windows {
                start,
                current,
                previous,
            } => format!("{start}:{current}:{previous}"),
            State::Log(_) => String::new(),
        }
    }

    proptest::proptest! {
        /// Values of digits, colons and other bytes, with numbers around
        /// 2^52, 2^53 and u64's end: read as the scripts' patterns read
        /// them, and written back as `format!` writes them.
        #[test]
        fn values_read_and_write_as_the_scripts_patterns_do(
            value in proptest::prop_oneof![
                "[0-9:]{0,24}",
                "[0-9]{1,20}(:[0-9]{1,20}){0,3}",
                "[0-9:a+ -]{0,12}",
            ],
            big in proptest::prop_oneof![
                MAX_EXACT - 2..=MAX_EXACT + 2,
                MAX_STORED - 2..=MAX_STORED + 2,
                u64::MAX - 2..=u64::MAX,
                0u64..100,
            ],
        ) {
            for value in [value.clone(), format!("{big}"), format!("{value}{big}"), format!("{big}:{value}")] {
                for algorithm in Algorithm::ALL {
                    let parsed = parse(algorithm, value.as_bytes());
                    proptest::prop_assert_eq!(&parsed, &parsed_by_parts(algorithm, value.as_bytes()), "{:?}", value);
                    if let Some(state) = parsed {
                        let written = format(&state);
                        let by_fmt = formatted_by_fmt(&state);
                        proptest::prop_assert_eq!(written.as_bytes(), by_fmt.as_bytes());
                    }
                }
            }
        }
    }

    use proptest::strategy::Strategy as _;

    proptest::proptest! {
        #[test]
        fn numbers_read_as_str_parse_reads_them(
            text in proptest::prop_oneof![
                "[+0-9]{0,22}",
                "[0-9 a+-]{0,6}",
                proptest::prelude::any::<u64>().prop_map(|n| n.to_string()),
                (proptest::prelude::any::<u64>(), 0u8..10).prop_map(|(n, d)| format!("{n}{d}")),
            ],
        ) {
            proptest::prop_assert_eq!(unsigned(text.as_bytes()), text.parse::<u64>().ok(), "{:?}", text);
        }
    }

    #[test]
    fn values_no_algorithm_here_wrote_are_foreign() {
        for (algorithm, value) in [
            (Algorithm::Gcra, "-5"),
            (Algorithm::Gcra, "1:2:3"),
            (Algorithm::Gcra, "1:"),
            (Algorithm::Gcra, "\0"),
            (Algorithm::FixedWindow, "12"),
            (Algorithm::SlidingWindow, "1:2"),
            (Algorithm::SlidingWindow, "1:2:x"),
            (Algorithm::Gcra, "18446744073709551615"),
        ] {
            assert_eq!(parse(algorithm, value.as_bytes()), None, "{value:?}");
        }
    }

    #[test]
    fn groups_refuse_numbers_no_quota_has() {
        assert!(Group::new(1, [1, 500_000, 10], false).is_some());
        assert!(Group::new(9, [1, 500_000, 10], false).is_none());
        assert!(Group::new(1, [0, 500_000, 10], false).is_none());
        // Not reduced: the caller always sends a reduced rate.
        assert!(Group::new(1, [2, 1_000_000, 10], false).is_none());
        assert!(Group::new(2, [10, 0, 0], false).is_none());
        // A bucket's refund gives units back, never takes them.
        assert!(Group::new(1, [1, 500_000, 5], true).is_some());
        assert!(Group::new(1, [1, 500_000, -5i64 as u64], true).is_none());
        // A window's refund names its window's end, before or after now.
        assert!(Group::new(2, [10, 1_000_000, -5i64 as u64], true).is_some());
    }
}
