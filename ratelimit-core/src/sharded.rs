//! A map split into shards, each behind a lock of its own and chosen by a
//! hash of the key, so that callers on different keys rarely wait on each
//! other. The deny cache, the token leases and the memory backend keep
//! their state in one.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// foldhash, seeded per process, so that keys chosen by clients cannot be
/// made to crowd one shard or one part of a table: a key is hashed on every
/// call, and SipHash (std's) costs several times as much on short keys.
pub(crate) type KeyHasher = hashbrown::DefaultHashBuilder;

pub(crate) struct Sharded<S> {
    shards: Box<[Padded<Mutex<S>>]>,
    hasher: KeyHasher,
}

/// A shard on cache lines of its own: threads locking neighbouring shards
/// would otherwise take the same line from each other at every lock (128
/// bytes, as CPUs fetch lines in adjacent pairs).
#[repr(align(128))]
struct Padded<T>(T);

impl<S> Sharded<S> {
    /// `count` shards rounded down to a power of two (at least one), so a
    /// key's shard is found with a mask rather than a division; each made by
    /// `shard` from the hasher that picks shards, so that a shard's
    /// [`KeyTable`] finds a key by the same hash.
    pub(crate) fn new(count: usize, mut shard: impl FnMut(&KeyHasher) -> S) -> Self {
        let hasher = KeyHasher::default();
        let count = 1 << count.max(1).ilog2();
        Self {
            shards: (0..count)
                .map(|_| Padded(Mutex::new(shard(&hasher))))
                .collect(),
            hasher,
        }
    }

    /// The key's hash, from which its shard is chosen (bits 32 and up), and
    /// which the deny cache also uses for a stripe of counters (bits 48 and
    /// up).
    pub(crate) fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key of this hash. Not from the low bits: a shard's
    /// [`KeyTable`] places keys by those, and keys that all shared them
    /// would start their probes in a fraction of its buckets.
    pub(crate) fn index_of(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.shards.len() - 1)
    }

    /// Locks the shard at `index`. Each holds plain data updated without
    /// panicking, so a lock poisoned by a panic elsewhere while it was held
    /// still guards consistent state.
    pub(crate) fn lock(&self, index: usize) -> MutexGuard<'_, S> {
        self.shards[index]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `key`'s hash, for its shard's [`KeyTable`], and its shard, locked.
    pub(crate) fn lock_hashed(&self, key: &str) -> (u64, MutexGuard<'_, S>) {
        let hash = self.hash(key);
        (hash, self.lock(self.index_of(hash)))
    }

    /// How many shards there are.
    pub(crate) fn count(&self) -> usize {
        self.shards.len()
    }

    /// The sum of `measure` over the shards, each locked in turn.
    #[cfg(test)]
    pub(crate) fn sum(&self, measure: impl Fn(&S) -> usize) -> usize {
        (0..self.count()).map(|i| measure(&self.lock(i))).sum()
    }
}

/// A shard's table of keys: a map whose lookups take the key's hash from
/// [`Sharded::hash`], so a key is hashed once per call rather than once to
/// pick its shard and again to find it.
pub(crate) struct KeyTable<V> {
    table: hashbrown::HashTable<(Box<str>, V)>,
    /// The same hasher as the shards', to rehash keys when the table grows.
    hasher: KeyHasher,
}

impl<V> KeyTable<V> {
    pub(crate) fn new(hasher: &KeyHasher) -> Self {
        Self {
            table: hashbrown::HashTable::new(),
            hasher: hasher.clone(),
        }
    }

    pub(crate) fn get(&self, hash: u64, key: &str) -> Option<&V> {
        self.table.find(hash, |(k, _)| **k == *key).map(|(_, v)| v)
    }

    pub(crate) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut V> {
        self.table
            .find_mut(hash, |(k, _)| **k == *key)
            .map(|(_, v)| v)
    }

    pub(crate) fn remove(&mut self, hash: u64, key: &str) -> Option<V> {
        match self.table.find_entry(hash, |(k, _)| **k == *key) {
            Ok(entry) => Some(entry.remove().0 .1),
            Err(_) => None,
        }
    }

    /// Sets `key`'s value.
    pub(crate) fn insert(&mut self, hash: u64, key: &str, value: V) {
        if let Some(held) = self.get_mut(hash, key) {
            *held = value;
            return;
        }
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, (key.into(), value), |(k, _)| hasher.hash_one(&**k));
    }

    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        self.table.retain(|(_, v)| keep(v));
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.table.iter().map(|(_, v)| v)
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn clear(&mut self) {
        self.table.clear();
    }

    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub(crate) fn shrink_to(&mut self, len: usize) {
        let hasher = &self.hasher;
        self.table.shrink_to(len, |(k, _)| hasher.hash_one(&**k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard's table starts a key's probe at its hash's low bits: were the
    /// shard chosen by those bits too, every key of a shard would share them
    /// and crowd a fraction of its buckets (with 64 shards, one in 64).
    #[test]
    fn the_keys_of_one_shard_spread_over_the_low_bits_their_table_uses() {
        let sharded = Sharded::new(64, |_| ());
        let mut low_bits = std::collections::HashSet::new();
        for i in 0..20_000 {
            let key = format!("user:{i}");
            let hash = sharded.hash(&key);
            if sharded.index_of(hash) == 0 {
                low_bits.insert(hash & 63);
            }
        }
        assert!(
            low_bits.len() > 48,
            "the keys of shard 0 take {} of 64 values of their low bits",
            low_bits.len()
        );
    }
}
