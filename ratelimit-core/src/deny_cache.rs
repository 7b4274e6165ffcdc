//! The local deny cache: a key denied for a cost cannot be admitted for that
//! cost before its `retry_after` (buckets only refill with time, windows only
//! move forward, other instances only consume more). So the denial is kept in
//! process until then and answered from there, with no backend call.
//!
//! A cached answer is for the same cost only, so its `retry_after` (the time
//! left until the cached instant) and `reset_after` stay exact; `remaining`
//! is as of the backend's denial. A larger cost cannot succeed sooner either,
//! but its own `retry_after` is longer, so it asks the backend.
//!
//! An admission that leaves a bucket algorithm's key short of another
//! request of the same cost is kept too, as the denial that request would
//! get: the wait is known from the admission's `reset_after`.
//!
//! When a cached denial expires, the first caller asks the backend for
//! everyone (it holds a [`Probe`]); the callers that arrive meanwhile wait
//! for its answer and look again, so a flood on a hot key costs the backend
//! about one call per `retry_after` whatever the number of callers.
//!
//! Entries are checked against the quota they were made under (a changed
//! rule misses), dropped when a refund could make them wrong, and bounded in
//! number: under more distinct keys than the bound, the cache forgets, which
//! only costs a backend call.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::algorithm::gcra;
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::Quota;

const SHARDS: usize = 16;

/// Denials kept per key: one per cost, so a caller alternating between two
/// costs (a lease, then a single token) is answered for both.
const COSTS_PER_KEY: usize = 4;

type Shard = Mutex<HashMap<Box<str>, Vec<Entry>>>;

pub(crate) struct DenyCache {
    shards: Box<[Shard]>,
    hasher: RandomState,
    max_per_shard: usize,
    /// Numbers the probes, so a probe clears only its own mark.
    probes: AtomicU64,
    /// Counts `forget`s: an answer asked for before a `forget` of its key
    /// (a refund) may be stale, and is not kept.
    forgets: AtomicU64,
}

/// What the cache knows of a request.
pub(crate) enum Lookup<'a> {
    /// Denied, answered from the cache.
    Denied(Decision),
    /// Nothing known: ask the backend.
    Miss,
    /// The cached denial has expired: ask the backend, for the callers that
    /// wait too; they look again once this is dropped.
    Probe(Probe<'a>),
    /// Another caller is asking the backend: wait until the value is no
    /// longer [`ProbeEnd::Asking`] (or its sender is gone), then look again.
    Wait(watch::Receiver<ProbeEnd>),
}

/// How the caller asking the backend for others fared.
#[derive(Clone)]
pub(crate) enum ProbeEnd {
    /// Still asking.
    Asking,
    /// Answered, or gone: look again.
    Done,
    /// The backend failed: the waiting callers fail the same way rather than
    /// each wait for the failing backend again.
    Failed(Error),
}

/// Held by the caller asking the backend after a cached denial expired.
/// Dropped once the answer is in the cache (or on failure, or when the
/// caller is cancelled), it drops the expired entry unless a new answer
/// replaced it, and wakes the waiting callers.
pub(crate) struct Probe<'a> {
    cache: &'a DenyCache,
    key: &'a str,
    id: u64,
    end: watch::Sender<ProbeEnd>,
    failure: Option<Error>,
}

impl Probe<'_> {
    /// Records that the backend failed with `error`, for the waiting callers.
    pub(crate) fn failed(&mut self, error: &Error) {
        self.failure = error.is_backend().then(|| error.clone());
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if let Some(entries) = self.cache.shard(self.key).get_mut(self.key) {
            entries.retain(|e| e.probe.as_ref().is_none_or(|(id, _)| *id != self.id));
        }
        let end = match self.failure.take() {
            Some(error) => ProbeEnd::Failed(error),
            None => ProbeEnd::Done,
        };
        let _ = self.end.send(end);
    }
}

#[derive(Clone)]
struct Entry {
    quota: Quota,
    /// The cost denied until `until_us`.
    cost: u64,
    /// When the denied request could first succeed, on the cache's clock.
    until_us: u64,
    /// The denial's figures, as of `decided_us`.
    decided_us: u64,
    remaining: u64,
    reset_after_us: u64,
    /// Set once the denial has expired and a caller is asking the backend.
    probe: Option<(u64, watch::Receiver<ProbeEnd>)>,
}

impl Entry {
    /// The denial as of `now_us`, before `until_us`.
    fn answer(&self, now_us: u64) -> Decision {
        let elapsed = now_us.saturating_sub(self.decided_us);
        Decision {
            allowed: false,
            limit: self.quota.capacity(),
            remaining: self.remaining,
            retry_after: Duration::from_micros(self.until_us - now_us),
            reset_after: Duration::from_micros(self.reset_after_us.saturating_sub(elapsed)),
            delay: Duration::ZERO,
            fallback: false,
        }
    }
}

impl DenyCache {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            max_per_shard: (max_keys / SHARDS).max(1),
            probes: AtomicU64::new(0),
            forgets: AtomicU64::new(0),
        }
    }

    /// Read before asking the backend, and given back to `insert`.
    pub(crate) fn generation(&self) -> u64 {
        self.forgets.load(Ordering::SeqCst)
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<Box<str>, Vec<Entry>>> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What is known of a request of `cost` from `key` under `quota` at
    /// `now_us`.
    pub(crate) fn lookup<'a>(
        &'a self,
        quota: &Quota,
        key: &'a str,
        cost: u64,
        now_us: u64,
    ) -> Lookup<'a> {
        if cost == 0 {
            return Lookup::Miss;
        }
        let mut shard = self.shard(key);
        let Some(entry) = shard.get_mut(key).and_then(|entries| {
            entries
                .iter_mut()
                .find(|e| e.cost == cost && e.quota == *quota)
        }) else {
            return Lookup::Miss;
        };
        if now_us < entry.until_us {
            return Lookup::Denied(entry.answer(now_us));
        }
        if let Some((_, done)) = &entry.probe {
            return Lookup::Wait(done.clone());
        }
        let id = self.probes.fetch_add(1, Ordering::Relaxed);
        let (end, waiting) = watch::channel(ProbeEnd::Asking);
        entry.probe = Some((id, waiting));
        Lookup::Probe(Probe {
            cache: self,
            key,
            id,
            end,
            failure: None,
        })
    }

    /// The cached denial of `cost` from `key` under `quota` at `now_us`, if
    /// any.
    #[cfg(test)]
    fn get(&self, quota: &Quota, key: &str, cost: u64, now_us: u64) -> Option<Decision> {
        match self.lookup(quota, key, cost, now_us) {
            Lookup::Denied(denial) => Some(denial),
            _ => None,
        }
    }

    /// Remembers that `admitted`, a backend decision on `cost` asked at
    /// `asked_us`, left too little for another request of that cost, as the
    /// denial that request would get (bucket algorithms only: their wait is
    /// known from the admission).
    pub(crate) fn insert_spent(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        (asked_us, generation): (u64, u64),
        admitted: &Decision,
    ) {
        if quota.algorithm().is_windowed() || cost == 0 {
            return;
        }
        if let Some(wait_us) = gcra::wait_after_admission(quota, admitted, cost) {
            let denial = Decision {
                allowed: false,
                retry_after: Duration::from_micros(wait_us),
                delay: Duration::ZERO,
                ..*admitted
            };
            self.insert(quota, key, cost, (asked_us, generation), &denial);
        }
    }

    /// Remembers a backend denial of `cost`, asked at `asked_us` (before the
    /// call, so the entry never outlives the true `retry_after`) when the
    /// cache was at `generation`. One that has expired by the time it is
    /// kept (it ends early by the call's round trip) still tells the callers
    /// waiting on its probe that a new probe is needed.
    pub(crate) fn insert(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        (asked_us, generation): (u64, u64),
        denial: &Decision,
    ) {
        if cost == 0 || denial.retry_after.is_zero() || denial.retry_after == Duration::MAX {
            return;
        }
        let entry = Entry {
            quota: *quota,
            cost,
            until_us: asked_us.saturating_add(denial.retry_after.as_micros() as u64),
            decided_us: asked_us,
            remaining: denial.remaining,
            reset_after_us: denial.reset_after.as_micros() as u64,
            probe: None,
        };
        let mut shard = self.shard(key);
        // Checked under the shard's lock, which `forget` bumps it under.
        if self.forgets.load(Ordering::SeqCst) != generation {
            return;
        }
        // Entries a caller is asking the backend about stay until its probe
        // ends (the probe drops them), so the callers waiting on it keep
        // waiting on one call.
        let kept = |e: &Entry| e.until_us > asked_us || e.probe.is_some();
        if let Some(entries) = shard.get_mut(key) {
            entries.retain(|e| kept(e) && !(e.cost == cost && e.quota == *quota));
            if entries.len() >= COSTS_PER_KEY {
                entries.remove(0);
            }
            entries.push(entry);
            return;
        }
        if shard.len() >= self.max_per_shard {
            shard.retain(|_, entries| entries.iter().any(kept));
            if shard.len() >= self.max_per_shard {
                // Still full of live denials: forgetting only costs backend calls.
                shard.clear();
            }
        }
        shard.insert(key.into(), vec![entry]);
    }

    /// Drops what is known of `key`: after a refund, it may be admitted sooner.
    pub(crate) fn forget(&self, key: &str) {
        let mut shard = self.shard(key);
        shard.remove(key);
        self.forgets.fetch_add(1, Ordering::SeqCst);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.len()))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(retry_ms: u64) -> Decision {
        Decision::from_micros(false, 5, 0, retry_ms * 1_000, 10_000_000, 0)
    }

    #[test]
    fn answers_for_the_same_cost_until_retry_after() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        cache.insert(&quota, "k", 2, (1_000_000, 0), &denial(200));
        assert!(cache.get(&quota, "k", 2, 1_100_000).is_some());
        assert!(
            cache.get(&quota, "k", 1, 1_100_000).is_none(),
            "a smaller cost may fit"
        );
        assert!(
            cache.get(&quota, "k", 5, 1_100_000).is_none(),
            "a larger cost waits longer"
        );
        let cached = cache.get(&quota, "k", 2, 1_150_000).unwrap();
        assert_eq!(cached.retry_after, Duration::from_millis(50));
        assert!(
            cache.get(&quota, "k", 2, 1_200_000).is_none(),
            "expired at retry_after"
        );
        let other = Quota::per_second(6).unwrap();
        assert!(
            cache.get(&other, "k", 2, 1_100_000).is_none(),
            "a changed rule misses"
        );
        cache.forget("k");
        assert!(cache.get(&quota, "k", 2, 1_100_000).is_none());
    }

    #[test]
    fn an_expired_denial_lets_one_caller_ask_while_the_others_wait() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        cache.insert(&quota, "k", 1, (1_000_000, 0), &denial(200));
        let Lookup::Probe(probe) = cache.lookup(&quota, "k", 1, 1_200_000) else {
            panic!("the first caller after expiry should ask the backend");
        };
        let Lookup::Wait(waiting) = cache.lookup(&quota, "k", 1, 1_200_001) else {
            panic!("a second caller should wait for the first");
        };
        assert!(
            matches!(cache.lookup(&quota, "k", 2, 1_200_001), Lookup::Miss),
            "another cost asks"
        );
        assert!(matches!(*waiting.borrow(), ProbeEnd::Asking));
        // The probe's answer, a new denial, lands before the probe is dropped.
        cache.insert(&quota, "k", 1, (1_200_000, 0), &denial(100));
        drop(probe);
        assert!(
            matches!(*waiting.borrow(), ProbeEnd::Done),
            "the waiters are woken"
        );
        let Lookup::Denied(again) = cache.lookup(&quota, "k", 1, 1_200_002) else {
            panic!("a woken caller finds the new denial");
        };
        assert_eq!(again.retry_after, Duration::from_micros(99_998));
    }

    #[test]
    fn a_probe_with_no_answer_lets_every_waiter_ask() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        cache.insert(&quota, "k", 1, (1_000_000, 0), &denial(200));
        let Lookup::Probe(probe) = cache.lookup(&quota, "k", 1, 1_300_000) else {
            panic!("expected a probe");
        };
        let Lookup::Wait(waiting) = cache.lookup(&quota, "k", 1, 1_300_000) else {
            panic!("expected to wait");
        };
        // Failed, admitted with tokens to spare, or cancelled: no new entry.
        drop(probe);
        assert!(matches!(*waiting.borrow(), ProbeEnd::Done));
        assert!(matches!(
            cache.lookup(&quota, "k", 1, 1_300_001),
            Lookup::Miss
        ));
    }

    #[test]
    fn a_failed_probe_hands_its_error_to_the_waiters() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        cache.insert(&quota, "k", 1, (1_000_000, 0), &denial(200));
        let Lookup::Probe(mut probe) = cache.lookup(&quota, "k", 1, 1_300_000) else {
            panic!("expected a probe");
        };
        let Lookup::Wait(waiting) = cache.lookup(&quota, "k", 1, 1_300_000) else {
            panic!("expected to wait");
        };
        probe.failed(&Error::Timeout(Duration::from_millis(100)));
        drop(probe);
        let ProbeEnd::Failed(error) = &*waiting.borrow() else {
            panic!("the waiters should learn of the failure");
        };
        assert!(matches!(error, Error::Timeout(_)));
    }

    #[test]
    fn a_probe_s_mark_outlives_answers_for_other_costs_and_stale_answers_are_dropped() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        cache.insert(&quota, "k", 1, (1_000_000, 0), &denial(200));
        let Lookup::Probe(probe) = cache.lookup(&quota, "k", 1, 1_300_000) else {
            panic!("expected a probe");
        };
        cache.insert(&quota, "k", 2, (1_300_000, 0), &denial(500));
        assert!(
            matches!(cache.lookup(&quota, "k", 1, 1_300_001), Lookup::Wait(_)),
            "still one caller asking for cost 1"
        );
        drop(probe);
        // An answer asked for before a refund's `forget` is not kept.
        let generation = cache.generation();
        cache.forget("k");
        cache.insert(&quota, "k", 1, (1_300_000, generation), &denial(200));
        assert!(matches!(
            cache.lookup(&quota, "k", 1, 1_300_001),
            Lookup::Miss
        ));
        cache.insert(
            &quota,
            "k",
            1,
            (1_300_000, cache.generation()),
            &denial(200),
        );
        assert!(matches!(
            cache.lookup(&quota, "k", 1, 1_300_001),
            Lookup::Denied(_)
        ));
    }

    #[test]
    fn an_admission_that_spends_the_bucket_is_the_next_request_s_denial() {
        let cache = DenyCache::new(1_000);
        let bucket = Quota::new(2, crate::quota::Rate::per_second(4).unwrap()).unwrap();
        let t = 10_000_000;
        let decisions = crate::algorithm::testing::run(&bucket, &[(t, 1), (t, 1), (t + 1, 1)]);
        cache.insert_spent(&bucket, "k", 1, (t, 0), &decisions[0]);
        assert!(cache.get(&bucket, "k", 1, t).is_none(), "one token is left");
        cache.insert_spent(&bucket, "k", 1, (t, 0), &decisions[1]);
        let cached = cache
            .get(&bucket, "k", 1, t + 1)
            .expect("the bucket is spent");
        // What the bucket itself answers a microsecond later.
        assert!(!decisions[2].allowed);
        assert_eq!(cached.retry_after, decisions[2].retry_after);
        assert_eq!(cached.remaining, 0);
        assert!(cache.get(&bucket, "k", 2, t + 1).is_none(), "per cost");

        let window = Quota::fixed_window(2, Duration::from_secs(1)).unwrap();
        let spent = crate::algorithm::testing::run(&window, &[(t, 1), (t, 1)]);
        cache.insert_spent(&window, "w", 1, (t, 0), &spent[1]);
        assert!(cache.get(&window, "w", 1, t + 1).is_none(), "buckets only");
    }

    #[test]
    fn stays_bounded_under_many_distinct_keys() {
        let cache = DenyCache::new(1_600);
        let quota = Quota::per_second(5).unwrap();
        for i in 0..100_000u64 {
            cache.insert(&quota, &format!("ip:{i}"), 1, (1_000, 0), &denial(60_000));
        }
        assert!(cache.len() <= 1_600, "{} entries", cache.len());
    }
}
