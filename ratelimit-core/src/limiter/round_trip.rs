//! One round trip: the backend's answer to a check, through the deny cache,
//! the token leases, the circuit breaker and the timeout. No failure policy
//! applies here: a fault is an `Err` for the policy step (`policy.rs`), and
//! nothing here counts or logs an outcome.
//!
//! A check of one request is the one-element case of a check of several;
//! it differs only where one key allows more: leases, and waiting for
//! another caller's answer on the same key (see `deny_cache`).

use super::request::{Decisions, Request};
use super::{answered_in_process, Limiter};
use crate::backend::memory::MemoryBackend;
use crate::backend::Deadline;
use crate::decision::{Decision, Via};
use crate::deny_cache::Consulted;
use crate::error::Error;
use crate::quota::{Algorithm, Quota};

/// What the backend (or what this process knows of it) answered.
pub(super) enum Answer {
    /// Every request admitted, and each took its cost.
    Admitted(Decisions),
    /// The request at `index` denied, with the longest wait among those that
    /// denied: the check cannot succeed before it. None took anything.
    Denied { index: usize, decision: Decision },
}

impl Answer {
    fn of_one(decision: Decision) -> Self {
        if decision.allowed {
            Answer::Admitted(Decisions::One(decision))
        } else {
            Answer::Denied { index: 0, decision }
        }
    }

    /// The memory backend's answer to `requests`, given at once: it cannot
    /// fail, and no cache or lease stands in front of it.
    pub(super) fn in_memory(memory: &MemoryBackend, requests: &[Request<'_>]) -> Self {
        match requests {
            [one] => Answer::of_one(memory.decide(one.quota, one.key, one.cost)),
            _ => {
                let batch: Vec<(&Quota, &str, u64)> =
                    requests.iter().map(|r| (r.quota, r.key, r.cost)).collect();
                Answer::of_all(memory.decide_all(&batch))
            }
        }
    }

    fn of_all(decisions: Vec<Decision>) -> Self {
        let denied = decisions
            .iter()
            .enumerate()
            .filter(|(_, d)| !d.allowed)
            .max_by_key(|(_, d)| d.retry_after)
            .map(|(index, decision)| (index, *decision));
        match denied {
            None => Answer::Admitted(Decisions::Many(decisions)),
            Some((index, decision)) => Answer::Denied { index, decision },
        }
    }
}

impl Limiter {
    /// The answer to `requests` (distinct keys, each cost within its
    /// capacity), all or nothing.
    pub(super) async fn round_trip(
        &self,
        requests: &[Request<'_>],
        deadline: &Deadline,
    ) -> Result<Answer, Error> {
        match requests {
            [one] if self.leases(one) => {
                self.decide_leased(one, deadline).await.map(Answer::of_one)
            }
            [one] => self
                .decide_one(one.quota, one.key, one.cost, true, deadline)
                .await
                .map(Answer::of_one),
            _ => self.decide_all(requests, deadline).await,
        }
    }

    /// Whether `request` is served from token leases: not a request of no
    /// cost, which takes nothing (nor leases anything), nor any when leases
    /// live for no time.
    fn leases(&self, request: &Request<'_>) -> bool {
        request.lease > request.cost
            && request.cost > 0
            && self.inner.lease_ttl.as_micros() > 0
            && self.inner.backend.can_fail()
            && !matches!(
                request.quota.algorithm(),
                Algorithm::LeakyBucket | Algorithm::SlidingLog
            )
    }

    /// One key on a remote backend: from the deny cache when it knows the
    /// answer, else from the backend, whose answer the cache learns. A
    /// denial from the cache counts as one when it is the `answer` to the
    /// request, rather than to its lease (asked for before the request's own
    /// cost).
    async fn decide_one(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        answer: bool,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        let backend = &self.inner.backend;
        self.inner.leases.forget_other_quota(quota, key);
        let clock = &*self.inner.cache_clock;
        let Some(cache) = &self.inner.deny_cache else {
            let asked = clock.now_micros();
            let result = self
                .guarded(backend.decide(quota, key, cost, deadline))
                .await;
            return result.map(|decision| decision.asked_at(asked));
        };
        let probe = match cache.consult(quota, key, cost, clock, deadline).await {
            Consulted::Denied(cached) => {
                if answer {
                    self.inner.stats.cache_hit();
                }
                answered_in_process().await;
                return Ok(cached);
            }
            Consulted::Failed(error) => return Err(error),
            // Waited on other callers' calls until the deadline: timed out
            // with no call of its own, which its breaker does not count (the
            // calls waited on count themselves); a probe it was handed goes
            // to the next caller.
            Consulted::Ask(_) if deadline.has_passed() => return Err(deadline.timed_out()),
            Consulted::Ask(probe) => probe,
        };
        // The backend decides between these two instants; the cache keeps
        // both (see `deny_cache`).
        let asked_at = clock.now_micros();
        let asked = cache.asked(key, asked_at);
        let result = self
            .guarded(backend.decide(quota, key, cost, deadline))
            .await;
        let now = clock.now_micros();
        cache.record(quota, key, cost, asked, now, &result, probe);
        result.map(|decision| decision.asked_at(asked_at))
    }

    /// Serves the request from a live lease, or leases up to its `lease`
    /// tokens from the backend (falling back to its cost alone when that
    /// many are not there).
    async fn decide_leased(
        &self,
        request: &Request<'_>,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        let Request {
            quota, key, cost, ..
        } = *request;
        // The budget first, as a lease answers with no I/O: a caller gone at
        // the yield leaves the lease's tokens where they are.
        answered_in_process().await;
        let now = self.inner.cache_clock.now_micros();
        let room = match self.inner.leases.take(quota, key, cost, now) {
            Ok((left, id)) => {
                return Ok(Decision {
                    via: Via::Lease(id),
                    ..Decision::from_micros(true, quota.capacity(), left, 0, 0, 0)
                })
            }
            Err(room) => room,
        };
        // With no room to keep a lease, the request's cost alone.
        let lease = if room {
            request.lease.min(quota.capacity()).max(cost)
        } else {
            cost
        };
        let asked = self.inner.leases.asked(key);
        let decision = self
            .decide_one(quota, key, lease, lease == cost, deadline)
            .await?;
        if decision.allowed {
            // Cut so the lease never serves a token the algorithm could not
            // have admitted when it was counted (see `lease`): `now` is read
            // before the call, so these end no later than they should.
            let ttl = u64::try_from(self.inner.lease_ttl.as_micros()).unwrap_or(u64::MAX);
            let mut expires = now.saturating_add(ttl);
            let reset = now.saturating_add(decision.reset_after.as_micros() as u64);
            let window = quota.window().map_or(0, |w| w.as_micros() as u64);
            let owed_until = match quota.algorithm() {
                Algorithm::FixedWindow => {
                    expires = expires.min(reset);
                    None
                }
                // Its reset is a window after the end of the current one.
                Algorithm::SlidingWindow => {
                    expires = expires.min(reset.saturating_sub(window));
                    None
                }
                _ => Some(reset),
            };
            // The lease is owed after what was asked for before its own
            // call (`decision.at`), not before its wait for another
            // caller's: a refund of an admission asked for in between must
            // cut it (see `Leases::refunded`).
            let asked_at = decision.at.max(now);
            let id = self.inner.leases.put(
                asked,
                quota,
                key,
                lease - cost,
                asked_at,
                expires,
                owed_until,
            );
            // The request's own tokens were leased with the rest: a refund
            // gives them to the lease.
            let via = id.map_or(Via::Backend, Via::Lease);
            return Ok(Decision { via, ..decision });
        }
        if lease == cost {
            return Ok(decision);
        }
        // The backend has just answered: the request's own cost is asked
        // for within a deadline of its own, so that a slow answer to the
        // lease does not leave the request, which it may deny, to the
        // failure policy.
        let own = Deadline::after(deadline.timeout());
        self.decide_one(quota, key, cost, true, &own).await
    }

    /// Several keys at one instant, all or nothing. A key whose denial the
    /// deny cache knows denies the check with no backend call: the check
    /// could not be admitted before that denial ends, whatever the others
    /// hold.
    async fn decide_all(
        &self,
        requests: &[Request<'_>],
        deadline: &Deadline,
    ) -> Result<Answer, Error> {
        let batch: Vec<(&Quota, &str, u64)> =
            requests.iter().map(|r| (r.quota, r.key, r.cost)).collect();
        let backend = &self.inner.backend;
        let cache = self.inner.deny_cache.as_ref();
        if let Some(cache) = cache {
            let now = self.inner.cache_clock.now_micros();
            let cached = requests
                .iter()
                .enumerate()
                .filter_map(|(i, r)| Some((i, cache.peek(r.quota, r.key, r.cost, now)?)))
                .max_by_key(|(_, decision)| decision.retry_after);
            if let Some((index, decision)) = cached {
                self.inner.stats.cache_hit();
                answered_in_process().await;
                return Ok(Answer::Denied { index, decision });
            }
        }
        for r in requests {
            self.inner.leases.forget_other_quota(r.quota, r.key);
        }
        let asked_at = self.inner.cache_clock.now_micros();
        let asked: Option<Vec<_>> = cache.map(|cache| {
            requests
                .iter()
                .map(|r| cache.asked(r.key, asked_at))
                .collect()
        });
        let mut decisions = self.guarded(backend.decide_all(&batch, deadline)).await?;
        for decision in &mut decisions {
            *decision = decision.asked_at(asked_at);
        }
        if let (Some(cache), Some(asked)) = (cache, asked) {
            // A check that admitted consumed on every key. In one that was
            // denied, a key denied is denied on its own too; one that
            // admitted consumed nothing, or got its tokens back (across Redis
            // Cluster slots, by a refund), which may let a cached denial
            // succeed sooner: it is forgotten after the denials are learned,
            // since a `forget` keeps answers asked for before it out.
            let now = self.inner.cache_clock.now_micros();
            let all_admitted = decisions.iter().all(|d| d.allowed);
            for ((r, decision), asked) in requests.iter().zip(&decisions).zip(asked) {
                if all_admitted || !decision.allowed {
                    cache.learn(r.quota, r.key, r.cost, asked, now, decision);
                }
            }
            if !all_admitted {
                for (r, decision) in requests.iter().zip(&decisions) {
                    if decision.allowed {
                        cache.forget(r.key);
                    }
                }
            }
        }
        Ok(Answer::of_all(decisions))
    }
}
