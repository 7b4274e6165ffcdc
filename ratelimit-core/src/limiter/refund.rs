//! Refunds: an admission's cost given back where it was taken (see
//! [`Limiter::refund`]).

use super::request::{Admitted, OwnedAdmitted};
use super::{answered_in_process, Limiter};
use crate::algorithm::Refund;
use crate::backend::Deadline;
use crate::decision::Decision;
use crate::decision::Via;
use crate::error::Error;
use crate::quota::Quota;

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
        if admitted.origin() != self.origin() {
            return Err(Error::OtherLimiter);
        }
        let taken = admitted.taken().map(|(request, decision)| Taken {
            quota: request.quota,
            key: request.key,
            cost: request.cost,
            rule: request.rule,
            decision,
        });
        self.give_back_each(taken).await
    }

    /// [`refund`](Self::refund) of an admission whose keys and quotas it
    /// owns (`#[rate_limit(refund_on = ...)]` keeps one while the body runs).
    #[doc(hidden)]
    pub async fn __refund_owned(&self, admitted: OwnedAdmitted) -> Result<(), Error> {
        if admitted.origin != self.origin() {
            return Err(Error::OtherLimiter);
        }
        let taken = admitted.taken.iter().map(|t| Taken {
            quota: &t.quota,
            key: &t.key,
            cost: t.cost,
            rule: t.rule,
            decision: &t.decision,
        });
        self.give_back_each(taken).await
    }

    async fn give_back_each<'a>(
        &self,
        taken: impl Iterator<Item = Taken<'a>>,
    ) -> Result<(), Error> {
        let now = self.inner.cache_clock.now_micros();
        let mut remote: Vec<(&Quota, &str, Refund)> = Vec::new();
        for Taken {
            quota,
            key,
            cost,
            rule,
            decision,
        } in taken
        {
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
        let result = if backend.can_fail() {
            self.guarded(backend.refund(&remote, &deadline)).await
        } else {
            let result = backend.refund(&remote, &deadline).await;
            answered_in_process().await;
            result
        };
        // A cached denial of these keys may end sooner now. Forgotten after
        // the refund, so an answer asked for before it is not kept either.
        if let Some(cache) = &self.inner.deny_cache {
            for (_, key, _) in &remote {
                cache.forget(key);
            }
        }
        result
    }
}
