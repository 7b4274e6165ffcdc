//! A call's arguments after its keys, read and checked whole before anything
//! is decided: a call the module refuses has written nothing.

use ratelimit_core::native::{unsigned, Group};
use redis_module::{RedisError, RedisString};

/// Fields per request in the call's table of requests (see entry.lua).
const REQUEST_FIELDS: usize = 6;
/// Fields per group, after the requests: a count of keys and its request.
const GROUP_FIELDS: usize = 2;

/// What a call asks for.
pub(crate) struct Plan {
    pub mode: Mode,
    /// In 'runs' mode, the end (exclusive) of each run's keys and whether it
    /// is all or nothing.
    pub runs: Option<Vec<(usize, bool)>>,
    pub groups: Vec<Planned>,
    /// In 'batch' mode, how many keys follow the count in `argv` (the call
    /// names no key of its own).
    pub batch: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Each,
    All,
    Peek,
    Refund,
    Runs,
    /// 'each' over keys of several slots of this Redis Cluster node, sent
    /// after the mode and their count.
    Batch,
}

/// One group: keys `first..last`, its quota, cost and clock.
pub(crate) struct Planned {
    pub first: usize,
    pub last: usize,
    pub group: Group,
    pub cost: u64,
    /// The caller's clock, or `None` for this server's.
    pub now: Option<u64>,
}

/// A refusal of the call's arguments, before anything is written.
fn refused(what: &str) -> RedisError {
    RedisError::String(format!("RLARGS {what}"))
}

/// An unsigned number argument.
pub(crate) fn number(arg: &RedisString) -> Result<u64, RedisError> {
    unsigned(arg.as_slice()).ok_or_else(|| refused("a number was expected"))
}

/// A signed number argument (a run's length, a refund's `until_end`).
fn signed(arg: &RedisString) -> Result<i64, RedisError> {
    std::str::from_utf8(arg.as_slice())
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| refused("a number was expected"))
}

/// One request of the call's table: its quota, cost and clock.
fn request(fields: &[RedisString], refund: bool) -> Result<(Group, u64, Option<u64>), RedisError> {
    let algorithm = number(&fields[0])?;
    let cost = number(&fields[1])?;
    let now = if fields[2].as_slice().is_empty() {
        None
    } else {
        Some(number(&fields[2])?)
    };
    let p3 = if refund {
        // Signed for the windows (`until_end`), sent as its bits.
        signed(&fields[5])? as u64
    } else {
        number(&fields[5])?
    };
    let params = [number(&fields[3])?, number(&fields[4])?, p3];
    let group =
        Group::new(algorithm, params, refund).ok_or_else(|| refused("a request names no quota"))?;
    if !group.accepts(cost, now, refund) {
        return Err(refused(
            "a cost above the quota's capacity, or an instant of 2^52 microseconds or more",
        ));
    }
    Ok((group, cost, now))
}

/// Reads `argv` (the mode and what follows it) for a call of `keys` keys.
pub(crate) fn plan(argv: &[RedisString], mut keys: usize) -> Result<Plan, RedisError> {
    let mode = match argv.first().map(|a| a.as_slice()) {
        Some(b"each") => Mode::Each,
        Some(b"all") => Mode::All,
        Some(b"peek") => Mode::Peek,
        Some(b"refund") => Mode::Refund,
        Some(b"runs") => Mode::Runs,
        Some(b"batch") => Mode::Batch,
        _ => return Err(refused("an unknown mode")),
    };
    let mut first_group = 1;
    let mut runs = None;
    let mut batch = None;
    if mode == Mode::Batch {
        keys = argv
            .get(1)
            .map(number)
            .transpose()?
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= argv.len().saturating_sub(2))
            .ok_or_else(|| refused("a count of keys was expected"))?;
        batch = Some(keys);
        first_group = 2 + keys;
    }
    if mode == Mode::Runs {
        let count = argv
            .get(1)
            .map(number)
            .transpose()?
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= argv.len())
            .ok_or_else(|| refused("a count of runs was expected"))?;
        let mut through = 0usize;
        let mut list = Vec::with_capacity(count);
        for r in 0..count {
            let length = argv
                .get(2 + r)
                .ok_or_else(|| refused("a run's length is missing"))?;
            let length = signed(length)?;
            through = usize::try_from(length.unsigned_abs())
                .ok()
                .and_then(|n| through.checked_add(n))
                .filter(|&n| n <= keys)
                .ok_or_else(|| refused("the runs name more keys than the call"))?;
            list.push((through, length < 0));
        }
        runs = Some(list);
        first_group = 2 + count;
    }
    let refund = mode == Mode::Refund;
    let count = argv
        .get(first_group)
        .map(number)
        .transpose()?
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= argv.len() / REQUEST_FIELDS)
        .ok_or_else(|| refused("a count of requests was expected"))?;
    let mut requests = Vec::with_capacity(count);
    for r in 0..count {
        let at = first_group + 1 + r * REQUEST_FIELDS;
        let fields = argv
            .get(at..at + REQUEST_FIELDS)
            .ok_or_else(|| refused("a request has fewer than 6 fields"))?;
        requests.push(request(fields, refund)?);
    }
    let mut groups = Vec::new();
    let mut last = 0usize;
    let mut g = first_group + 1 + count * REQUEST_FIELDS;
    while g < argv.len() {
        let fields = argv
            .get(g..g + GROUP_FIELDS)
            .ok_or_else(|| refused("a group has fewer than 2 fields"))?;
        let first = last;
        last = usize::try_from(number(&fields[0])?)
            .ok()
            .and_then(|n| last.checked_add(n))
            .filter(|&n| n <= keys)
            .ok_or_else(|| refused("the groups name more keys than the call"))?;
        if let Some(runs) = &runs {
            // A group never spans two runs.
            let run = runs.iter().find(|(end, _)| *end > first);
            if run.is_none_or(|(end, _)| last > *end) {
                return Err(refused("a group spans two runs"));
            }
        }
        let (group, cost, now) = usize::try_from(number(&fields[1])?)
            .ok()
            .and_then(|r| requests.get(r.checked_sub(1)?))
            .ok_or_else(|| refused("a group names no request of the call"))?
            .clone();
        groups.push(Planned {
            first,
            last,
            group,
            cost,
            now,
        });
        g += GROUP_FIELDS;
    }
    Ok(Plan {
        mode,
        runs,
        groups,
        batch,
    })
}
