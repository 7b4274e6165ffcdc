//! The local deny cache: a key denied for a cost cannot be admitted for that
//! cost before its `retry_after` (buckets only refill with time, windows only
//! move forward, other instances only consume more). So the denial is kept in
//! process until then and answered from there, with no backend call: a flood
//! on a spent key costs Redis one call per `retry_after` and flooding caller,
//! not one per request.
//!
//! A cached answer is for the same cost only, so its `retry_after` (the time
//! left until the cached instant) and `reset_after` stay exact; `remaining`
//! is as of the backend's denial. A larger cost cannot succeed sooner either,
//! but its own `retry_after` is longer, so it asks the backend.
//!
//! Entries are checked against the quota they were made under (a changed
//! rule misses), dropped when a refund could make them wrong, and bounded in
//! number: under more distinct keys than the bound, the cache forgets, which
//! only costs a backend call.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::decision::Decision;
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
}

#[derive(Clone, Copy)]
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
}

impl DenyCache {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            max_per_shard: (max_keys / SHARDS).max(1),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<Box<str>, Vec<Entry>>> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The cached denial of `cost` from `key` under `quota` at `now_us`, if any.
    pub(crate) fn get(&self, quota: &Quota, key: &str, cost: u64, now_us: u64) -> Option<Decision> {
        if cost == 0 {
            return None;
        }
        let entry = *self
            .shard(key)
            .get(key)?
            .iter()
            .find(|e| e.cost == cost && e.quota == *quota)?;
        if now_us >= entry.until_us {
            return None;
        }
        let elapsed = now_us.saturating_sub(entry.decided_us);
        Some(Decision {
            allowed: false,
            limit: quota.capacity(),
            remaining: entry.remaining,
            retry_after: Duration::from_micros(entry.until_us - now_us),
            reset_after: Duration::from_micros(entry.reset_after_us.saturating_sub(elapsed)),
            delay: Duration::ZERO,
            fallback: false,
        })
    }

    /// Remembers a backend denial of `cost`, asked at `asked_us` (before the
    /// call, so the entry never outlives the true `retry_after`).
    pub(crate) fn insert(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        asked_us: u64,
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
        };
        let mut shard = self.shard(key);
        if let Some(entries) = shard.get_mut(key) {
            entries.retain(|e| e.until_us > asked_us && !(e.cost == cost && e.quota == *quota));
            if entries.len() >= COSTS_PER_KEY {
                entries.remove(0);
            }
            entries.push(entry);
            return;
        }
        if shard.len() >= self.max_per_shard {
            shard.retain(|_, entries| entries.iter().any(|e| e.until_us > asked_us));
            if shard.len() >= self.max_per_shard {
                // Still full of live denials: forgetting only costs backend calls.
                shard.clear();
            }
        }
        shard.insert(key.into(), vec![entry]);
    }

    /// Drops what is known of `key`: after a refund, it may be admitted sooner.
    pub(crate) fn forget(&self, key: &str) {
        self.shard(key).remove(key);
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
        cache.insert(&quota, "k", 2, 1_000_000, &denial(200));
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
    fn stays_bounded_under_many_distinct_keys() {
        let cache = DenyCache::new(1_600);
        let quota = Quota::per_second(5).unwrap();
        for i in 0..100_000u64 {
            cache.insert(&quota, &format!("ip:{i}"), 1, 1_000, &denial(60_000));
        }
        assert!(cache.len() <= 1_600, "{} entries", cache.len());
    }
}
