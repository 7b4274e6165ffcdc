//! The local deny cache: what this process learned of a key's state from the
//! backend's replies, kept so that a request the key cannot admit yet is
//! denied in process, with no backend call and with the figures the backend
//! would give at that instant.
//!
//! What is kept depends on the algorithm, and every reply on a key, an
//! admission as well as a denial and at any cost, updates it:
//! - token bucket, GCRA and leaky bucket: the bucket's debt, kept as the
//!   instant it is paid off. It answers a request of any cost exactly: the
//!   cache runs the algorithm's own arithmetic ([`gcra::decide_debt`]) on the
//!   debt left at that instant. Admissions only add debt, so replies that
//!   crossed (one asked for before the other arrived) merge by keeping the
//!   later instant;
//! - fixed window: the window's count and its end, which answer any cost;
//! - sliding log and sliding window: denials, one per cost, each kept only
//!   when its `remaining` is one short of its cost. Only then is `remaining`
//!   sure to stay as it is until the wait ends (in a log, admissions leave
//!   one by one). Any admission on the key drops them.
//!
//! Nothing is kept of a key that can still admit more than one more request
//! of the cost just decided, so a key with room costs one look-up, no entry.
//!
//! Clocks: everything is measured on the cache's clock (the limiter's clock
//! when one is configured, which is then also the clock the backend decides
//! on; else this process's monotonic clock, which never steps). Only
//! durations come from the backend. A reply was decided at some instant
//! between its request and its arrival, so each reply is kept twice: as if
//! decided when it was asked for (the earliest it can have been) and when it
//! arrived (the latest). The cache denies only what the earliest says is
//! denied, so it never denies what the backend would admit; it answers with
//! the figures of the latest, so a cached wait is never shorter than the
//! backend's (sleep it, and the request is admitted), and longer by at most
//! the round trip of the call it was learned from. Between the two, the
//! backend is asked. What was learned at an instant a clock has since gone
//! back before is not used.
//!
//! When a key may admit only one more request of a cost (or a cached denial
//! has just ended), the first caller asks the backend for everyone (it holds
//! a [`Probe`]); the callers that arrive meanwhile wait for its answer and
//! look again, so a flood on a hot key costs the backend about one call per
//! admission whatever the number of callers.
//!
//! A reply asked for once every reply known of its key had arrived was
//! decided after them all, and replaces what they taught. A denial is
//! answered from for [`MAX_AGE_US`] at most after the reply it came from, then
//! the backend is asked again: another writer (another instance's refund or
//! reset, an operator deleting keys, a failover) can give a key back without
//! this process hearing of it, and a cached denial outlives that by a second
//! at most, not by its whole wait.
//!
//! Entries are checked against the quota they were made under (a changed
//! rule misses), not answered from once any rule has changed since (another
//! instance may have decided the key under the changed rule, even if it has
//! changed back), dropped when a refund could make them wrong, and bounded in
//! number: under more distinct keys than the bound, the cache forgets, which
//! only costs a backend call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::backend::Deadline;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::Quota;
use crate::sharded::{KeyTable, Sharded};

mod known;

use known::{kind, Denial, Kind, Known, Span, State};

const SHARDS: usize = 16;

/// Keys are spread over this many counters of refunds and of sliding
/// admissions, so that one key's traffic rarely keeps another's replies out.
const STRIPES: usize = 256;

/// How long a denial is answered from after the reply it was learned from,
/// in microseconds; then one caller asks the backend again. Another writer
/// can give a key back in the backend without this process hearing of it
/// (another instance's refund or reset, an operator deleting keys, a clock
/// that stepped), so this bounds how long a denial can outlive it.
const MAX_AGE_US: u64 = 1_000_000;

/// Sliding denials kept per key: one per cost, so a caller alternating
/// between two costs (a lease, then a single token) is answered for both.
const COSTS_PER_KEY: usize = 4;

pub(crate) struct DenyCache {
    shards: Sharded<KeyTable<Known>>,
    max_per_shard: usize,
    /// How long a probe may be in flight before the next caller asks the
    /// backend in its place: half the limiter's timeout (which bounds a
    /// call polled to its end), so that a caller that waited for it that
    /// long still has the other half to ask. A probe held longer is most
    /// likely a future its caller keeps without polling it, which would
    /// otherwise hold every caller of its key until their deadlines.
    probe_for: Duration,
    /// Per stripe of keys, counts `forget`s: a reply asked for before a
    /// refund of its key may count tokens since given back, and is not
    /// learned.
    forgets: Box<[AtomicU64]>,
    /// Per stripe of keys, counts the admissions of the sliding algorithms:
    /// a sliding denial asked for before one was recorded may have been
    /// decided before it, and is not kept. (What the other algorithms keep
    /// merges in any order.)
    admissions: Box<[AtomicU64]>,
    /// The limiter's count of rule changes (`Rules::changes`): what was
    /// learned before the last is not answered from.
    rules: Arc<AtomicU64>,
}

/// What a caller does after consulting the cache.
pub(crate) enum Consulted<'a> {
    /// Denied, answered from the cache.
    Denied(Decision),
    /// The backend failed for the caller this one waited on.
    Failed(Error),
    /// Ask the backend; with a probe, for the callers waiting on it too.
    Ask(Option<Probe<'a>>),
}

/// Taken just before a backend call on a key, for `record`: replies asked
/// for before a refund of the key (or, for the sliding algorithms, before an
/// admission on it was recorded) are not learned.
#[derive(Clone, Copy)]
pub(crate) struct Asked {
    at_us: u64,
    /// The key's hash: its shard, and where it is in the shard.
    hash: u64,
    stripe: usize,
    forgets: u64,
    admissions: u64,
    /// The count of rule changes when asked.
    rules: u64,
}

/// What the cache knows of a request.
enum Lookup<'a> {
    /// Denied, answered from the cache.
    Denied(Decision),
    /// Nothing known that denies it: ask the backend.
    Miss,
    /// It may be the last request that fits: ask the backend, for the
    /// callers that wait too; they look again once this is dropped.
    Probe(Probe<'a>),
    /// Another caller is asking the backend: wait until the value is no
    /// longer [`ProbeEnd::Asking`] (or its sender is gone), or until the
    /// probe is past its time, then look again.
    Wait(Waiting),
}

/// The mark of a probe in flight, for the callers that wait on it.
#[derive(Clone)]
pub(super) struct Waiting {
    end: watch::Receiver<ProbeEnd>,
    /// When the probe is past its time (see `DenyCache::probe_for`); `None`
    /// when too far to name (a timeout of `Duration::MAX`).
    until: Option<tokio::time::Instant>,
}

/// How the caller asking the backend for others fared.
#[derive(Clone)]
enum ProbeEnd {
    /// Still asking.
    Asking,
    /// Answered, or gone: look again.
    Done,
    /// The backend failed: the waiting callers fail the same way rather than
    /// each wait for the failing backend again.
    Failed(Error),
}

/// Held by the caller asking the backend for the others. Dropped once the
/// answer is in the cache (or on failure, or when the caller is cancelled),
/// it unmarks the key, drops the sliding denials that had ended when it
/// began, and wakes the waiting callers.
pub(crate) struct Probe<'a> {
    cache: &'a DenyCache,
    key: &'a str,
    began_us: u64,
    end: watch::Sender<ProbeEnd>,
    failure: Option<Error>,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        let mine = self.end.subscribe();
        let (hash, mut shard) = self.cache.shard(self.key);
        if let Some(known) = shard.get_mut(hash, self.key) {
            if known
                .probe
                .as_ref()
                .is_some_and(|p| p.end.same_channel(&mine))
            {
                known.probe = None;
            }
            if let State::Denials(denials) = &mut known.state {
                denials.retain(|d| d.until.early > self.began_us);
                if denials.is_empty() && known.probe.is_none() {
                    shard.remove(hash, self.key);
                }
            }
        }
        drop(shard);
        let end = match self.failure.take() {
            Some(error) => ProbeEnd::Failed(error),
            None => ProbeEnd::Done,
        };
        let _ = self.end.send(end);
    }
}

impl DenyCache {
    /// A cache of at most about `max_keys` keys, for calls made within
    /// `timeout`.
    pub(crate) fn new(max_keys: usize, timeout: Duration) -> Self {
        let counters = || (0..STRIPES).map(|_| AtomicU64::new(0)).collect();
        Self {
            shards: Sharded::new(SHARDS, KeyTable::new),
            max_per_shard: (max_keys / SHARDS).max(1),
            probe_for: timeout / 2,
            forgets: counters(),
            admissions: counters(),
            rules: Arc::default(),
        }
    }

    /// This cache, answering only from what it learned since the last
    /// change counted by `changes` (see `Rules::changes`).
    pub(crate) fn following(mut self, changes: Arc<AtomicU64>) -> Self {
        self.rules = changes;
        self
    }

    /// Whether `known` was learned under `quota` since the last rule change.
    fn current(&self, known: &Known, quota: &Quota) -> bool {
        known.quota == *quota && known.rules == self.rules.load(Ordering::SeqCst)
    }

    /// Where `key` is kept: its hash (which picks its shard and finds it
    /// there) and its stripe, from one hash.
    fn place(&self, key: &str) -> (u64, usize) {
        let hash = self.shards.hash(key);
        (hash, (hash >> 48) as usize % STRIPES)
    }

    /// Taken just before a backend call on `key`, at `now_us`, for `record`.
    pub(crate) fn asked(&self, key: &str, now_us: u64) -> Asked {
        let (hash, stripe) = self.place(key);
        Asked {
            at_us: now_us,
            hash,
            stripe,
            forgets: self.forgets[stripe].load(Ordering::SeqCst),
            admissions: self.admissions[stripe].load(Ordering::SeqCst),
            rules: self.rules.load(Ordering::SeqCst),
        }
    }

    /// Answers a request of `cost` from `key` under `quota` from the cache,
    /// or says to ask the backend. A caller that finds another asking for
    /// the key waits for that call and looks again; it waits on at most
    /// `MAX_WAITS` probes, each until it is past its time, and until
    /// `deadline` at most, then asks the backend itself within what is left
    /// of it. Off a Tokio runtime, where it cannot wait, it asks at once (and
    /// the backend call says why it cannot be made).
    pub(crate) async fn consult<'a>(
        &'a self,
        quota: &Quota,
        key: &'a str,
        cost: u64,
        clock: &dyn Clock,
        deadline: &Deadline,
    ) -> Consulted<'a> {
        const MAX_WAITS: u32 = 4;
        for _ in 0..MAX_WAITS {
            let Waiting { mut end, until } = match self.lookup(quota, key, cost, clock.now_micros())
            {
                Lookup::Denied(cached) => return Consulted::Denied(cached),
                Lookup::Miss => return Consulted::Ask(None),
                Lookup::Probe(probe) => return Consulted::Ask(Some(probe)),
                Lookup::Wait(waiting) => waiting,
            };
            if tokio::runtime::Handle::try_current().is_err() {
                return Consulted::Ask(None);
            }
            // The deadline is set here when this is the first wait.
            let own = deadline.at();
            let ended = end.wait_for(|end| !matches!(end, ProbeEnd::Asking));
            let woken = match own.into_iter().chain(until).min() {
                Some(limit) => tokio::time::timeout_at(limit, ended).await,
                None => Ok(ended.await),
            };
            match woken.as_ref().map(|ended| ended.as_deref()) {
                Ok(Ok(ProbeEnd::Failed(error))) => return Consulted::Failed(error.clone()),
                Ok(Ok(_)) => {}
                // The probe is gone without a word.
                Ok(Err(_)) => return Consulted::Ask(None),
                // The probe is past its time: the next look takes its place,
                // or waits for the caller that did. The first time, within a
                // timeout from now (a backend that is only slow answered the
                // probe late, and may answer this caller as late): at most
                // one and a half timeouts in all.
                Err(_) if until.is_some_and(|until| own.is_none_or(|own| until < own)) => {
                    deadline.renew();
                }
                // Past the deadline.
                Err(_) => return Consulted::Ask(None),
            }
        }
        match self.lookup(quota, key, cost, clock.now_micros()) {
            Lookup::Denied(cached) => Consulted::Denied(cached),
            Lookup::Probe(probe) => Consulted::Ask(Some(probe)),
            Lookup::Miss | Lookup::Wait(_) => Consulted::Ask(None),
        }
    }

    /// Learns what the backend answered a request asked for at `asked`,
    /// whose reply arrived at `now_us`, then ends `probe`, waking the callers
    /// waiting on it once the answer is in the cache (or with the backend's
    /// error).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        asked: Asked,
        now_us: u64,
        result: &Result<Decision, Error>,
        probe: Option<Probe<'_>>,
    ) {
        match result {
            Ok(decision) => self.learn(quota, key, cost, asked, now_us, decision),
            Err(error) => {
                if let Some(mut probe) = probe {
                    probe.failure = error.is_backend().then(|| error.clone());
                }
            }
        }
    }

    /// The key's hash and its shard, locked.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, KeyTable<Known>>) {
        self.shards.lock_hashed(key)
    }

    /// The shard of a key of this hash, locked.
    fn lock(&self, hash: u64) -> MutexGuard<'_, KeyTable<Known>> {
        self.shards.lock(self.shards.index_of(hash))
    }

    /// What is known of a request of `cost` from `key` under `quota` at
    /// `now_us`.
    fn lookup<'a>(&'a self, quota: &Quota, key: &'a str, cost: u64, now_us: u64) -> Lookup<'a> {
        if cost == 0 {
            return Lookup::Miss;
        }
        let (hash, mut shard) = self.shard(key);
        let Some(known) = shard.get_mut(hash, key).filter(|k| self.current(k, quota)) else {
            return Lookup::Miss;
        };
        if let Some(denial) = known.denial(cost, now_us) {
            return Lookup::Denied(denial);
        }
        if !known.contended(cost, now_us) {
            return Lookup::Miss;
        }
        let now = tokio::time::Instant::now();
        // A probe past its time is left to its caller, and this caller asks
        // in its place.
        if let Some(waiting) = known
            .probe
            .as_ref()
            .filter(|waiting| waiting.until.is_none_or(|until| now < until))
        {
            return Lookup::Wait(waiting.clone());
        }
        let (end, waiting) = watch::channel(ProbeEnd::Asking);
        known.probe = Some(Waiting {
            end: waiting,
            until: now.checked_add(self.probe_for),
        });
        Lookup::Probe(Probe {
            cache: self,
            key,
            began_us: now_us,
            end,
            failure: None,
        })
    }

    /// The cached denial of `cost` from `key` under `quota` at `now_us`, if
    /// any, with no probe begun: for a check of several dimensions, where
    /// one spent dimension denies the whole check and the others are asked
    /// together.
    pub(crate) fn peek(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        now_us: u64,
    ) -> Option<Decision> {
        if cost == 0 {
            return None;
        }
        let (hash, shard) = self.shard(key);
        let known = shard.get(hash, key).filter(|k| self.current(k, quota))?;
        known.denial(cost, now_us)
    }

    /// Learns `answer`, the backend's decision on `cost` from `key` under
    /// `quota`, asked for at `asked` and arrived at `now_us`.
    pub(crate) fn learn(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        asked: Asked,
        now_us: u64,
        answer: &Decision,
    ) {
        let span = |after: Duration| Span {
            early: asked.at_us.min(now_us).saturating_add(micros(after)),
            late: now_us.saturating_add(micros(after)),
        };
        let kind = kind(quota);
        let learned = match kind {
            // A debt deeper than the bucket (run up under another quota, or
            // on a clock that went back) is not kept: what is kept of a
            // bucket is read at most as deep as it. An admission writes its
            // debt; a denial's is the key's.
            Kind::Bucket { .. } => answer
                .debt
                .filter(|&debt| debt <= quota.depth())
                .map(|debt| {
                    let at = |us: u64| u128::from(us) * u128::from(quota.rate().tokens());
                    State::Bucket {
                        early: at(asked.at_us.min(now_us)) + u128::from(debt),
                        late: at(now_us) + u128::from(debt),
                    }
                }),
            Kind::Window => Some(State::Window {
                count: quota.capacity() - answer.remaining.min(quota.capacity()),
                end: span(answer.reset_after),
            }),
            // Only a denial that stays as it is until it ends.
            Kind::Sliding if !answer.allowed => (answer.remaining + 1 == cost
                && !answer.retry_after.is_zero()
                && answer.retry_after != Duration::MAX)
                .then(|| {
                    State::Denials(vec![Denial {
                        cost,
                        until: span(answer.retry_after),
                        remaining: answer.remaining,
                        reset: span(answer.reset_after),
                    }])
                }),
            Kind::Sliding => None,
        };
        // The hash `asked` took: no second hash.
        let hash = asked.hash;
        let mut shard = self.lock(hash);
        // Checked under the shard's lock, which `forget` bumps it under.
        // A reply asked for before a rule changed is never answered from:
        // kept, it would replace what a later one taught.
        if self.forgets[asked.stripe].load(Ordering::SeqCst) != asked.forgets
            || self.rules.load(Ordering::SeqCst) != asked.rules
        {
            return;
        }
        if matches!(kind, Kind::Sliding) {
            if answer.allowed {
                if cost > 0 {
                    self.admissions[asked.stripe].fetch_add(1, Ordering::SeqCst);
                    shard.remove(hash, key);
                }
                return;
            }
            if self.admissions[asked.stripe].load(Ordering::SeqCst) != asked.admissions {
                return;
            }
        }
        let Some(learned) = learned else {
            // Nothing exact to keep (a denial changes nothing); what was
            // kept of a key that has since consumed is stale.
            if answer.allowed && cost > 0 {
                shard.remove(hash, key);
            }
            return;
        };
        match shard.get_mut(hash, key) {
            Some(known)
                if known.quota == *quota
                    && known.rules == asked.rules
                    && known.learned_us <= now_us =>
            {
                known.merge(learned, asked.at_us, now_us);
                if !known.live(now_us) {
                    shard.remove(hash, key);
                }
            }
            kept => {
                // Made under another quota, or at an instant the clock has
                // since gone back before: replaced, keeping its probe mark.
                let existed = kept.is_some();
                let probe = kept.and_then(|known| known.probe.take());
                let known = Known {
                    quota: *quota,
                    rules: asked.rules,
                    learned_us: now_us,
                    confirmed_us: now_us,
                    state: learned,
                    probe,
                };
                let useful = cost > 0
                    && (known.denial(cost, now_us).is_some() || known.contended(cost, now_us));
                if !useful {
                    // Most admissions leave room and had no entry: no second
                    // look-up for them.
                    if existed {
                        shard.remove(hash, key);
                    }
                    return;
                }
                if shard.get(hash, key).is_none() && shard.len() >= self.max_per_shard {
                    shard.retain(|known| known.live(now_us));
                    if shard.len() >= self.max_per_shard {
                        // Still full of live entries: forgetting only costs
                        // backend calls.
                        shard.clear();
                    }
                }
                shard.insert(hash, key, known);
            }
        }
    }

    /// Drops what is known of `key`: after a refund, it may be admitted
    /// sooner.
    pub(crate) fn forget(&self, key: &str) {
        let (hash, stripe) = self.place(key);
        let mut shard = self.lock(hash);
        shard.remove(hash, key);
        self.forgets[stripe].fetch_add(1, Ordering::SeqCst);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.sum(KeyTable::len)
    }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::gcra;
    use crate::algorithm::{self, State as Stored};
    use crate::quota::Algorithm;
    use crate::quota::Rate;

    /// The server: the algorithms' own state machine, as both backends run it.
    struct Server {
        state: Option<Stored>,
    }

    impl Server {
        fn decide(&mut self, quota: &Quota, now: u64, cost: u64) -> Decision {
            algorithm::decide(quota, &mut self.state, now, cost).0
        }

        fn peek(&self, quota: &Quota, now: u64, cost: u64) -> Decision {
            algorithm::decide(quota, &mut self.state.clone(), now, cost).0
        }
    }

    /// One caller's request through the cache, as the limiter makes it: the
    /// cache's answer, or the server's, decided `to_server` µs after `now`
    /// and arrived `round_trip` µs after `now`.
    fn request(
        cache: &DenyCache,
        server: &mut Server,
        quota: &Quota,
        now: u64,
        cost: u64,
        to_server: u64,
        round_trip: u64,
    ) -> (Decision, bool) {
        let probe = match cache.lookup(quota, "k", cost, now) {
            Lookup::Denied(cached) => return (cached, true),
            Lookup::Miss => None,
            Lookup::Probe(probe) => Some(probe),
            Lookup::Wait(_) => panic!("one caller never waits for itself"),
        };
        let asked = cache.asked("k", now);
        let decided = server.decide(quota, now + to_server, cost);
        cache.record(
            quota,
            "k",
            cost,
            asked,
            now + round_trip,
            &Ok(decided),
            probe,
        );
        (decided, false)
    }

    fn quotas() -> Vec<[Quota; 2]> {
        let bucket = |algorithm, capacity, rate: &str| {
            Quota::builder(algorithm)
                .capacity(capacity)
                .rate(rate.parse().unwrap())
                .build()
                .unwrap()
        };
        let window = |algorithm, limit, window: &str| {
            Quota::builder(algorithm)
                .limit(limit)
                .window(Quota::parse_window(window).unwrap())
                .build()
                .unwrap()
        };
        use Algorithm::*;
        vec![
            [
                bucket(TokenBucket, 5, "5/s"),
                bucket(TokenBucket, 2, "1/min"),
            ],
            [bucket(Gcra, 8, "2.5/s"), bucket(Gcra, 3, "7/min")],
            [
                bucket(LeakyBucket, 4, "3/s"),
                bucket(LeakyBucket, 10, "1/s"),
            ],
            [window(FixedWindow, 5, "1s"), window(FixedWindow, 3, "2s")],
            [window(SlidingLog, 5, "1s"), window(SlidingLog, 2, "3s")],
            [
                window(SlidingWindow, 5, "1s"),
                window(SlidingWindow, 3, "3s"),
            ],
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A request under the family's quota (modulo 2) of a cost (modulo
        /// the capacity, plus one).
        Request(usize, u64),
        Forward(u64),
        Back(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..2, 0u64..10).prop_map(|(q, c)| Op::Request(q, c)),
            4 => prop_oneof![0u64..2_000, 0u64..400_000, 0u64..3_000_000].prop_map(Op::Forward),
            1 => (0u64..2_000_000).prop_map(Op::Back),
        ]
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 600,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// With replies that arrive at the instant they were decided, every
    /// answer the cache gives is the one the server would give at that
    /// instant, for every algorithm, at mixed costs on one key, under a
    /// quota that changes and a clock that goes back.
    #[test]
    fn a_cached_answer_is_the_servers_answer_at_that_instant() {
        let cached: [AtomicU64; 6] = Default::default();
        proptest!(config(), |(family in 0usize..6, ops in proptest::collection::vec(op(), 1..120))| {
            let quotas = quotas()[family];
            let cache = DenyCache::new(100, Duration::from_secs(1));
            let mut server = Server { state: None };
            let mut now = 1_000_000_000u64;
            for (step, op) in ops.iter().enumerate() {
                match *op {
                    Op::Forward(d) => now += d,
                    Op::Back(d) => now -= d,
                    Op::Request(q, c) => {
                        let quota = &quotas[q];
                        let cost = 1 + c % quota.capacity();
                        let expected = server.peek(quota, now, cost);
                        let (answer, from_cache) = request(&cache, &mut server, quota, now, cost, 0, 0);
                        prop_assert_eq!(answer, expected, "step {} {:?} cost {}", step, quota, cost);
                        cached[family].fetch_add(u64::from(from_cache), Ordering::Relaxed);
                    }
                }
            }
        });
        // The property says nothing of a cache that never answers.
        let cached = cached.map(AtomicU64::into_inner);
        assert!(
            cached.iter().all(|&n| n > 100),
            "cached answers per algorithm: {cached:?}"
        );
    }

    /// With replies that take a round trip, decided anywhere within it: the
    /// cache never denies what the server would admit; a cached denial's
    /// wait is never shorter than the server's (a request of the same cost
    /// made then is admitted), and longer by at most the round trip; its
    /// `remaining` is never larger.
    #[test]
    fn a_cached_wait_ends_no_sooner_and_at_most_a_round_trip_later() {
        let cached: [AtomicU64; 6] = Default::default();
        proptest!(config(), |(
            family in 0usize..6,
            round_trip in 1u64..20_000,
            ops in proptest::collection::vec((op(), 0u64..=100), 1..120),
        )| {
            let quotas = quotas()[family];
            let cache = DenyCache::new(100, Duration::from_secs(1));
            let mut server = Server { state: None };
            let mut now = 1_000_000_000u64;
            for (step, (op, decided_at)) in ops.iter().enumerate() {
                match *op {
                    Op::Forward(d) => now += d,
                    // A clock that goes back is the test above's; here the
                    // server's clock and the cache's run together.
                    Op::Back(_) => {}
                    Op::Request(q, c) => {
                        let quota = &quotas[q];
                        let cost = 1 + c % quota.capacity();
                        let truth = server.peek(quota, now, cost);
                        let to_server = round_trip * decided_at / 100;
                        let (answer, from_cache) =
                            request(&cache, &mut server, quota, now, cost, to_server, round_trip);
                        if !from_cache {
                            now += round_trip;
                            continue;
                        }
                        cached[family].fetch_add(1, Ordering::Relaxed);
                        let context = format!("step {step} {quota:?} cost {cost} rtt {round_trip}: {answer:?} vs {truth:?}");
                        prop_assert!(!answer.allowed);
                        // Never a denial of what the server would admit.
                        prop_assert!(!truth.allowed, "{}", context);
                        let truth_wait = if truth.allowed { Duration::ZERO } else { truth.retry_after };
                        prop_assert!(answer.retry_after >= truth_wait, "{}", context);
                        prop_assert!(
                            answer.retry_after <= truth_wait + Duration::from_micros(round_trip),
                            "{}", context
                        );
                        // An admission's `remaining` is counted after its cost.
                        let truth_remaining = truth.remaining + if truth.allowed { cost } else { 0 };
                        prop_assert!(answer.remaining <= truth_remaining, "{}", context);
                        let retry = now + answer.retry_after.as_micros() as u64;
                        prop_assert!(server.peek(quota, retry, cost).allowed, "{}", context);
                    }
                }
            }
        });
        let cached = cached.map(AtomicU64::into_inner);
        assert!(
            cached.iter().all(|&n| n > 100),
            "cached answers per algorithm: {cached:?}"
        );
    }

    /// Another writer the cache does not hear of gives the key back (another
    /// instance's reset or refund, an operator deleting it) or consumes it:
    /// the cache denies what the server would admit for less than
    /// `MAX_AGE_US` after the last give-back, never longer, where a denial
    /// answered until its wait ended would deny an hour's quota for the rest
    /// of its hour.
    #[test]
    fn a_key_given_back_elsewhere_is_admitted_within_the_age_of_a_denial() {
        let stale: [AtomicU64; 6] = Default::default();
        proptest!(config(), |(
            family in 0usize..6,
            ops in proptest::collection::vec(
                prop_oneof![8 => op(), 1 => Just(Op::Back(0)), 1 => (0u64..10).prop_map(|c| Op::Request(2, c))],
                1..120,
            ),
        )| {
            let quotas = quotas()[family];
            let cache = DenyCache::new(100, Duration::from_secs(1));
            let mut server = Server { state: None };
            let mut now = 1_000_000_000u64;
            let mut given_back = 0u64;
            for (step, op) in ops.iter().enumerate() {
                match *op {
                    Op::Forward(d) => now += d,
                    // Another writer gives everything back.
                    Op::Back(_) => {
                        server.state = None;
                        given_back = now;
                    }
                    // Another writer consumes under the first quota, which
                    // can give back what the second counted (a quota change).
                    Op::Request(2, c) => {
                        let quota = &quotas[0];
                        server.decide(quota, now, 1 + c % quota.capacity());
                        given_back = now;
                    }
                    Op::Request(q, c) => {
                        let quota = &quotas[q];
                        let cost = 1 + c % quota.capacity();
                        let truth = server.peek(quota, now, cost);
                        let (answer, from_cache) = request(&cache, &mut server, quota, now, cost, 0, 0);
                        if from_cache && truth.allowed {
                            stale[family].fetch_add(1, Ordering::Relaxed);
                            prop_assert!(
                                now - given_back < MAX_AGE_US,
                                "step {} {:?} cost {}: denied {} µs after the key was given back: {:?}",
                                step, quota, cost, now - given_back, answer
                            );
                        }
                    }
                }
            }
        });
        // The property says nothing of a cache that never outlived a
        // give-back.
        let stale = stale.map(AtomicU64::into_inner);
        assert!(
            stale.iter().all(|&n| n > 0),
            "denials of keys given back, per algorithm: {stale:?}"
        );
    }

    /// Replies that cross (each asked for before the one before it arrived)
    /// merge, and do not renew the age of what they merge with: a denial
    /// learned before another writer reset the key is not answered from a
    /// second later, however many crossing replies of smaller costs come in
    /// meanwhile.
    #[test]
    fn crossing_replies_keep_no_denial_past_its_age() {
        let quota = Quota::builder(Algorithm::TokenBucket)
            .capacity(1000)
            .rate("1000/h".parse().unwrap())
            .build()
            .unwrap();
        let cache = DenyCache::new(100, Duration::from_secs(1));
        let mut server = Server { state: None };
        let t0 = 1_000_000_000u64;
        // 990 taken: a cost of 20 is denied from the cache.
        let asked = cache.asked("k", t0);
        let taken = server.decide(&quota, t0, 990);
        cache.learn(&quota, "k", 990, asked, t0 + 10, &taken);
        assert!(cache.peek(&quota, "k", 20, t0 + 10).is_some());
        // Another writer resets the key.
        server.state = None;
        // Calls of cost 1 every 5 ms, 10 ms each on their way: every reply
        // arrives after the next was asked for.
        let mut in_flight: Vec<(Asked, u64, Decision)> = Vec::new();
        let mut t = t0 + 5;
        while t < t0 + 3_000_000 {
            in_flight.retain(|(asked, arrives, decided)| {
                if *arrives > t {
                    return true;
                }
                cache.learn(&quota, "k", 1, *asked, *arrives, decided);
                false
            });
            let asked = cache.asked("k", t);
            let decided = server.decide(&quota, t + 5_000, 1);
            in_flight.push((asked, t + 10_000, decided));
            t += 5_000;
        }
        assert!(server.peek(&quota, t, 20).allowed, "the server admits 20");
        assert_eq!(
            cache.peek(&quota, "k", 20, t),
            None,
            "a denial of 20 answered {} µs after the key was reset",
            t - t0
        );
    }

    /// The sequences of a single caller that a deny cache keeping one denial
    /// per cost answered wrongly: a bucket admitted at another cost after a
    /// denial was kept, and a sliding log or window admitted after a denial
    /// of a larger cost was kept. Each cached answer is the server's.
    #[test]
    fn an_admission_at_another_cost_updates_what_the_cache_answers() {
        let rate: Rate = "5/s".parse().unwrap();
        let one_second = Duration::from_secs(1);
        let t = 1_000_000_000u64;
        let buckets = [
            Quota::token_bucket(5, rate).unwrap(),
            Quota::gcra(5, rate).unwrap(),
            Quota::leaky_bucket(5, rate).unwrap(),
        ];
        for quota in &buckets {
            let cache = DenyCache::new(100, Duration::from_secs(1));
            let mut server = Server { state: None };
            for cost in [2, 2, 1] {
                let (d, _) = request(&cache, &mut server, quota, t, cost, 0, 0);
                assert!(d.allowed, "{quota:?}");
            }
            let expected = server.peek(quota, t, 2);
            let (cached, from_cache) = request(&cache, &mut server, quota, t, 2, 0, 0);
            assert!(from_cache, "{quota:?}: the spent bucket is known");
            assert_eq!(cached, expected, "{quota:?}");
            assert_eq!(cached.retry_after, Duration::from_millis(400), "{quota:?}");
        }
        let windows = [
            Quota::sliding_log(5, one_second).unwrap(),
            Quota::sliding_window(5, one_second).unwrap(),
            Quota::fixed_window(5, one_second).unwrap(),
        ];
        for quota in &windows {
            let cache = DenyCache::new(100, Duration::from_secs(1));
            let mut server = Server { state: None };
            let mut now = t;
            for _ in 0..3 {
                assert!(request(&cache, &mut server, quota, now, 1, 0, 0).0.allowed);
                now += 100_000;
            }
            let (first, _) = request(&cache, &mut server, quota, now, 3, 0, 0);
            assert!(!first.allowed, "{quota:?}");
            for _ in 0..2 {
                assert!(request(&cache, &mut server, quota, now, 1, 0, 0).0.allowed);
            }
            let expected = server.peek(quota, now, 3);
            let (again, _) = request(&cache, &mut server, quota, now, 3, 0, 0);
            assert_eq!(again, expected, "{quota:?}");
            let retry = now + again.retry_after.as_micros() as u64;
            assert!(server.peek(quota, retry, 3).allowed, "{quota:?}");
        }
    }

    #[test]
    fn a_denial_is_answered_for_every_cost_it_knows_until_it_ends() {
        let cache = DenyCache::new(1_000, Duration::from_secs(1));
        let quota = Quota::token_bucket(5, "5/s".parse().unwrap()).unwrap();
        let mut server = Server { state: None };
        let t = 1_000_000_000;
        assert!(request(&cache, &mut server, &quota, t, 5, 0, 0).0.allowed);
        for cost in 1..=5 {
            let (d, from_cache) = request(&cache, &mut server, &quota, t + 1, cost, 0, 0);
            assert!(from_cache && !d.allowed, "cost {cost}");
            assert_eq!(d.retry_after.as_micros() as u64, cost * 200_000 - 1);
        }
        let other = Quota::token_bucket(6, "5/s".parse().unwrap()).unwrap();
        assert!(
            cache.peek(&other, "k", 1, t + 1).is_none(),
            "a changed rule misses"
        );
        assert!(cache.peek(&quota, "k", 1, t + 200_000).is_none(), "ended");
        cache.forget("k");
        assert!(cache.peek(&quota, "k", 1, t + 1).is_none(), "forgotten");
    }

    /// The first caller after a denial ended asks; the second waits.
    fn spent_and_asked<'a>(
        cache: &'a DenyCache,
        quota: &Quota,
        now_us: u64,
    ) -> (Probe<'a>, watch::Receiver<ProbeEnd>) {
        let mut server = Server { state: None };
        request(cache, &mut server, quota, 1_000_000, quota.capacity(), 0, 0);
        let Lookup::Probe(probe) = cache.lookup(quota, "k", 1, now_us) else {
            panic!("the first caller after the denial ended should ask the backend");
        };
        let Lookup::Wait(waiting) = cache.lookup(quota, "k", 1, now_us + 1) else {
            panic!("a second caller should wait for the first");
        };
        (probe, waiting.end)
    }

    #[test]
    fn an_ended_denial_lets_one_caller_ask_while_the_others_wait() {
        let cache = DenyCache::new(1_000, Duration::from_secs(1));
        let quota = Quota::per_second(5).unwrap();
        let (probe, waiting) = spent_and_asked(&cache, &quota, 1_200_000);
        assert!(matches!(*waiting.borrow(), ProbeEnd::Asking));
        // The probe's answer, an admission that spends the bucket again,
        // lands before the probe is dropped.
        let admitted =
            gcra::decide_debt(&quota, quota.depth() - quota.rate().period_us(), 1, false);
        assert!(admitted.allowed, "{admitted:?}");
        cache.record(
            &quota,
            "k",
            1,
            cache.asked("k", 1_200_000),
            1_200_000,
            &Ok(admitted),
            None,
        );
        drop(probe);
        assert!(matches!(*waiting.borrow(), ProbeEnd::Done), "woken");
        let Lookup::Denied(again) = cache.lookup(&quota, "k", 1, 1_200_002) else {
            panic!("a woken caller finds the new state");
        };
        assert_eq!(again.retry_after, Duration::from_micros(199_998));
    }

    /// A probe whose caller keeps its future unpolled is taken over once
    /// past its time; its end, when it comes, leaves the new probe's mark.
    #[test]
    fn a_probe_past_its_time_is_taken_over_by_the_next_caller() {
        // A probe's time is half the timeout, 200 ms: the lookups right after
        // the new probe are made well within its time on a slow machine.
        let cache = DenyCache::new(1_000, Duration::from_millis(400));
        let quota = Quota::per_second(5).unwrap();
        let (stalled, _) = spent_and_asked(&cache, &quota, 1_200_000);
        std::thread::sleep(Duration::from_millis(300));
        let Lookup::Probe(next) = cache.lookup(&quota, "k", 1, 1_200_002) else {
            panic!("a probe past its time should be taken over");
        };
        drop(stalled);
        assert!(
            matches!(cache.lookup(&quota, "k", 1, 1_200_003), Lookup::Wait(_)),
            "the new probe is in flight"
        );
        drop(next);
    }

    /// A timeout too long to name (`Duration::MAX`, which the builder
    /// takes): a probe is never past its time, where adding half of it to
    /// the clock overflowed, and panicked.
    #[test]
    fn a_probe_under_a_timeout_too_long_to_name_is_never_past_its_time() {
        let cache = DenyCache::new(1_000, Duration::MAX);
        let quota = Quota::per_second(5).unwrap();
        let (_probe, _) = spent_and_asked(&cache, &quota, 1_200_000);
        assert!(matches!(
            cache.lookup(&quota, "k", 1, 1_200_002),
            Lookup::Wait(_)
        ));
    }

    #[test]
    fn a_failed_probe_hands_its_error_to_the_waiters() {
        let cache = DenyCache::new(1_000, Duration::from_secs(1));
        let quota = Quota::per_second(5).unwrap();
        let (probe, waiting) = spent_and_asked(&cache, &quota, 1_300_000);
        let failed = Err(Error::Timeout(Duration::from_millis(100)));
        cache.record(
            &quota,
            "k",
            1,
            cache.asked("k", 1_300_000),
            1_300_000,
            &failed,
            Some(probe),
        );
        let ProbeEnd::Failed(error) = &*waiting.borrow() else {
            panic!("the waiters should learn of the failure");
        };
        assert!(matches!(error, Error::Timeout(_)));
    }

    #[test]
    fn answers_asked_for_before_a_refund_or_a_sliding_admission_are_not_kept() {
        let cache = DenyCache::new(1_000, Duration::from_secs(1));
        let quota = Quota::per_second(5).unwrap();
        let spent = gcra::decide_debt(&quota, quota.depth(), 0, false);
        let asked = cache.asked("k", 1_000_000);
        cache.forget("k");
        cache.record(&quota, "k", 1, asked, 1_000_000, &Ok(spent), None);
        assert!(cache.peek(&quota, "k", 1, 1_000_001).is_none());
        cache.record(
            &quota,
            "k",
            1,
            cache.asked("k", 1_000_000),
            1_000_000,
            &Ok(spent),
            None,
        );
        assert!(cache.peek(&quota, "k", 1, 1_000_001).is_some());

        let log = Quota::sliding_log(1, Duration::from_secs(1)).unwrap();
        let mut server = Server { state: None };
        let first = server.decide(&log, 5_000_000, 1);
        let denied = server.decide(&log, 5_000_000, 1);
        let asked = cache.asked("l", 5_000_000);
        cache.record(
            &log,
            "l",
            1,
            cache.asked("l", 5_000_000),
            5_000_000,
            &Ok(first),
            None,
        );
        cache.record(&log, "l", 1, asked, 5_000_000, &Ok(denied), None);
        assert!(
            cache.peek(&log, "l", 1, 5_000_001).is_none(),
            "decided before an admission recorded since, perhaps"
        );
        cache.record(
            &log,
            "l",
            1,
            cache.asked("l", 5_000_000),
            5_000_000,
            &Ok(denied),
            None,
        );
        assert!(cache.peek(&log, "l", 1, 5_000_001).is_some());
    }

    #[test]
    fn a_key_with_room_for_more_keeps_no_entry() {
        let cache = DenyCache::new(1_000, Duration::from_secs(1));
        let quota = Quota::per_second(5).unwrap();
        let server = Server { state: None };
        for i in 0..1_000u64 {
            let key = format!("k{i}");
            let d = server.peek(&quota, 1_000_000, 1);
            cache.record(
                &quota,
                &key,
                1,
                cache.asked(&key, 1_000_000),
                1_000_000,
                &Ok(d),
                None,
            );
        }
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn stays_bounded_under_many_distinct_keys() {
        let cache = DenyCache::new(1_600, Duration::from_secs(1));
        let quota = Quota::per_second(5).unwrap();
        let spent = gcra::decide_debt(&quota, quota.depth() - 1, 0, false);
        for i in 0..100_000u64 {
            let key = format!("ip:{i}");
            cache.record(
                &quota,
                &key,
                1,
                cache.asked(&key, 1_000),
                1_000,
                &Ok(spent),
                None,
            );
        }
        assert!(cache.len() <= 1_600, "{} entries", cache.len());
    }

    /// Two replies of a fixed window's key whose round trips differ by
    /// half a window or more, one from the window's last microsecond and
    /// one from the next window: the next window's count is what is known,
    /// whichever arrives first. (The two were merged as one window's, the
    /// spent count with the next window's end, and the cache denied for a
    /// whole window what the backend admitted.)
    #[test]
    fn replies_of_two_windows_are_never_merged_as_one() {
        let quota = Quota::fixed_window(5, Duration::from_millis(10)).unwrap();
        let w = 10_000u64;
        let base = 1_000_000_000u64;
        for slow_first in [true, false] {
            let cache = DenyCache::new(100, Duration::from_secs(1));
            let mut server = Server { state: None };
            // Others spend four; this process's fifth is decided at the
            // window's last microsecond, and its reply takes 6 ms.
            for _ in 0..4 {
                assert!(server.decide(&quota, base + w - 2, 1).allowed);
            }
            let asked_a = cache.asked("k", base + w - 1);
            let a = server.decide(&quota, base + w - 1, 1);
            assert!(a.allowed && a.remaining == 0, "{a:?}");
            // The next window's first, whose reply takes 2 µs.
            let t_b = base + w + 5_998;
            let asked_b = cache.asked("k", t_b);
            let b = server.decide(&quota, t_b, 1);
            assert!(b.allowed && b.remaining == 4, "{b:?}");
            let slow = (asked_a, base + w + 5_999, a);
            let fast = (asked_b, t_b + 2, b);
            let order = if slow_first {
                [slow, fast]
            } else {
                [fast, slow]
            };
            for (asked, arrived, decision) in order {
                cache.record(&quota, "k", 1, asked, arrived, &Ok(decision), None);
            }
            let now = t_b + 3;
            assert!(server.peek(&quota, now, 1).allowed, "the backend admits");
            let cached = cache.peek(&quota, "k", 1, now);
            assert!(
                cached.is_none(),
                "slow reply first: {slow_first}; the cache denies what the backend admits: \
                 {cached:?}"
            );
        }
    }
}
