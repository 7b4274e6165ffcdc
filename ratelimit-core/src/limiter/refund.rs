//! Refunds: an admission's cost given back where it was taken (see
//! [`Limiter::refund`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::request::{Admitted, Origin, OwnedAdmitted};
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

    /// Counts an event that is not a reset (a bucket refund landing), for
    /// [`Refunded`] to order against checks; returns the new count.
    fn count(&self) -> u64 {
        self.begun.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Whether `key` was marked after `begun` marks had been made.
    fn since(&self, key: &str, begun: u64) -> bool {
        self.slot(key).load(Ordering::SeqCst) > begun
    }
}

/// Slots of [`Refunded`]: keys that share one are told apart by their hash.
const REFUND_SLOTS: usize = 256;

/// Refunds of one slot kept; past it the oldest that has landed goes.
const REFUNDS_PER_SLOT: usize = 64;

/// The bucket refunds this limiter made, by key, so that a later refund of
/// the same key gives back no token that refilled.
///
/// A bucket's debt drains oldest first, and a refund gives back what is
/// left of an admission's cost: its decision's debt less what has drained
/// since, as if the admission were still the newest part of the debt. A
/// refund of an older admission made since has moved the admission's tokens
/// up the queue by what it gave back, so they drain sooner. A bucket of 4 at
/// one token per 5 s, taken 2 by A then 2 by B, A refunded, then 5 s later 1
/// by C: one of B's tokens is left, where its debt less what drained says 2,
/// and giving back 2 would admit 5 at one instant.
///
/// So a refund is taken off by what refunds of the key gave back that
/// surely came before it in the debt and surely landed after it was
/// decided: exact for admissions and refunds that do not overlap in time.
/// Of refunds that overlap a check, nothing can tell here whether they came
/// before its decision or after, and they are not counted; nor are other
/// instances' refunds, refunds past the [`REFUNDS_PER_SLOT`] latest of a
/// slot, or refunds made while that many of the slot are on their way.
///
/// Which admission came first: an admission's end (see [`end_of`]) plus
/// the units the limiter's refunds of the key had given back when it was
/// decided never falls from one admission to the next (an admission raises
/// the end; a refund lowers it by what it adds to those units).
pub(super) struct Refunded {
    hasher: KeyHasher,
    slots: Box<[Mutex<VecDeque<GivenBack>>]>,
}

/// One refund of a bucket's admission.
struct GivenBack {
    hash: u64,
    id: u64,
    /// The count (see [`Resets::count`]) when the refunded admission's
    /// decisions arrived.
    done: u64,
    /// The latest its debt can have ended (see [`end_of`]), with what
    /// drained while its decision was on its way back.
    end: u128,
    /// The count when the refund was sent, and when it landed (`u64::MAX`
    /// while in flight).
    sent: u64,
    landed: u64,
    units: u64,
    /// After this instant (µs on the limiter's clock) every admission it
    /// could have moved up has drained whole.
    until_us: u64,
}

/// A refund noted in [`Refunded`], to mark as landed.
pub(super) struct Noted {
    slot: usize,
    id: u64,
}

impl Refunded {
    pub(super) fn new() -> Self {
        Self {
            hasher: KeyHasher::default(),
            slots: (0..REFUND_SLOTS).map(|_| Mutex::default()).collect(),
        }
    }

    fn place(&self, key: &str) -> (usize, u64) {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(key);
        ((hash >> 32) as usize % REFUND_SLOTS, hash)
    }

    fn lock(&self, slot: usize) -> std::sync::MutexGuard<'_, VecDeque<GivenBack>> {
        self.slots[slot]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// What refunds of `key` have moved up the tokens of the admission made
    /// at `origin`, whose debt ended at `end` at the earliest, in the
    /// algorithm's units.
    fn moved_up(&self, key: &str, origin: Origin, end: u128) -> u64 {
        let (slot, hash) = self.place(key);
        let refunds = self.lock(slot);
        let of_key = || refunds.iter().filter(|r| r.hash == hash);
        // The units given back before the admission's check began: surely
        // in its decision.
        let landed: u128 = of_key()
            .filter(|r| r.landed <= origin.resets)
            .map(|r| u128::from(r.units))
            .sum();
        // The units sent before `done`: the most that can be in a decision
        // whose reply arrived by then. (Kept in the order sent.)
        let sent_by = |done: u64| -> u128 {
            of_key()
                .take_while(|r| r.sent <= done)
                .map(|r| u128::from(r.units))
                .sum()
        };
        of_key()
            // Sent once the admission's reply was in: landed after it.
            .filter(|r| r.sent > origin.done)
            // Surely earlier in the debt.
            .filter(|r| r.end + sent_by(r.done) < end + landed)
            .fold(0u64, |sum, r| sum.saturating_add(r.units))
    }

    /// Notes a refund of `units` of `key`'s admission made at `origin`,
    /// whose debt ended at `end` at the latest, in flight until
    /// [`landed`](Self::landed), and mattering until `until_us`.
    fn note(
        &self,
        resets: &Resets,
        key: &str,
        (origin, end): (Origin, u128),
        units: u64,
        (now_us, until_us): (u64, u64),
    ) -> Option<Noted> {
        let (index, hash) = self.place(key);
        let mut refunds = self.lock(index);
        refunds.retain(|r| r.landed == u64::MAX || r.until_us >= now_us);
        if refunds.len() >= REFUNDS_PER_SLOT {
            match refunds.iter().position(|r| r.landed != u64::MAX) {
                Some(oldest) => {
                    refunds.remove(oldest);
                }
                // As many on their way as are kept (a backend that is slow
                // to answer): this one is not kept, as one of another
                // instance's is not, so that a refund's look stays short.
                None => return None,
            }
        }
        // Counted under the slot's lock: the slot's refunds are in the order
        // sent.
        let sent = resets.count();
        let id = refunds.back().map_or(0, |r| r.id.wrapping_add(1));
        refunds.push_back(GivenBack {
            hash,
            id,
            done: origin.done,
            end,
            sent,
            landed: u64::MAX,
            units,
            until_us,
        });
        Some(Noted { slot: index, id })
    }

    /// Marks `noted` refunds as landed now (or possibly landed: a refund
    /// that failed may have reached the backend all the same).
    fn landed(&self, resets: &Resets, noted: &[Noted]) {
        for noted in noted {
            let landed = resets.count();
            let mut refunds = self.lock(noted.slot);
            if let Some(refund) = refunds.iter_mut().find(|r| r.id == noted.id) {
                refund.landed = landed;
            }
        }
    }
}

/// Where the debt a bucket's admission left ends, in the algorithm's units
/// since the epoch of the limiter's clock: its decision's instant's units
/// plus its debt (early by what drained during its round trip).
fn end_of(quota: &Quota, decision: &Decision) -> u128 {
    u128::from(decision.at) * u128::from(quota.rate().tokens())
        + u128::from(decision.debt.unwrap_or(0))
}

/// Marks its refunds landed in [`Refunded`] when dropped.
struct MarkLanded<'a> {
    refunded: &'a Refunded,
    resets: &'a Resets,
    noted: Vec<Noted>,
    /// The bucket refunds' keys, whose leases on their way are unsettled
    /// again (see `Leases::unsettle`).
    leases: &'a crate::lease::Leases,
    keys: Vec<(&'a Quota, &'a str)>,
}

impl Drop for MarkLanded<'_> {
    fn drop(&mut self) {
        self.refunded.landed(self.resets, &self.noted);
        for (quota, key) in &self.keys {
            self.leases.unsettle(quota, key);
        }
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
        self.give_back_each(taken, origin).await
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
        self.give_back_each(taken, admitted.origin).await
    }

    /// Gives back each of `taken`, an admission made at `origin`.
    async fn give_back_each<'a>(
        &self,
        taken: impl Iterator<Item = Taken<'a>>,
        origin: Origin,
    ) -> Result<(), Error> {
        let resets = origin.resets;
        let now = self.inner.cache_clock.now_micros();
        let mut remote: Vec<(&Quota, &str, Refund)> = Vec::new();
        // The bucket refunds noted in `Refunded`, landed once sent.
        let mut noted: Vec<Noted> = Vec::new();
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
                    let Some(refund) = Refund::of(&share, decision, cost, elapsed, 0) else {
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
                    // A bucket's tokens, moved up by what refunds of older
                    // admissions gave back since (see `Refunded`).
                    let refunded = &self.inner.refunded;
                    let bucket = !quota.algorithm().is_windowed()
                        && quota.algorithm() != crate::quota::Algorithm::SlidingLog;
                    // The earliest the debt can have ended, and the latest
                    // (with what drained while the reply was on its way).
                    let end = end_of(quota, decision);
                    let drained_on_the_way =
                        u128::from(origin.arrived_us.saturating_sub(decision.at))
                            * u128::from(quota.rate().tokens());
                    let moved = match bucket {
                        true => refunded.moved_up(key, origin, end),
                        false => 0,
                    };
                    let Some(refund) = Refund::of(quota, decision, cost, elapsed, moved) else {
                        continue;
                    };
                    if bucket {
                        let full_us = quota.depth() / quota.rate().tokens().max(1);
                        let times = (now, now.saturating_add(full_us));
                        let admission = (origin, end + drained_on_the_way);
                        noted.extend(refunded.note(
                            &self.inner.resets,
                            key,
                            admission,
                            refund.units,
                            times,
                        ));
                    }
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
        // Marked landed however the call ends (a refund that failed or was
        // dropped may have reached the backend).
        let _landed = MarkLanded {
            refunded: &self.inner.refunded,
            resets: &self.inner.resets,
            noted,
            leases: &self.inner.leases,
            keys: remote
                .iter()
                .map(|(quota, key, _)| (*quota, *key))
                .collect(),
        };
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
