//! Token leases: an instance takes up to N tokens in one backend call and
//! serves them in process. Leased tokens are counted in Redis when leased, so
//! a lease must never serve a token later than the algorithm could have
//! admitted it then; what it holds is cut so each algorithm keeps its bound:
//! - a fixed window's lease (and a sliding window counter's) ends with the
//!   window its tokens were counted in;
//! - a bucket's lease holds at most the tokens the bucket still owes for it:
//!   as the bucket refills, the lease shrinks, so tokens served from it plus
//!   those the bucket holds never exceed the capacity.
//!
//! Tokens not used before the lease ends are lost, so a key shared by many
//! instances can be under-admitted by up to N - 1 tokens per instance per
//! lease. The sliding log (whose bound is over any window, not an aligned
//! one) and the leaky bucket (whose admissions carry each call's delay) take
//! no leases.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::quota::Quota;
use crate::sharded::{KeyTable, Sharded};

const SHARDS: usize = 16;

/// The most keys holding a lease at once: this bounds memory under a flood
/// of distinct leased keys, each of whose leases lives one lease TTL at
/// most. A key that finds the leases full takes its request's cost alone
/// from the backend, as with no lease (see [`Leases::take`]).
pub(crate) const MAX_KEYS: usize = 100_000;

#[derive(Clone, Copy)]
struct Lease {
    quota: Quota,
    tokens: u64,
    expires_at_us: u64,
    /// For a bucket: when the bucket is full again, as of the lease's
    /// decision. The lease holds no more than the tokens owed until then.
    owed_until_us: Option<u64>,
    /// When the decision that set `owed_until_us` was asked for: an
    /// admission asked for before it is owed before the lease's tokens.
    asked_at_us: u64,
    /// Unique to this lease, so a refund gives tokens back to the lease
    /// they were served from and to no later one.
    id: u64,
}

impl Lease {
    /// The tokens this lease may still serve at `now_us`.
    fn usable(&self, now_us: u64) -> u64 {
        let Some(until) = self.owed_until_us else {
            return self.tokens;
        };
        // The decision's reset_after is rounded up to the microsecond: one
        // microsecond less never counts a refilled token as owed.
        let owed_us = until.saturating_sub(now_us).saturating_sub(1);
        let rate = self.quota.rate();
        let owed = u128::from(owed_us) * u128::from(rate.tokens()) / rate.period().as_micros();
        self.tokens.min(u64::try_from(owed).unwrap_or(u64::MAX))
    }
}

/// Keys are spread over this many counters of removals: a removal drops
/// the leases on their way of the keys that share its counter.
const REMOVAL_STRIPES: usize = 1024;

/// What [`Leases::asked`] saw of a key's leases before its backend call:
/// how many times they were removed, so that a lease the call answers is
/// not kept if they were removed since (a reset or a refund landed
/// meanwhile).
#[derive(Clone, Copy)]
pub(crate) struct Asked {
    stripe: usize,
    removals: u64,
}

pub(crate) struct Leases {
    shards: Sharded<KeyTable<Lease>>,
    /// Per shard, the leases removed from it by [`remove`](Leases::remove).
    removals: Vec<AtomicU64>,
    max_per_shard: usize,
    /// Whether any lease was ever taken: until then, no decision pays for a
    /// look at the leases.
    used: AtomicBool,
    next_id: AtomicU64,
}

impl Leases {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            shards: Sharded::new(SHARDS, KeyTable::new),
            removals: (0..REMOVAL_STRIPES).map(|_| AtomicU64::new(0)).collect(),
            max_per_shard: (max_keys / SHARDS).max(1),
            used: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        }
    }

    /// The key's hash and its shard, locked.
    fn shard(&self, key: &str) -> (u64, std::sync::MutexGuard<'_, KeyTable<Lease>>) {
        self.shards.lock_hashed(key)
    }

    /// Takes `cost` from `key`'s live lease under `quota`: the tokens left in
    /// it and the lease's id; when no lease covers the cost, whether a
    /// lease of `key` could be kept now (see [`room`](Self::room)), read
    /// under the same lock.
    pub(crate) fn take(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        now_us: u64,
    ) -> Result<(u64, u64), bool> {
        let (hash, mut shard) = self.shard(key);
        let Some(lease) = shard.get_mut(hash, key) else {
            return Err(self.room(&mut shard, now_us));
        };
        if lease.quota != *quota || lease.expires_at_us <= now_us {
            return Err(true);
        }
        // Tokens the bucket has refilled since are gone from the lease.
        lease.tokens = lease.usable(now_us);
        if lease.tokens < cost {
            return Err(true);
        }
        lease.tokens -= cost;
        Ok((lease.tokens, lease.id))
    }

    /// Whether a shard that does not hold a key has room for its lease. A
    /// lease asked for with no room to keep it would take its tokens from
    /// the backend and lose them, so every key that leases after the table
    /// filled (distinct keys of a flood) would be served a fraction of its
    /// quota.
    fn room(&self, shard: &mut KeyTable<Lease>, now_us: u64) -> bool {
        if shard.len() < self.max_per_shard {
            return true;
        }
        shard.retain(|lease| lease.expires_at_us > now_us && lease.tokens > 0);
        shard.len() < self.max_per_shard
    }

    /// Gives `cost` back to the lease `id` served it from, if that lease is
    /// still `key`'s and live; `false` when it is gone.
    pub(crate) fn give_back(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        id: u64,
        now_us: u64,
    ) -> bool {
        let (hash, mut shard) = self.shard(key);
        match shard.get_mut(hash, key) {
            Some(lease)
                if lease.id == id && lease.quota == *quota && lease.expires_at_us > now_us =>
            {
                lease.tokens = lease.tokens.saturating_add(cost);
                true
            }
            _ => false,
        }
    }

    /// A refund of `units` of a bucket's debt, made on the backend at `now`
    /// (by this limiter) for an admission asked for at `asked_at_us`. A
    /// bucket repays its oldest debt first, so the refund of an admission
    /// asked for no later than `key`'s lease (under `quota`) brings the
    /// lease's tokens that much sooner: the lease is owed that much less
    /// time, and never serves a token the bucket holds again. An admission
    /// asked for after the lease is owed after it, and its refund leaves
    /// the lease as it is. The refund of an admission under another quota
    /// drops the lease.
    pub(crate) fn refunded(
        &self,
        quota: &Quota,
        key: &str,
        units: u64,
        asked_at_us: u64,
        now_us: u64,
    ) {
        if units == 0 || !self.used.load(Ordering::SeqCst) {
            return;
        }
        self.unsettle(quota, key);
        let (hash, mut shard) = self.shard(key);
        let Some(lease) = shard.get_mut(hash, key) else {
            return;
        };
        if asked_at_us > lease.asked_at_us {
            return;
        }
        if lease.quota != *quota {
            // An admission under another quota (a rule changed while its
            // call ran): its refund brings the bucket's tokens sooner all
            // the same, by an amount the lease's quota does not measure.
            // The lease goes, with any lease a call in flight would bring;
            // their tokens are lost, which admits less.
            drop(shard);
            self.remove(key);
            return;
        }
        if let Some(until) = &mut lease.owed_until_us {
            // Rounded up: the lease is never owed longer than the bucket.
            let sooner = units.div_ceil(quota.rate().tokens());
            *until = until.saturating_sub(sooner).max(now_us);
        }
    }

    /// Drops `key`'s lease if it was taken under another quota than
    /// `quota`: a decision under another quota may not count the leased
    /// tokens (a changed window starts a new count), so serving them after
    /// it could admit more than the quota's bound.
    pub(crate) fn forget_other_quota(&self, quota: &Quota, key: &str) {
        if !self.used.load(Ordering::Relaxed) {
            return;
        }
        let (hash, mut shard) = self.shard(key);
        if shard
            .get(hash, key)
            .is_some_and(|lease| lease.quota != *quota)
        {
            shard.remove(hash, key);
        }
    }

    /// A bucket refund of `key` is on its way to the backend, or has just
    /// landed: a lease of the key on its way may have been decided before
    /// it, and would come owed as long as the bucket was before it. It is
    /// not kept (see [`put`](Self::put)), as after a reset; so are those of
    /// the keys that share its counter, which admits less. Called when the
    /// refund is made and again when it has landed (or its caller is
    /// gone), for leases asked for in between.
    pub(crate) fn unsettle(&self, quota: &Quota, key: &str) {
        if quota.algorithm().is_windowed() || !self.used.load(Ordering::SeqCst) {
            return;
        }
        self.removals[self.stripe(key)].fetch_add(1, Ordering::SeqCst);
    }

    fn stripe(&self, key: &str) -> usize {
        (self.shards.hash(key) >> 16) as usize % REMOVAL_STRIPES
    }

    /// Taken before a backend call that may lease `key`'s tokens, for
    /// [`put`](Self::put).
    pub(crate) fn asked(&self, key: &str) -> Asked {
        // From the first lease asked for: a refund made while it is on its
        // way must find it counted.
        self.used.store(true, Ordering::SeqCst);
        let stripe = self.stripe(key);
        Asked {
            stripe,
            removals: self.removals[stripe].load(Ordering::SeqCst),
        }
    }

    /// Drops `key`'s lease, if any, and any lease a backend call asked for
    /// before now would bring (see [`put`](Self::put)).
    pub(crate) fn remove(&self, key: &str) {
        self.removals[self.stripe(key)].fetch_add(1, Ordering::SeqCst);
        // Sequentially consistent with `put`'s store: one of the two sees
        // the other's write.
        if !self.used.load(Ordering::SeqCst) {
            return;
        }
        let (hash, mut shard) = self.shard(key);
        shard.remove(hash, key);
    }

    /// Keeps `tokens` leased for `key` until `expires_at_us` (for a bucket,
    /// shrinking as it refills until `owed_until_us`). A live lease of the
    /// same quota keeps its tokens too: callers that found no lease at
    /// once each lease, and replacing one lease by the next would lose its
    /// tokens (400 callers on a cold key were admitted 20 of 100 so). The
    /// merged lease ends with the earlier of the two, and owes what the
    /// later decision says the bucket owes, which counts both. Not kept if
    /// leases of its shard were removed since `asked` was taken: the key
    /// was reset (or refunded) while its call was on its way, and the backend may no
    /// longer count the tokens (some leases of other keys are lost with it,
    /// which under-admits). The lease's id, or `None` when it was not kept.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put(
        &self,
        asked: Asked,
        quota: &Quota,
        key: &str,
        tokens: u64,
        now_us: u64,
        expires_at_us: u64,
        owed_until_us: Option<u64>,
    ) -> Option<u64> {
        self.used.store(true, Ordering::SeqCst);
        let (hash, mut shard) = self.shard(key);
        // Read under the shard's lock, which `remove` takes after counting:
        // a removal counted after this read finds the lease and drops it.
        if self.removals[asked.stripe].load(Ordering::SeqCst) != asked.removals {
            return None;
        }
        if let Some(live) = shard.get_mut(hash, key) {
            if live.quota == *quota && live.expires_at_us > now_us {
                live.tokens = live.usable(now_us).saturating_add(tokens);
                live.expires_at_us = live.expires_at_us.min(expires_at_us);
                if owed_until_us > live.owed_until_us {
                    live.owed_until_us = owed_until_us;
                    live.asked_at_us = now_us;
                }
                return Some(live.id);
            }
        }
        if shard.get(hash, key).is_none() && !self.room(&mut shard, now_us) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        shard.insert(
            hash,
            key,
            Lease {
                quota: *quota,
                tokens,
                expires_at_us,
                owed_until_us,
                asked_at_us: now_us,
                id,
            },
        );
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_has_room_only_for_its_keys_until_leases_end() {
        // One key a shard.
        let leases = Leases::new(SHARDS);
        let quota = Quota::per_second(100).unwrap();
        let mut held = Vec::new();
        let mut refused = None;
        for i in 0..10_000 {
            let key = format!("k{i}");
            if leases.take(&quota, &key, 1, 0) == Err(false) {
                refused = Some(key);
                break;
            }
            assert!(leases
                .put(leases.asked(&key), &quota, &key, 3, 0, 1_000, None)
                .is_some());
            held.push(key);
        }
        let refused = refused.expect("a shard filled");
        // A key already leased has room for more; a new one in a full
        // shard has none until the leases there expire.
        assert!(held
            .iter()
            .all(|key| leases.take(&quota, key, 1, 0).is_ok()));
        assert_eq!(leases.take(&quota, &refused, 1, 999), Err(false));
        assert_eq!(leases.take(&quota, &refused, 1, 1_000), Err(true));
    }

    #[test]
    fn a_lease_serves_its_tokens_until_it_runs_out_or_expires() {
        let leases = Leases::new(100);
        let quota = Quota::per_second(100).unwrap();
        leases.put(leases.asked("k"), &quota, "k", 3, 0, 1_000, None);
        assert_eq!(leases.take(&quota, "k", 2, 10).ok().map(|t| t.0), Some(1));
        assert_eq!(leases.take(&quota, "k", 2, 10).ok(), None, "one token left");
        assert_eq!(leases.take(&quota, "k", 1, 10).ok().map(|t| t.0), Some(0));
        leases.put(leases.asked("k"), &quota, "k", 5, 0, 1_000, None);
        assert_eq!(leases.take(&quota, "k", 1, 1_000).ok(), None, "expired");
        // A lease taken while another is live adds to it.
        leases.put(leases.asked("k"), &quota, "k", 2, 1_000, 2_000, None);
        leases.put(leases.asked("k"), &quota, "k", 3, 1_500, 1_800, None);
        assert_eq!(
            leases.take(&quota, "k", 5, 1_600).ok().map(|t| t.0),
            Some(0)
        );
        leases.put(leases.asked("k"), &quota, "k", 1, 1_600, 3_000, None);
        assert_eq!(
            leases.take(&quota, "k", 1, 1_800).ok(),
            None,
            "the merged lease ends with the earlier"
        );
        leases.put(leases.asked("k"), &quota, "k", 5, 0, 1_000, None);
        let other = Quota::per_second(50).unwrap();
        assert_eq!(leases.take(&other, "k", 1, 10).ok(), None, "another rule");
    }

    #[test]
    fn a_token_goes_back_to_the_lease_it_came_from_and_no_other() {
        let leases = Leases::new(100);
        let quota = Quota::per_second(100).unwrap();
        leases.put(leases.asked("k"), &quota, "k", 2, 0, 1_000, None);
        let (_, first) = leases.take(&quota, "k", 1, 10).ok().unwrap();
        assert!(leases.give_back(&quota, "k", 1, first, 20));
        assert_eq!(leases.take(&quota, "k", 2, 30).ok().map(|t| t.0), Some(0));
        // Leased again while it lives: the same lease.
        assert_eq!(
            leases.put(leases.asked("k"), &quota, "k", 1, 40, 1_000, None),
            Some(first)
        );
        // Once it ended, a lease of its own.
        let second = leases
            .put(leases.asked("k"), &quota, "k", 2, 1_000, 2_000, None)
            .unwrap();
        assert_ne!(second, first);
        assert!(
            !leases.give_back(&quota, "k", 1, first, 1_040),
            "a later lease"
        );
        leases.take(&quota, "k", 1, 1_050).ok().unwrap();
        assert!(!leases.give_back(&quota, "k", 1, second, 2_000), "expired");
    }

    #[test]
    fn a_bucket_lease_is_owed_less_after_a_refund() {
        let leases = Leases::new(100);
        // 10 tokens a second: one token every 100,000 µs.
        let quota = Quota::new(10, "10/s".parse().unwrap()).unwrap();
        // Eight leased from a bucket that owes ten: full again in a second.
        leases.put(
            leases.asked("k"),
            &quota,
            "k",
            8,
            0,
            10_000_000,
            Some(1_000_000),
        );
        // Five tokens given back on the backend, of an admission asked for
        // before the lease: full again at 500,000 µs.
        let token = quota.rate().period_us();
        leases.refunded(&quota, "k", 5 * token, 0, 0);
        assert_eq!(
            leases.take(&quota, "k", 1, 0).ok().map(|t| t.0),
            Some(3),
            "4 owed at once (the bound's microsecond), one served"
        );
        // A refund of none, or of an admission asked for after the lease
        // (owed after it), changes nothing.
        leases.refunded(&quota, "k", 0, 0, 0);
        leases.refunded(&quota, "k", 5 * token, 1, 0);
        assert_eq!(leases.take(&quota, "k", 1, 0).ok().map(|t| t.0), Some(2));
        // One of an admission under another quota drops the lease: by how
        // much it brings the tokens sooner, in the lease's own terms, is
        // not known.
        leases.refunded(&Quota::per_second(5).unwrap(), "k", 5 * token, 0, 0);
        assert_eq!(leases.take(&quota, "k", 1, 0).ok().map(|t| t.0), None);
    }

    #[test]
    fn a_bucket_lease_shrinks_as_the_bucket_refills() {
        let leases = Leases::new(100);
        // 10 tokens a second: one token every 100,000 µs.
        let quota = Quota::new(10, "10/s".parse().unwrap()).unwrap();
        // Five leased from a bucket that is full again 500,000 µs later.
        leases.put(
            leases.asked("k"),
            &quota,
            "k",
            5,
            0,
            10_000_000,
            Some(500_000),
        );
        assert_eq!(
            leases.take(&quota, "k", 1, 0).ok().map(|t| t.0),
            Some(3),
            "4 owed at once, one served"
        );
        // 250 ms on, the bucket owes 2 tokens: the lease holds no more.
        assert_eq!(
            leases.take(&quota, "k", 1, 250_000).ok().map(|t| t.0),
            Some(1)
        );
        assert_eq!(
            leases.take(&quota, "k", 1, 499_999).ok(),
            None,
            "nothing owed any longer"
        );
    }
}
