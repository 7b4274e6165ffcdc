//! The embedded backend: the token bucket in process, with the same decisions
//! as the Redis script.

use std::sync::{Arc, MutexGuard};

use crate::algorithm::{self, State};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::quota::Quota;
use crate::sharded::{KeyTable, Sharded};

/// Shards keep threads deciding on different keys off each other's lock.
const SHARDS: usize = 64;

/// Keys per shard below which a bounded backend uses fewer shards, so that a
/// small bound is held by few shards rather than rounded up to one key in
/// each of `SHARDS`.
const MIN_PER_SHARD: usize = 16;

/// A shard sweeps out full buckets when it reaches this many keys, and then
/// again each time it doubles from what the last sweep kept.
const MIN_SWEEP: usize = 256;

pub(crate) struct MemoryBackend {
    shards: Sharded<Shard>,
    /// The most keys a shard keeps; beyond it, the keys nearest to expiry
    /// are dropped, so memory stays bounded under any number of distinct
    /// keys. A key forgotten before its bucket refilled is admitted again as
    /// a fresh one: under-limiting, never an error.
    max_per_shard: usize,
    clock: Arc<dyn Clock>,
}

struct Shard {
    /// Each key's state and the instant it expires (as Redis would expire
    /// it). Kept as an `Option`, so that it is decided in place; a key whose
    /// state a decision or a refund empties is removed.
    buckets: KeyTable<(Option<State>, u64)>,
    sweep_at: usize,
}

impl MemoryBackend {
    #[cfg(test)]
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        Self::bounded(clock, usize::MAX)
    }

    /// A backend holding at most `max_keys` keys (at least one).
    pub(crate) fn bounded(clock: Arc<dyn Clock>, max_keys: usize) -> Self {
        let max_keys = max_keys.max(1);
        let shards = Sharded::new((max_keys / MIN_PER_SHARD).clamp(1, SHARDS), |hasher| {
            Shard {
                buckets: KeyTable::new(hasher),
                sweep_at: MIN_SWEEP,
            }
        });
        Self {
            max_per_shard: max_keys / shards.count(),
            shards,
            clock,
        }
    }

    /// The key's hash and its shard, locked.
    fn shard(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        self.shards.lock_hashed(key)
    }

    pub(crate) fn decide(&self, quota: &Quota, key: &str, cost: u64) -> Decision {
        let now = self.clock.now_micros();
        let (hash, mut shard) = self.shard(key);
        // A held key's state is decided where it is. State past its expiry
        // decides as no state would under the quota that wrote it, so it is
        // handed over as it is: under another quota it decides as a Redis
        // that has not expired the key yet would (see the twins on quota
        // changes). The sliding log drops another algorithm's state when it
        // writes nothing (a cost of zero); the key then goes.
        if let Some((state, expires_at)) = shard.buckets.get_mut(hash, key) {
            let (decision, wrote) = algorithm::decide(quota, state, now, cost);
            if wrote {
                *expires_at = now.saturating_add(decision.reset_after.as_micros() as u64);
            }
            if state.is_none() {
                shard.buckets.remove(hash, key);
            }
            return decision.asked_at(now);
        }
        let mut fresh = None;
        let (decision, wrote) = algorithm::decide(quota, &mut fresh, now, cost);
        if wrote && fresh.is_some() {
            let expires_at = now.saturating_add(decision.reset_after.as_micros() as u64);
            shard.buckets.insert(hash, key, (fresh, expires_at));
            shard.sweep_if_due(now, self.max_per_shard);
        }
        decision.asked_at(now)
    }

    /// The decision a request of `cost` would get now, with nothing written.
    pub(crate) fn peek(&self, quota: &Quota, key: &str, cost: u64) -> Decision {
        let now = self.clock.now_micros();
        let (hash, shard) = self.shard(key);
        let mut state = shard
            .buckets
            .get(hash, key)
            .and_then(|(state, _)| state.clone());
        drop(shard);
        algorithm::decide(quota, &mut state, now, cost).0
    }

    /// Gives back what an admission on `key` took (see [`algorithm::refund`]).
    /// The key keeps its expiry, which a refund can only bring closer.
    pub(crate) fn refund(&self, quota: &Quota, key: &str, refund: &algorithm::Refund) {
        let now = self.clock.now_micros();
        let (hash, mut shard) = self.shard(key);
        let Some((state, _)) = shard.buckets.get_mut(hash, key) else {
            return;
        };
        algorithm::refund(quota, state, now, refund);
        if state.is_none() {
            shard.buckets.remove(hash, key);
        }
    }

    /// Forgets `key`'s state: its quota is whole again.
    pub(crate) fn reset(&self, key: &str) {
        let (hash, mut shard) = self.shard(key);
        shard.buckets.remove(hash, key);
    }

    /// Decides for every request at one instant, admitting all or none: the
    /// shards involved are locked together (in index order, so concurrent
    /// calls cannot deadlock), every key decided on a copy of its state, and
    /// the copies stored only if every key admits. The keys must be distinct.
    pub(crate) fn decide_all(&self, requests: &[(&Quota, &str, u64)]) -> Vec<Decision> {
        let now = self.clock.now_micros();
        let hashes: Vec<u64> = requests
            .iter()
            .map(|(_, key, _)| self.shards.hash(key))
            .collect();
        let indexes: Vec<usize> = hashes.iter().map(|&h| self.shards.index_of(h)).collect();
        let mut order = indexes.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, Shard>)> =
            order.iter().map(|&i| (i, self.shards.lock(i))).collect();
        let mut decided = Vec::with_capacity(requests.len());
        for (((quota, key, cost), index), &hash) in requests.iter().zip(&indexes).zip(&hashes) {
            let shard = &guards[guards.binary_search_by_key(index, |(i, _)| *i).unwrap_or(0)].1;
            let mut state = shard
                .buckets
                .get(hash, key)
                .and_then(|(state, _)| state.clone());
            let (decision, wrote) = algorithm::decide(quota, &mut state, now, *cost);
            decided.push((decision.asked_at(now), wrote.then_some(state).flatten()));
        }
        let all_admitted = decided.iter().all(|(d, _)| d.allowed);
        let mut decisions = Vec::with_capacity(requests.len());
        for ((((_, key, _), index), &hash), (decision, state)) in
            requests.iter().zip(&indexes).zip(&hashes).zip(decided)
        {
            if let (true, Some(state)) = (all_admitted, state) {
                let position = guards.binary_search_by_key(index, |(i, _)| *i).unwrap_or(0);
                let shard = &mut guards[position].1;
                let expires_at = now.saturating_add(decision.reset_after.as_micros() as u64);
                shard.buckets.insert(hash, key, (Some(state), expires_at));
                shard.sweep_if_due(now, self.max_per_shard);
            }
            decisions.push(decision);
        }
        decisions
    }

    /// The most keys this backend holds.
    #[cfg(test)]
    pub(crate) fn max_keys(&self) -> usize {
        self.max_per_shard * self.shards.count()
    }

    /// Keys currently held (buckets not yet known to be full).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.sum(|shard| shard.buckets.len())
    }
}

impl Shard {
    /// Drops buckets that are full again, as Redis expires them. Amortised
    /// O(1) per insert, and memory stays within twice the live keys.
    fn sweep_if_due(&mut self, now: u64, max: usize) {
        if self.buckets.len() < self.sweep_at.min(max.saturating_add(1)) {
            return;
        }
        self.buckets.retain(|(_, expires_at)| *expires_at > now);
        if self.buckets.len() > max {
            // Over the bound: keep the half of `max` (at least one key)
            // furthest from expiry; of keys expiring at the cut, only as many
            // as fit.
            let keep = (max / 2).max(1);
            let mut expiries: Vec<u64> = self.buckets.values().map(|(_, e)| *e).collect();
            let cut_index = expiries.len() - keep;
            let (_, cut, _) = expiries.select_nth_unstable(cut_index);
            let cut = *cut;
            let mut at_cut = keep - expiries.iter().filter(|&&e| e > cut).count();
            self.buckets.retain(|(_, expires_at)| {
                if *expires_at > cut {
                    return true;
                }
                let kept = *expires_at == cut && at_cut > 0;
                at_cut -= usize::from(kept);
                kept
            });
        }
        self.sweep_at = (self.buckets.len() * 2).max(MIN_SWEEP);
        if self.buckets.capacity() > self.sweep_at * 2 {
            self.buckets.shrink_to(self.sweep_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::quota::Rate;
    use std::time::Duration;

    #[test]
    fn idle_keys_are_evicted_so_memory_stays_bounded() {
        let clock = ManualClock::new(1_000_000);
        let backend = MemoryBackend::new(Arc::new(clock.clone()));
        let quota = Quota::new(5, Rate::per_second(10).unwrap()).unwrap();
        let mut peak = 0;
        for round in 0..100u64 {
            for i in 0..10_000u64 {
                backend.decide(&quota, &format!("user:{round}:{i}"), 1);
            }
            peak = peak.max(backend.len());
            // Every bucket is full again after 100 ms.
            clock.advance(Duration::from_secs(1));
        }
        assert!(
            peak < 3 * 10_000 + SHARDS * MIN_SWEEP,
            "a million distinct keys, 10,000 live at a time, peaked at {peak} held keys"
        );
    }

    #[test]
    fn a_bounded_backend_stays_bounded_when_every_key_stays_live() {
        let clock = ManualClock::new(1_000_000);
        let backend = MemoryBackend::bounded(Arc::new(clock.clone()), 6_400);
        // One token per hour: no bucket refills during the test.
        let quota = Quota::new(5, Rate::per_hour(1).unwrap()).unwrap();
        let mut peak = 0;
        for i in 0..200_000u64 {
            backend.decide(&quota, &format!("ip:{i}"), 1);
            clock.advance(Duration::from_micros(1));
            peak = peak.max(backend.len());
        }
        assert!(
            peak <= 6_400 + SHARDS,
            "200,000 live keys held at most {peak}"
        );
        // Recent keys are kept exactly.
        for _ in 0..4 {
            backend.decide(&quota, "ip:199999", 1);
        }
        assert!(!backend.decide(&quota, "ip:199999", 1).allowed);
    }

    #[test]
    fn a_small_bound_keeps_its_newest_keys() {
        for bound in [1, 10, 100, 127] {
            let clock = ManualClock::new(1_000_000);
            let backend = MemoryBackend::bounded(Arc::new(clock.clone()), bound);
            let quota = Quota::new(2, Rate::per_hour(1).unwrap()).unwrap();
            for i in 0..1_000u64 {
                backend.decide(&quota, &format!("ip:{i}"), 1);
                clock.advance(Duration::from_micros(1));
                assert!(
                    backend.len() <= bound,
                    "a bound of {bound} held {} keys",
                    backend.len()
                );
            }
            // The newest key is kept: its second token is its last.
            assert!(backend.decide(&quota, "ip:999", 1).allowed, "bound {bound}");
            assert!(
                !backend.decide(&quota, "ip:999", 1).allowed,
                "a bound of {bound} forgot its newest key"
            );
        }
    }

    /// The sliding log drops another algorithm's state when it writes
    /// nothing (a cost of zero): the key goes with it, as it does when a
    /// refund empties a state.
    #[test]
    fn a_state_the_sliding_log_drops_leaves_no_key_behind() {
        let backend = MemoryBackend::new(Arc::new(ManualClock::new(1_000_000)));
        let bucket = Quota::new(5, Rate::per_second(1).unwrap()).unwrap();
        backend.decide(&bucket, "k", 1);
        assert_eq!(backend.len(), 1);
        let log = Quota::sliding_log(5, Duration::from_secs(1)).unwrap();
        assert_eq!(backend.decide(&log, "k", 0).remaining, 5);
        assert_eq!(backend.len(), 0, "an empty state was kept");
    }

    #[test]
    fn threads_share_one_exact_budget() {
        let clock = ManualClock::new(1_000_000);
        let backend = Arc::new(MemoryBackend::new(Arc::new(clock)));
        let quota = Quota::new(1_000, Rate::per_second(1).unwrap()).unwrap();
        let admitted: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let backend = &backend;
                    s.spawn(move || {
                        (0..500)
                            .filter(|_| backend.decide(&quota, "hot", 1).allowed)
                            .count() as u64
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted, 1_000,
            "4,000 attempts on a stopped clock admit exactly the capacity"
        );
    }
}
