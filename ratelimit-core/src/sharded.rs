//! A map split into shards, each behind a lock of its own and chosen by a
//! hash of the key, so that callers on different keys rarely wait on each
//! other. The deny cache, the token leases and the memory backend keep
//! their state in one.

use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) struct Sharded<S> {
    shards: Box<[Mutex<S>]>,
    /// Seeded per process, so that keys chosen by clients cannot be made to
    /// crowd one shard.
    hasher: RandomState,
}

impl<S> Sharded<S> {
    /// `count` shards (at least one), each made by `shard`.
    pub(crate) fn new(count: usize, mut shard: impl FnMut() -> S) -> Self {
        Self {
            shards: (0..count.max(1)).map(|_| Mutex::new(shard())).collect(),
            hasher: RandomState::new(),
        }
    }

    /// The key's hash, from which its shard is chosen (its low bits), and
    /// which the deny cache also uses for a stripe of counters (its high
    /// bits).
    pub(crate) fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key of this hash.
    pub(crate) fn index_of(&self, hash: u64) -> usize {
        hash as usize % self.shards.len()
    }

    /// The shard of `key`.
    pub(crate) fn index(&self, key: &str) -> usize {
        self.index_of(self.hash(key))
    }

    /// Locks the shard at `index`. Each holds plain data updated without
    /// panicking, so a lock poisoned by a panic elsewhere while it was held
    /// still guards consistent state.
    pub(crate) fn lock(&self, index: usize) -> MutexGuard<'_, S> {
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks the shard of `key`.
    pub(crate) fn lock_key(&self, key: &str) -> MutexGuard<'_, S> {
        self.lock(self.index(key))
    }

    /// How many shards there are.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.shards.len()
    }

    /// The sum of `measure` over the shards, each locked in turn.
    #[cfg(test)]
    pub(crate) fn sum(&self, measure: impl Fn(&S) -> usize) -> usize {
        (0..self.count()).map(|i| measure(&self.lock(i))).sum()
    }
}
