//! The script's arguments and replies: requests encoded as groups of
//! fields, replies decoded into decisions.

use std::collections::HashSet;

use crate::algorithm::{gcra, Refund};
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::{Algorithm, Quota};

use super::script::{ScriptCall, SCRIPT};

/// One key's request: what the script needs besides the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Request {
    pub algorithm: u64,
    pub cost: u64,
    /// The caller's clock, or `None` for Redis `TIME`.
    pub now: Option<u64>,
    pub params: [u64; 3],
    /// Whether the third number is signed (a refund's `until_end`).
    signed_p3: bool,
}

impl Request {
    /// A decision. The sliding log records its admission under a tag
    /// unique to this request, so that a refund with the same tag removes
    /// exactly what it added, however often it is applied: each such request
    /// is a group of its own. The other algorithms take no tag.
    pub(crate) fn new(quota: &Quota, cost: u64, now: Option<u64>) -> Self {
        let tag = if quota.algorithm() == Algorithm::SlidingLog {
            refund_tag()
        } else {
            0
        };
        Self::with_p3(quota, cost, now, tag)
    }

    /// The refund of an admission on `quota` (see `refund.lua`): the
    /// buckets' third number is the debt to take off, the windows'
    /// `until_end`, the sliding log's the tag.
    pub(crate) fn refund(quota: &Quota, refund: &Refund, now: Option<u64>) -> Self {
        let algorithm = quota.algorithm();
        let mut request = Self::with_p3(quota, refund.cost, now, 0);
        let windows = matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow);
        request.params[2] = match algorithm {
            Algorithm::SlidingLog => refund.tag,
            // Encoded as an unsigned number (the script reads it back as
            // signed, see `push_fields`).
            _ if windows => refund.until_end as u64,
            _ => refund.units,
        };
        request.signed_p3 = windows;
        request
    }

    /// The sliding log's tag of this request's admission (0: none).
    pub(crate) fn tag(&self) -> u64 {
        if self.algorithm == Algorithm::SlidingLog.wire_id() {
            self.params[2]
        } else {
            0
        }
    }

    fn with_p3(quota: &Quota, cost: u64, now: Option<u64>, p3: u64) -> Self {
        let rate = quota.rate();
        let algorithm = quota.algorithm();
        let params = if algorithm.is_windowed() {
            [quota.capacity(), quota.window_us(), p3]
        } else {
            [rate.tokens(), rate.period_us(), quota.capacity()]
        };
        Self {
            algorithm: algorithm.wire_id(),
            cost,
            now,
            params,
            signed_p3: false,
        }
    }

    /// Adds the six fields of this request to the call's table of requests.
    fn push_fields(&self, invocation: &mut ScriptCall) {
        invocation.arg(self.algorithm).arg(self.cost);
        match self.now {
            Some(now) => invocation.arg(now),
            None => invocation.arg(""),
        };
        invocation.arg(self.params[0]).arg(self.params[1]);
        if self.signed_p3 {
            invocation.arg(self.params[2] as i64);
        } else {
            invocation.arg(self.params[2]);
        }
    }
}

/// Adds `groups` to the call (see entry.lua): the table of their distinct
/// requests (its length, then six fields each), then each group as its
/// count of keys and its request's place in the table, from 1. A check of
/// several limits names each of its quotas once a call, not once a check.
pub(super) fn push_groups(groups: &[(usize, Request)], invocation: &mut ScriptCall) {
    let mut table: Vec<Request> = Vec::new();
    // foldhash (hashbrown's default), which costs a fraction of std's
    // SipHash: a call of checks of three limits looks up some 60 groups.
    let mut places: hashbrown::HashMap<Request, usize> = hashbrown::HashMap::new();
    let indexes: Vec<usize> = groups
        .iter()
        .map(|(_, request)| {
            *places.entry(*request).or_insert_with(|| {
                table.push(*request);
                table.len()
            })
        })
        .collect();
    invocation.arg(table.len());
    for request in &table {
        request.push_fields(invocation);
    }
    for ((count, _), index) in groups.iter().zip(indexes) {
        invocation.arg(*count).arg(index);
    }
}

/// Prepares one script call in `mode` for `requests`, in order: their keys,
/// and one group of fields for each run of equal requests on distinct keys
/// (concurrent decisions on one quota make one group, so Redis reads one
/// argument a key). A key named again starts a new group: the script reads a
/// group's values before any of its decisions writes.
pub(crate) fn invocation<'a, K: AsRef<str> + 'a>(
    mode: &str,
    requests: impl IntoIterator<Item = (&'a K, Request)>,
) -> ScriptCall {
    let mut invocation = ScriptCall::new(&SCRIPT);
    invocation.arg(mode);
    let (keys, groups) = grouped(requests);
    for key in keys {
        invocation.key(key);
    }
    push_groups(&groups, &mut invocation);
    invocation
}

/// Prepares one 'batch' call of `script` (the script flagged for keys of
/// several slots) for `requests`, whose keys all live on the Redis Cluster
/// master serving `slot`, where it is sent. It names no key (they go in
/// ARGV, then the groups): the node decides the keys it serves now, and the
/// user may touch, and names the others, where Redis would refuse the whole
/// call for a key it names.
#[cfg(feature = "cluster")]
pub(crate) fn batch_invocation<'a, K: AsRef<str> + 'a>(
    script: &'static redis::Script,
    slot: u16,
    requests: impl IntoIterator<Item = (&'a K, Request)>,
) -> ScriptCall {
    let mut invocation = ScriptCall::new(script);
    let (keys, groups) = grouped(requests);
    invocation.sent_to_slot(slot).arg("batch").arg(keys.len());
    for key in keys {
        invocation.arg(key);
    }
    push_groups(&groups, &mut invocation);
    invocation
}

/// The keys of `requests` in order, and the groups that stand for them: a
/// count of keys and their request, for each run of equal requests on
/// distinct keys.
pub(super) fn grouped<'a, K: AsRef<str> + 'a>(
    requests: impl IntoIterator<Item = (&'a K, Request)>,
) -> (Vec<&'a str>, Vec<(usize, Request)>) {
    let mut keys = Vec::new();
    let mut groups = Vec::new();
    let mut run: Option<Request> = None;
    let mut run_keys: HashSet<&str> = HashSet::new();
    for (key, request) in requests {
        let key = key.as_ref();
        if let Some(current) = run {
            if current != request || run_keys.contains(key) {
                groups.push((run_keys.len(), current));
                run_keys.clear();
            }
        }
        run = Some(request);
        run_keys.insert(key);
        keys.push(key);
    }
    if let Some(current) = run {
        groups.push((run_keys.len(), current));
    }
    (keys, groups)
}

/// How many numbers the script answers for one key of `algorithm`: the
/// bucket algorithms answer with the debt their decision follows from.
pub(super) fn answer_len(algorithm: Algorithm) -> usize {
    if algorithm.is_windowed() {
        5
    } else {
        1
    }
}

/// Reads each key's decision from a script reply, in order: `keys` gives
/// each key's quota, cost and full name. A reply of the wrong length is one
/// error for the whole call.
pub(crate) fn decode_reply<'a>(
    reply: &[i64],
    keys: impl IntoIterator<Item = (&'a Quota, &'a Request, &'a str)>,
) -> Result<Vec<Result<Decision, Error>>, Error> {
    let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
    let mut rest = reply;
    let mut decisions = Vec::new();
    for (quota, request, key) in keys {
        let len = answer_len(quota.algorithm());
        if rest.len() < len {
            return Err(unexpected());
        }
        let (answer, tail) = rest.split_at(len);
        rest = tail;
        decisions.push(decode(quota, request, key, answer));
    }
    if !rest.is_empty() {
        return Err(unexpected());
    }
    Ok(decisions)
}

/// The decisions of an all-or-nothing call on `requests`, whose full key
/// names are `keys`: every one, or the first error.
#[cfg(feature = "cluster")]
pub(crate) fn decode_all(
    reply: &[i64],
    requests: &[(&Quota, &str, u64)],
    calls: &[Request],
    keys: &[String],
) -> Result<Vec<Decision>, Error> {
    decode_reply(
        reply,
        requests
            .iter()
            .zip(calls)
            .zip(keys)
            .map(|(((quota, _, _), call), key)| (*quota, call, key.as_str())),
    )?
    .into_iter()
    .collect()
}

/// The decision of a script call on one key.
pub(crate) fn decode_one(
    reply: &[i64],
    quota: &Quota,
    request: &Request,
    key: &str,
) -> Result<Decision, Error> {
    decode_reply(reply, [(quota, request, key)])?
        .pop()
        .unwrap_or_else(|| Err(Error::UnexpectedReply(format!("{reply:?}"))))
}

/// One key's decision from its answer, whose length `answer_len` gave: one
/// number (the debt) for the bucket algorithms, five for the windows.
pub(super) fn decode(
    quota: &Quota,
    request: &Request,
    key: &str,
    answer: &[i64],
) -> Result<Decision, Error> {
    let algorithm = quota.algorithm();
    let cost = request.cost;
    match *answer {
        [-1, ..] => Err(Error::ForeignValue {
            key: key.to_owned(),
            algorithm,
        }),
        [debt] if debt >= 0 => Ok(gcra::decide_debt(
            quota,
            debt as u64,
            cost,
            algorithm == Algorithm::LeakyBucket,
        )),
        [allowed @ (0 | 1), remaining, retry, reset, delay]
            if remaining >= 0 && retry >= 0 && reset >= 0 && delay >= 0 =>
        {
            Ok(Decision {
                tag: request.tag(),
                ..Decision::from_micros(
                    allowed == 1,
                    quota.capacity(),
                    remaining as u64,
                    retry as u64,
                    reset as u64,
                    delay as u64,
                )
            })
        }
        _ => Err(Error::UnexpectedReply(format!("{answer:?}"))),
    }
}

/// A tag unique to one request, below 2^53 (Lua's doubles hold it exactly)
/// and never 0 (no tag).
fn refund_tag() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: once_cell::sync::Lazy<u64> =
        once_cell::sync::Lazy::new(|| RandomState::new().hash_one(std::process::id()));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (RandomState::new().hash_one((*SEED, n)) & ((1 << 53) - 1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks of three limits each, as a batch sends them (a group per key):
    /// the call names each quota once, and each group as two numbers.
    #[test]
    fn a_call_names_each_request_once_however_many_groups_share_it() {
        let quotas = [
            Quota::per_second(10).unwrap(),
            Quota::per_minute(100).unwrap(),
            Quota::fixed_window(1_000, std::time::Duration::from_secs(60)).unwrap(),
        ];
        let mut groups = Vec::new();
        for _check in 0..5 {
            for quota in &quotas {
                groups.push((1, Request::new(quota, 1, None)));
            }
        }
        // A request that differs in its cost alone is a request of its own.
        groups.push((2, Request::new(&quotas[0], 2, None)));
        let mut call = ScriptCall::new(&SCRIPT);
        push_groups(&groups, &mut call);
        let args: Vec<String> = call
            .args()
            .iter()
            .map(|a| String::from_utf8(a.clone()).unwrap())
            .collect();
        assert_eq!(args[0], "4", "{args:?}");
        let groups_at = 1 + 4 * 6;
        assert_eq!(args.len(), groups_at + 16 * 2, "{args:?}");
        let places: Vec<&str> = args[groups_at..]
            .iter()
            .skip(1)
            .step_by(2)
            .map(String::as_str)
            .collect();
        assert_eq!(
            places,
            ["1", "2", "3", "1", "2", "3", "1", "2", "3", "1", "2", "3", "1", "2", "3", "4"]
        );
        // The request named by place 4 is the one of cost 2.
        assert_eq!(args[1 + 3 * 6 + 1], "2");
        assert_eq!(args[args.len() - 2], "2", "its group's count of keys");
    }
}
