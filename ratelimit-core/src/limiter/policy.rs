//! The failure path: the circuit breaker in front of every backend call, and
//! the failure policy that answers when the backend cannot. This is the only
//! place a backend fault becomes an answer for a caller.
//!
//! Every answer given here is given without I/O, so each takes a unit of the
//! task's Tokio budget: a caller looping on a dead backend yields like one
//! looping on a socket, so timers, the batching task and reconnection keep
//! running on its thread.

use std::time::Instant;

use super::{answered_in_process, Dimension, Limiter};
use crate::decision::Decision;
use crate::error::{DenialCause, Error, RateLimited};
use crate::metrics::Outcome;
use crate::quota::Quota;

/// What [`Limiter::acquire`] (and so `#[rate_limit]`) does when the backend
/// fails, times out, is overloaded, or its circuit breaker is open. A backend
/// error is never reported as a denial by the quota: a denial under a failure
/// policy says so in its [`DenialCause`], and an admission says so in
/// [`Decision::fallback`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Allow the call: the service keeps running without limits while the
    /// backend is down. The default, as a limiter must not take its service
    /// down with it.
    #[default]
    Open,
    /// Deny the call with [`DenialCause::BackendUnavailable`] and the
    /// limiter's [`closed_retry_after`](super::LimiterBuilder::closed_retry_after):
    /// for limits protecting something that must never be flooded.
    Closed,
    /// Decide in process with a [share](super::LimiterBuilder::local_share) of
    /// each quota, on a bounded in-memory limiter: the limit holds roughly
    /// while the backend is down, with no network call. A request costing
    /// more than the share's capacity is denied
    /// ([`DenialCause::LocalFallback`], retry after `closed_retry_after`):
    /// the share can never admit it, though the backend may once it is back.
    Local,
}

impl Limiter {
    /// Runs one backend call through the circuit breaker: skipped while it
    /// is open, timed, and its outcome recorded. A backend with a breaker
    /// per node (Redis Cluster) guards each node's calls itself, so one dead
    /// master sends only its own keys to the failure policy.
    pub(super) async fn guarded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let backend = self.inner.backend.name();
        if self.inner.backend.guards_nodes() {
            let started = Instant::now();
            let result = call.await;
            crate::breaker::observed(backend, started, &result);
            return result;
        }
        match self.inner.breaker.guard(backend, None, call).await {
            Err(Error::CircuitOpen) => {
                answered_in_process().await;
                Err(Error::CircuitOpen)
            }
            result => result,
        }
    }

    /// The failure policy's answer to one request the backend could not
    /// decide.
    pub(super) async fn fall_back(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        error: Error,
        policy: FailurePolicy,
    ) -> (Result<Decision, RateLimited>, Outcome) {
        answered_in_process().await;
        self.warn_throttled(key, &error, policy);
        match policy {
            FailurePolicy::Open => (
                Ok(Decision::fail_open(quota.capacity())),
                Outcome::FallbackAllowed,
            ),
            FailurePolicy::Closed => (
                Err(self.unavailable(key, quota.capacity())),
                Outcome::FallbackDenied,
            ),
            FailurePolicy::Local => match self.decide_locally(&[(quota, key, cost)]) {
                Ok(mut decisions) => (Ok(decisions.remove(0)), Outcome::FallbackAllowed),
                Err((_, denied)) => (Err(denied), Outcome::FallbackDenied),
            },
        }
    }

    /// The failure policies' answer to an all-or-nothing check the backend
    /// could not decide, each dimension under its own policy (`default`
    /// when it names none), all or nothing: a dimension failing closed
    /// denies the check; the dimensions with the local policy are decided
    /// together by the local limiter; those failing open admit. Denials name
    /// the dimension that denied.
    pub(super) async fn fall_back_all(
        &self,
        dimensions: &[Dimension<'_>],
        error: Error,
        default: FailurePolicy,
        shadow: bool,
    ) -> Result<Vec<Decision>, RateLimited> {
        let denied = Outcome::FallbackDenied.shadowed(shadow);
        answered_in_process().await;
        let policy_of = |d: &Dimension<'_>| d.on_error.unwrap_or(default);
        let first = dimensions.first();
        self.warn_throttled(
            first.map_or("", |d| d.key),
            &error,
            first.map_or(default, policy_of),
        );
        let named = |denied: RateLimited, rule: &'static str| {
            if rule.is_empty() {
                denied
            } else {
                denied.with_rule(rule)
            }
        };
        if let Some(closed) = dimensions
            .iter()
            .find(|d| policy_of(d) == FailurePolicy::Closed)
        {
            self.inner.stats.record(closed.rule, denied);
            return Err(named(
                self.unavailable(closed.key, closed.quota.capacity()),
                closed.rule,
            ));
        }
        let local: Vec<(usize, (&Quota, &str, u64))> = dimensions
            .iter()
            .enumerate()
            .filter(|(_, d)| policy_of(d) == FailurePolicy::Local)
            .map(|(i, d)| (i, (d.quota, d.key, d.cost)))
            .collect();
        let requests: Vec<(&Quota, &str, u64)> = local.iter().map(|(_, r)| *r).collect();
        let mut decided = match self.decide_locally(&requests) {
            Ok(decisions) => decisions.into_iter(),
            Err((index, refused)) => {
                let rule = dimensions[local[index].0].rule;
                self.inner.stats.record(rule, denied);
                return Err(named(refused, rule));
            }
        };
        self.inner
            .stats
            .record(first.map_or("", |d| d.rule), Outcome::FallbackAllowed);
        Ok(dimensions
            .iter()
            .map(|d| match policy_of(d) {
                FailurePolicy::Local => decided
                    .next()
                    .unwrap_or_else(|| Decision::fail_open(d.quota.capacity())),
                _ => Decision::fail_open(d.quota.capacity()),
            })
            .collect())
    }

    /// Decides `requests` all or nothing on the local limiter, each with the
    /// limiter's share of its quota; a denial says which request denied.
    fn decide_locally(
        &self,
        requests: &[(&Quota, &str, u64)],
    ) -> Result<Vec<Decision>, (usize, RateLimited)> {
        let scaled: Vec<Quota> = requests
            .iter()
            .map(|(quota, _, _)| quota.scaled(self.inner.local_share))
            .collect();
        // A cost the share cannot hold would never be admitted by it, and the
        // algorithms assume it fits; the backend may admit it once it is back.
        if let Some(i) = requests
            .iter()
            .zip(&scaled)
            .position(|((_, _, cost), share)| *cost > share.capacity())
        {
            let denied = RateLimited::new(
                requests[i].1,
                scaled[i].capacity(),
                0,
                self.inner.closed_retry_after,
            )
            .with_cause(DenialCause::LocalFallback);
            return Err((i, denied));
        }
        let local: Vec<(&Quota, &str, u64)> = requests
            .iter()
            .zip(&scaled)
            .map(|((_, key, cost), share)| (share, *key, *cost))
            .collect();
        let mut decisions = self.inner.local.decide_all(&local);
        decisions.iter_mut().for_each(|d| d.fallback = true);
        let denied = requests
            .iter()
            .enumerate()
            .zip(&decisions)
            .filter(|(_, d)| !d.allowed)
            .max_by_key(|(_, d)| d.retry_after);
        match denied {
            None => Ok(decisions),
            Some(((i, (_, key, _)), decision)) => Err((
                i,
                RateLimited::new(
                    *key,
                    decision.limit,
                    decision.remaining,
                    decision.retry_after,
                )
                .with_cause(DenialCause::LocalFallback),
            )),
        }
    }

    fn unavailable(&self, key: &str, capacity: u64) -> RateLimited {
        RateLimited::new(key, capacity, 0, self.inner.closed_retry_after)
            .with_cause(DenialCause::BackendUnavailable)
    }
}
