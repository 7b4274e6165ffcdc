//! Refunds: an admission's cost given back where it was taken (see
//! [`Limiter::refund`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::request::{Admitted, OwnedAdmitted};
use super::{answered_in_process, Limiter};
use crate::algorithm::Refund;
use crate::backend::Deadline;
use crate::decision::Decision;
use crate::decision::Via;
use crate::error::Error;
use crate::quota::Quota;
use crate::sharded::KeyHasher;

/// How many keys' resets [`Resets`] tells apart: keys that share a slot
/// share their last reset.
const RESET_SLOTS: usize = 1024;

/// Which resets this limiter has begun, by slots a hash of the key chooses.
/// An admission whose check began before its key's reset ended holds
/// nothing of the state after it (the reset deleted what it took), so its
/// refund gives nothing back: given to the count or debt begun after the
/// reset, it would admit a request over the quota. A key sharing the slot of
/// a key reset since its admission gives nothing back either, which admits
/// less, never more. Refunds are only taken from admissions of this limiter,
/// so its own resets are the ones that can be known here.
///
/// Resets are told apart from admissions by a count, not by the clock: a
/// clock may step back between an admission and a reset, and the reset
/// would then seem to come first.
pub(super) struct Resets {
    hasher: KeyHasher,
    /// Marks made so far (see [`mark`](Self::mark)).
    begun: AtomicU64,
    /// Per slot, the count of marks when one of its keys was last marked;
    /// 0 for none.
    marked: Box<[AtomicU64]>,
}

impl Resets {
    pub(super) fn new() -> Self {
        Self {
            hasher: KeyHasher::default(),
            begun: AtomicU64::new(0),
            marked: (0..RESET_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The slot of `key`, and of its variants (`key~<algorithm>`,
    /// `key~<position>`, which the attribute and the HTTP layer make): a
    /// reset, which resets a key's variants with it, marks one slot.
    fn slot(&self, key: &str) -> &AtomicU64 {
        use std::hash::BuildHasher;
        let base = key.split('~').next().unwrap_or(key);
        let hash = self.hasher.hash_one(base);
        &self.marked[(hash >> 32) as usize % RESET_SLOTS]
    }

    /// Marks `key` as reset, as a reset does when it starts and again when
    /// it ends or its caller is gone (it may land later still, which
    /// nothing here can tell).
    pub(super) fn mark(&self, key: &str) {
        let mark = self.begun.fetch_add(1, Ordering::SeqCst) + 1;
        self.slot(key).fetch_max(mark, Ordering::SeqCst);
    }

    /// The marks made so far: what an admission's check notes before it
    /// decides.
    pub(super) fn begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Whether `key` was marked after `begun` marks had been made.
    fn since(&self, key: &str, begun: u64) -> bool {
        self.slot(key).load(Ordering::SeqCst) > begun
    }
}

/// One request an admission took, as a refund needs it.
pub(super) struct Taken<'a> {
    quota: &'a Quota,
    key: &'a str,
    cost: u64,
    rule: &'static str,
    decision: &'a Decision,
}

impl Limiter {
    pub(super) async fn give_back(&self, admitted: &Admitted<'_>) -> Result<(), Error> {
        let origin = admitted.origin();
        if origin.limiter != self.inner.id {
            return Err(Error::OtherLimiter);
        }
        let taken = admitted.taken().map(|(request, decision)| Taken {
            quota: request.quota,
            key: request.key,
            cost: request.cost,
            rule: request.rule,
            decision,
        });
        self.give_back_each(taken, origin.resets).await
    }

    /// [`refund`](Self::refund) of an admission whose keys and quotas it
    /// owns (`#[rate_limit(refund_on = ...)]` keeps one while the body runs).
    #[doc(hidden)]
    pub async fn __refund_owned(&self, admitted: OwnedAdmitted) -> Result<(), Error> {
        if admitted.origin.limiter != self.inner.id {
            return Err(Error::OtherLimiter);
        }
        let taken = admitted.taken.iter().map(|t| Taken {
            quota: &t.quota,
            key: &t.key,
            cost: t.cost,
            rule: t.rule,
            decision: &t.decision,
        });
        self.give_back_each(taken, admitted.origin.resets).await
    }

    /// Gives back each of `taken`, whose check began after `resets` resets
    /// had begun.
    async fn give_back_each<'a>(
        &self,
        taken: impl Iterator<Item = Taken<'a>>,
        resets: u64,
    ) -> Result<(), Error> {
        let now = self.inner.cache_clock.now_micros();
        let mut remote: Vec<(&Quota, &str, Refund)> = Vec::new();
        // The rules of the refunds sent to the backend, counted once it
        // took them.
        let mut remote_rules: Vec<&'static str> = Vec::new();
        for Taken {
            quota,
            key,
            cost,
            rule,
            decision,
        } in taken
        {
            if self.inner.resets.since(key, resets) {
                continue;
            }
            let elapsed = now.saturating_sub(decision.at);
            match decision.via {
                Via::Nothing => continue,
                Via::Local => {
                    let share = quota.scaled(self.inner.local_share);
                    let Some(refund) = Refund::of(&share, decision, cost, elapsed) else {
                        continue;
                    };
                    self.inner.local.refund(&share, key, &refund);
                }
                Via::Lease(id) => {
                    // A lease gone took its tokens with it: what is left of
                    // this one in the backend is not known, and giving
                    // anything back could give back a refilled token.
                    if !self.inner.leases.give_back(quota, key, cost, id, now) {
                        continue;
                    }
                }
                Via::Backend => {
                    let Some(refund) = Refund::of(quota, decision, cost, elapsed) else {
                        continue;
                    };
                    // A bucket's lease of this key holds no more than the
                    // bucket owed when it was taken, which this refund may
                    // make less: so must the lease then.
                    self.inner
                        .leases
                        .refunded(quota, key, refund.units, decision.at, now);
                    remote.push((quota, key, refund));
                    remote_rules.push(rule);
                    continue;
                }
            }
            self.inner.stats.refunded(rule);
        }
        if remote.is_empty() {
            answered_in_process().await;
            return Ok(());
        }
        let backend = &self.inner.backend;
        let deadline = Deadline::after(self.inner.timeout);
        // A cached denial of these keys may end sooner now. Forgotten after
        // the refund, so an answer asked for before it is not kept either,
        // and also when the caller gives up on the refund after it went out.
        let _cached = CachedDenials {
            cache: self.inner.deny_cache.as_ref(),
            refunds: &remote,
        };
        let result = if backend.can_fail() {
            self.guarded(backend.refund(&remote, &deadline)).await
        } else {
            let result = backend.refund(&remote, &deadline).await;
            answered_in_process().await;
            result
        };
        if result.is_ok() {
            for rule in remote_rules {
                self.inner.stats.refunded(rule);
            }
        }
        result
    }
}

/// Forgets the deny cache's denials of the keys of `refunds` when dropped:
/// once the backend has taken the refunds, or once their caller has given
/// up on them (they may have reached it).
struct CachedDenials<'a> {
    cache: Option<&'a crate::deny_cache::DenyCache>,
    refunds: &'a [(&'a Quota, &'a str, Refund)],
}

impl Drop for CachedDenials<'_> {
    fn drop(&mut self) {
        for (_, key, _) in self.refunds {
            if let Some(cache) = self.cache {
                cache.forget(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reset marks a key and its variants, which share one slot: the
    /// variants' refunds know of it, and no other slot is marked (marked
    /// apart, the seven keys of a reset made seven slots skip refunds).
    #[test]
    fn a_key_and_its_variants_share_one_slot() {
        let resets = Resets::new();
        for key in ["k", "k~gcra", "k~fixed_window", "k~2"] {
            resets.mark(key);
        }
        assert!(resets.since("k~sliding_log", 1));
        assert!(resets.since("k~gcra~2", 3));
        assert!(!resets.since("k~gcra~2", 4));
        let marked = resets
            .marked
            .iter()
            .filter(|slot| slot.load(Ordering::SeqCst) != 0)
            .count();
        assert_eq!(marked, 1);
    }
}
