//! The embedded backend: the token bucket in process, with the same decisions
//! as the Redis script.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::algorithm::{self, State};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::quota::Quota;

/// Shards keep threads deciding on different keys off each other's lock.
const SHARDS: usize = 64;

/// A shard sweeps out full buckets when it reaches this many keys, and then
/// again each time it doubles from what the last sweep kept.
const MIN_SWEEP: usize = 256;

pub(crate) struct MemoryBackend {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
}

struct Shard {
    /// Each key's state and the instant it expires (as Redis would expire it).
    buckets: HashMap<Box<str>, (State, u64)>,
    sweep_at: usize,
}

impl MemoryBackend {
    pub(crate) fn new(clock: Arc<dyn Clock>) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    buckets: HashMap::new(),
                    sweep_at: MIN_SWEEP,
                })
            })
            .collect();
        Self {
            shards,
            hasher: RandomState::new(),
            clock,
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        // The lock guards plain data updated without panicking, so a poisoned
        // lock (a panic elsewhere while held) still holds consistent state.
        self.shards[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn decide(&self, quota: &Quota, key: &str, cost: u64) -> Decision {
        let now = self.clock.now_micros();
        let mut shard = self.shard(key);
        match shard.buckets.get_mut(key) {
            Some((state, expires_at)) => {
                // An expired state is one Redis would have dropped.
                let mut current = (*expires_at > now)
                    .then(|| std::mem::replace(state, State::Window { index: 0, count: 0 }));
                let (decision, wrote) = algorithm::decide(quota, &mut current, now, cost);
                if wrote {
                    *expires_at = now + decision.reset_after.as_micros() as u64;
                }
                match current {
                    Some(kept) => *state = kept,
                    None => {
                        shard.buckets.remove(key);
                    }
                }
                decision
            }
            None => {
                let mut fresh = None;
                let (decision, wrote) = algorithm::decide(quota, &mut fresh, now, cost);
                if let (true, Some(state)) = (wrote, fresh) {
                    let expires_at = now + decision.reset_after.as_micros() as u64;
                    shard.buckets.insert(key.into(), (state, expires_at));
                    shard.sweep_if_due(now);
                }
                decision
            }
        }
    }

    /// Keys currently held (buckets not yet known to be full).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .buckets
                    .len()
            })
            .sum()
    }
}

impl Shard {
    /// Drops buckets that are full again, as Redis expires them. Amortised
    /// O(1) per insert, and memory stays within twice the live keys.
    fn sweep_if_due(&mut self, now: u64) {
        if self.buckets.len() < self.sweep_at {
            return;
        }
        self.buckets.retain(|_, (_, expires_at)| *expires_at > now);
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
