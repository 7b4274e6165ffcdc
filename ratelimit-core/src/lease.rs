//! Token leases: an instance takes up to N tokens in one backend call and
//! serves them in process. The global bound holds exactly, since leased
//! tokens are already counted in Redis; tokens not used before the lease
//! expires are lost, so a key shared by many instances can be under-admitted
//! by up to N - 1 tokens per instance per lease.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use crate::quota::Quota;

const SHARDS: usize = 16;

type Shard = Mutex<HashMap<Box<str>, Lease>>;

#[derive(Clone, Copy)]
struct Lease {
    quota: Quota,
    tokens: u64,
    expires_at_us: u64,
}

pub(crate) struct Leases {
    shards: Box<[Shard]>,
    hasher: RandomState,
    max_per_shard: usize,
}

impl Leases {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            max_per_shard: (max_keys / SHARDS).max(1),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Lease>> {
        self.shards[self.hasher.hash_one(key) as usize % SHARDS]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes `cost` from `key`'s live lease under `quota`; the tokens left in
    /// it, or `None` when there is no lease that covers the cost.
    pub(crate) fn take(&self, quota: &Quota, key: &str, cost: u64, now_us: u64) -> Option<u64> {
        let mut shard = self.shard(key);
        let lease = shard.get_mut(key)?;
        if lease.quota != *quota || lease.expires_at_us <= now_us || lease.tokens < cost {
            return None;
        }
        lease.tokens -= cost;
        Some(lease.tokens)
    }

    /// Keeps `tokens` leased for `key` until `expires_at_us`; the previous
    /// lease's tokens, if any, are lost.
    pub(crate) fn put(
        &self,
        quota: &Quota,
        key: &str,
        tokens: u64,
        now_us: u64,
        expires_at_us: u64,
    ) {
        let mut shard = self.shard(key);
        if shard.len() >= self.max_per_shard && !shard.contains_key(key) {
            shard.retain(|_, lease| lease.expires_at_us > now_us && lease.tokens > 0);
            if shard.len() >= self.max_per_shard {
                return;
            }
        }
        shard.insert(
            key.into(),
            Lease {
                quota: *quota,
                tokens,
                expires_at_us,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_serves_its_tokens_until_it_runs_out_or_expires() {
        let leases = Leases::new(100);
        let quota = Quota::per_second(100).unwrap();
        leases.put(&quota, "k", 3, 0, 1_000);
        assert_eq!(leases.take(&quota, "k", 2, 10), Some(1));
        assert_eq!(leases.take(&quota, "k", 2, 10), None, "one token left");
        assert_eq!(leases.take(&quota, "k", 1, 10), Some(0));
        leases.put(&quota, "k", 5, 0, 1_000);
        assert_eq!(leases.take(&quota, "k", 1, 1_000), None, "expired");
        leases.put(&quota, "k", 5, 0, 1_000);
        let other = Quota::per_second(50).unwrap();
        assert_eq!(leases.take(&other, "k", 1, 10), None, "another rule");
    }
}
