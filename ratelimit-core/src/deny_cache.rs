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
use crate::clock::Clock;
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
    /// Counts `forget`s: an answer asked for before a `forget` of its key
    /// (a refund) may be stale, and is not kept.
    forgets: AtomicU64,
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

/// When a backend call was asked for, for `insert`: answers asked for
/// before a `forget` of their key are not kept.
#[derive(Clone, Copy)]
pub(crate) struct Asked {
    at_us: u64,
    generation: u64,
}

/// What the cache knows of a request.
enum Lookup<'a> {
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
enum ProbeEnd {
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
    end: watch::Sender<ProbeEnd>,
    failure: Option<Error>,
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        let mine = self.end.subscribe();
        if let Some(entries) = self.cache.shard(self.key).get_mut(self.key) {
            entries.retain(|e| !e.probe.as_ref().is_some_and(|p| p.same_channel(&mine)));
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
    probe: Option<watch::Receiver<ProbeEnd>>,
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
            forgets: AtomicU64::new(0),
        }
    }

    /// Taken just before a backend call, at `now_us`, for `insert`.
    pub(crate) fn asked(&self, now_us: u64) -> Asked {
        Asked {
            at_us: now_us,
            generation: self.forgets.load(Ordering::SeqCst),
        }
    }

    /// Answers a request of `cost` from `key` under `quota` from the cache,
    /// or says to ask the backend. A caller that finds another asking for an
    /// expired denial waits for that call and looks again (the answer may
    /// have expired already, as it ends early by a round trip, and a new
    /// probe begun); it waits on at most `MAX_WAITS` probes and for at most
    /// `timeout` in all, then asks the backend itself.
    pub(crate) async fn consult<'a>(
        &'a self,
        quota: &Quota,
        key: &'a str,
        cost: u64,
        clock: &dyn Clock,
        timeout: Duration,
    ) -> Consulted<'a> {
        const MAX_WAITS: u32 = 4;
        // Read from the clock only once a wait begins: most callers never wait.
        let mut deadline = None;
        for _ in 0..MAX_WAITS {
            let mut end = match self.lookup(quota, key, cost, clock.now_micros()) {
                Lookup::Denied(cached) => return Consulted::Denied(cached),
                Lookup::Miss => return Consulted::Ask(None),
                Lookup::Probe(probe) => return Consulted::Ask(Some(probe)),
                Lookup::Wait(end) => end,
            };
            let ended = end.wait_for(|end| !matches!(end, ProbeEnd::Asking));
            let deadline =
                *deadline.get_or_insert_with(|| tokio::time::Instant::now().checked_add(timeout));
            let woken = match deadline {
                Some(deadline) => tokio::time::timeout_at(deadline, ended).await.ok(),
                None => Some(ended.await),
            };
            match woken.as_ref().map(|ended| ended.as_deref()) {
                Some(Ok(ProbeEnd::Failed(error))) => return Consulted::Failed(error.clone()),
                Some(Ok(_)) => {}
                // Past the deadline, or the probe is gone without a word.
                _ => return Consulted::Ask(None),
            }
        }
        match self.lookup(quota, key, cost, clock.now_micros()) {
            Lookup::Denied(cached) => Consulted::Denied(cached),
            Lookup::Probe(probe) => Consulted::Ask(Some(probe)),
            Lookup::Miss | Lookup::Wait(_) => Consulted::Ask(None),
        }
    }

    /// Keeps what the backend answered a request asked for at `asked`, then
    /// ends `probe`, waking the callers waiting on it once the answer is in
    /// the cache (or with the backend's error).
    pub(crate) fn record(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        asked: Asked,
        result: &Result<Decision, Error>,
        probe: Option<Probe<'_>>,
    ) {
        match result {
            Ok(decision) if decision.allowed => {
                self.insert_spent(quota, key, cost, asked, decision)
            }
            Ok(denial) => self.insert(quota, key, cost, asked, denial),
            Err(error) => {
                if let Some(mut probe) = probe {
                    probe.failure = error.is_backend().then(|| error.clone());
                }
            }
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<Box<str>, Vec<Entry>>> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What is known of a request of `cost` from `key` under `quota` at
    /// `now_us`.
    fn lookup<'a>(&'a self, quota: &Quota, key: &'a str, cost: u64, now_us: u64) -> Lookup<'a> {
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
        if let Some(waiting) = &entry.probe {
            return Lookup::Wait(waiting.clone());
        }
        let (end, waiting) = watch::channel(ProbeEnd::Asking);
        entry.probe = Some(waiting);
        Lookup::Probe(Probe {
            cache: self,
            key,
            end,
            failure: None,
        })
    }

    /// The live cached denial of `cost` from `key` under `quota` at
    /// `now_us`, if any, with no probe begun when it has expired: for a
    /// check of several dimensions, where one spent dimension denies the
    /// whole check and an expired one is asked with the others.
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
        let shard = self.shard(key);
        let entry = shard
            .get(key)?
            .iter()
            .find(|e| e.quota == *quota && e.cost == cost)?;
        (now_us < entry.until_us).then(|| entry.answer(now_us))
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

    /// Remembers that `admitted`, a backend decision on `cost` asked for at
    /// `asked`, left too little for another request of that cost, as the
    /// denial that request would get (bucket algorithms only: their wait is
    /// known from the admission).
    fn insert_spent(&self, quota: &Quota, key: &str, cost: u64, asked: Asked, admitted: &Decision) {
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
            self.insert(quota, key, cost, asked, &denial);
        }
    }

    /// Remembers a backend denial of `cost`, asked for at `asked` (before
    /// the call, so the entry never outlives the true `retry_after`; not
    /// kept after a `forget` of the key since then). One that has expired by the time it is
    /// kept (it ends early by the call's round trip) still tells the callers
    /// waiting on its probe that a new probe is needed.
    pub(crate) fn insert(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        asked: Asked,
        denial: &Decision,
    ) {
        let Asked {
            at_us: asked_us,
            generation,
        } = asked;
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

    /// A denial of cost 1 on "k" from 1 s for 200 ms, looked up at `now_us`
    /// (after it expired) by two callers: the first asks, the second waits.
    fn expired_and_asked<'a>(
        cache: &'a DenyCache,
        quota: &Quota,
        now_us: u64,
    ) -> (Probe<'a>, watch::Receiver<ProbeEnd>) {
        cache.insert(quota, "k", 1, cache.asked(1_000_000), &denial(200));
        let Lookup::Probe(probe) = cache.lookup(quota, "k", 1, now_us) else {
            panic!("the first caller after expiry should ask the backend");
        };
        let Lookup::Wait(waiting) = cache.lookup(quota, "k", 1, now_us + 1) else {
            panic!("a second caller should wait for the first");
        };
        (probe, waiting)
    }

    #[test]
    fn answers_for_the_same_cost_until_retry_after() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        cache.insert(&quota, "k", 2, cache.asked(1_000_000), &denial(200));
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
        let (probe, waiting) = expired_and_asked(&cache, &quota, 1_200_000);
        assert!(
            matches!(cache.lookup(&quota, "k", 2, 1_200_001), Lookup::Miss),
            "another cost asks"
        );
        assert!(matches!(*waiting.borrow(), ProbeEnd::Asking));
        // The probe's answer, a new denial, lands before the probe is dropped.
        cache.insert(&quota, "k", 1, cache.asked(1_200_000), &denial(100));
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
        let (probe, waiting) = expired_and_asked(&cache, &quota, 1_300_000);
        // Failed, admitted with tokens to spare, or cancelled: no new entry.
        drop(probe);
        assert!(matches!(*waiting.borrow(), ProbeEnd::Done));
        assert!(matches!(
            cache.lookup(&quota, "k", 1, 1_300_002),
            Lookup::Miss
        ));
    }

    #[test]
    fn a_failed_probe_hands_its_error_to_the_waiters() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        let (probe, waiting) = expired_and_asked(&cache, &quota, 1_300_000);
        let failed = Err(Error::Timeout(Duration::from_millis(100)));
        let asked = cache.asked(1_300_000);
        cache.record(&quota, "k", 1, asked, &failed, Some(probe));
        let ProbeEnd::Failed(error) = &*waiting.borrow() else {
            panic!("the waiters should learn of the failure");
        };
        assert!(matches!(error, Error::Timeout(_)));
    }

    #[test]
    fn a_probe_s_mark_outlives_answers_for_other_costs_and_stale_answers_are_dropped() {
        let cache = DenyCache::new(1_000);
        let quota = Quota::per_second(5).unwrap();
        let (probe, _waiting) = expired_and_asked(&cache, &quota, 1_300_000);
        cache.insert(&quota, "k", 2, cache.asked(1_300_000), &denial(500));
        assert!(
            matches!(cache.lookup(&quota, "k", 1, 1_300_002), Lookup::Wait(_)),
            "still one caller asking for cost 1"
        );
        drop(probe);
        // An answer asked for before a refund's `forget` is not kept.
        let asked = cache.asked(1_300_000);
        cache.forget("k");
        cache.insert(&quota, "k", 1, asked, &denial(200));
        assert!(matches!(
            cache.lookup(&quota, "k", 1, 1_300_001),
            Lookup::Miss
        ));
        cache.insert(&quota, "k", 1, cache.asked(1_300_000), &denial(200));
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
        cache.insert_spent(&bucket, "k", 1, cache.asked(t), &decisions[0]);
        assert!(cache.get(&bucket, "k", 1, t).is_none(), "one token is left");
        cache.insert_spent(&bucket, "k", 1, cache.asked(t), &decisions[1]);
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
        cache.insert_spent(&window, "w", 1, cache.asked(t), &spent[1]);
        assert!(cache.get(&window, "w", 1, t + 1).is_none(), "buckets only");
    }

    #[test]
    fn stays_bounded_under_many_distinct_keys() {
        let cache = DenyCache::new(1_600);
        let quota = Quota::per_second(5).unwrap();
        for i in 0..100_000u64 {
            cache.insert(
                &quota,
                &format!("ip:{i}"),
                1,
                cache.asked(1_000),
                &denial(60_000),
            );
        }
        assert!(cache.len() <= 1_600, "{} entries", cache.len());
    }
}
