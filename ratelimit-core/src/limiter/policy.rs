//! The policy step: the only place a check's answer is built and counted.
//! The round trip's answer becomes an admission or a denial here, a backend
//! fault becomes the failure policy's answer, and shadow mode turns a
//! denial into a would-be denial. Also the circuit breaker in front of every
//! backend call.
//!
//! Every answer given here is given without I/O, so each takes a unit of the
//! task's Tokio budget: a caller looping on a dead backend yields like one
//! looping on a socket, so timers, the batching task and reconnection keep
//! running on its thread.

use std::time::Duration;

use tracing::Instrument as _;

use super::request::{Admitted, Decisions, Origin, Request};
use super::round_trip::Answer;
use super::{answered_in_process, Limiter};
use crate::backend::memory::MemoryBackend;
use crate::backend::Deadline;
use crate::decision::{Decision, Via};
use crate::denial::{DenialCause, RateLimited};
use crate::error::{Error, ErrorKind};
use crate::metrics::Outcome;
use crate::quota::Quota;

/// What [`Limiter::check`] (and so `#[rate_limit]`) does when the backend
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
            // Each node's call is timed and counted by its breaker, once.
            return call.await;
        }
        match self.inner.breaker.guard(backend, None, call).await {
            Err(open @ Error::CircuitOpen { .. }) => {
                answered_in_process().await;
                Err(open)
            }
            result => result,
        }
    }

    /// The outcome of a check the memory backend decides: given at once,
    /// without building the future a remote backend's check needs (which
    /// holds the round trip's, and is large), and so with no await between
    /// the tokens it takes and its answer.
    pub(super) fn checked_in_memory<'a>(
        &self,
        memory: &MemoryBackend,
        requests: &[Request<'a>],
    ) -> Result<Admitted<'a>, RateLimited> {
        let origin = self.origin();
        match requests {
            // The check of one enforced request, the most common of all,
            // decided straight into its admission or denial.
            [one] if !one.shadow && one.cost <= one.quota.capacity() => {
                let decision = memory.decide(one.quota, one.key, one.cost);
                self.settle_one(one, decision)
                    .map(|decision| Admitted::new(Decisions::One(decision), requests, origin))
            }
            _ => match group_of(requests) {
                Some(shadow) => {
                    let decided = self.decided_in_memory(memory, requests, shadow);
                    self.outcome(requests, decided, shadow, origin)
                }
                None => {
                    if let Some(denied) = self.named_twice(requests, false) {
                        return Err(denied);
                    }
                    let (enforced, shadowed) = enforced_and_shadowed(requests);
                    let enforced_decisions = self.decided_in_memory(memory, &enforced, false)?;
                    let shadow_decided = self.decided_in_memory(memory, &shadowed, true);
                    self.merged(
                        requests,
                        &enforced,
                        enforced_decisions,
                        shadow_decided,
                        origin,
                    )
                }
            },
        }
    }

    /// Decides `requests` on a remote backend: the one place such a check's
    /// outcome is built and counted. Requests in shadow mode are decided
    /// after the enforced ones (see [`Request::shadow`]).
    pub(super) async fn check_requests<'a>(
        &self,
        requests: &[Request<'a>],
    ) -> Result<Admitted<'a>, RateLimited> {
        let origin = self.origin();
        if requests.is_empty() {
            return Ok(Admitted::new(Decisions::Many(Vec::new()), &[], origin));
        }
        let Some(shadow) = group_of(requests) else {
            // Boxed, as it holds two groups' futures: rare, and not carried
            // by every check.
            return Box::pin(self.check_enforced_then_shadowed(requests, origin)).await;
        };
        let deadline = Deadline::after(self.inner.timeout);
        let decided = self.decide_group(requests, shadow, &deadline).await;
        self.outcome(requests, decided, shadow, origin)
    }

    /// The outcome of a check whose requests are all enforced or all in
    /// shadow mode, from their group's decisions.
    fn outcome<'a>(
        &self,
        requests: &[Request<'a>],
        decided: Result<Decisions, RateLimited>,
        shadow: bool,
        origin: Origin,
    ) -> Result<Admitted<'a>, RateLimited> {
        let origin = self.arrived(origin);
        match decided {
            Ok(decisions) => Ok(Admitted::new(decisions, requests, origin)),
            Err(denied) if shadow => {
                Ok(Admitted::new(Decisions::Many(Vec::new()), &[], origin).with_would_deny(denied))
            }
            Err(denied) => Err(denied),
        }
    }

    /// A check mixing enforced requests and requests in shadow mode: the
    /// enforced ones decide first, all or nothing, then those in shadow mode.
    async fn check_enforced_then_shadowed<'a>(
        &self,
        requests: &[Request<'a>],
        origin: Origin,
    ) -> Result<Admitted<'a>, RateLimited> {
        if let Some(denied) = self.named_twice(requests, false) {
            answered_in_process().await;
            return Err(denied);
        }
        let (enforced, shadowed) = enforced_and_shadowed(requests);
        // Each group within a timeout of its own: the shadow requests,
        // which only observe, left what the enforced ones did not use, would
        // time out on a slow but healthy Redis and open its breaker.
        let enforced_decisions = self
            .decide_group(&enforced, false, &Deadline::after(self.inner.timeout))
            .await?;
        let shadow_decided = self
            .decide_group(&shadowed, true, &Deadline::after(self.inner.timeout))
            .await;
        self.merged(
            requests,
            &enforced,
            enforced_decisions,
            shadow_decided,
            origin,
        )
    }

    /// The outcome of a check mixing enforced requests (admitted, with
    /// `enforced_decisions`) and requests in shadow mode (`shadow_decided`):
    /// every decision in the order asked, or the enforced ones with the
    /// shadow requests' would-be denial.
    fn merged<'a>(
        &self,
        requests: &[Request<'a>],
        enforced: &[Request<'a>],
        enforced_decisions: Decisions,
        shadow_decided: Result<Decisions, RateLimited>,
        origin: Origin,
    ) -> Result<Admitted<'a>, RateLimited> {
        let origin = self.arrived(origin);
        match shadow_decided {
            Ok(shadow_decisions) => {
                // Back in the order asked.
                let (mut enforced_decisions, mut shadow_decisions) = (
                    enforced_decisions.as_slice().iter(),
                    shadow_decisions.as_slice().iter(),
                );
                let decisions = requests
                    .iter()
                    .filter_map(|r| {
                        if r.shadow {
                            shadow_decisions.next()
                        } else {
                            enforced_decisions.next()
                        }
                    })
                    .copied()
                    .collect();
                Ok(Admitted::new(Decisions::Many(decisions), requests, origin))
            }
            Err(denied) => {
                Ok(Admitted::new(enforced_decisions, enforced, origin).with_would_deny(denied))
            }
        }
    }

    /// Decides `requests` all or nothing, applying their failure policies
    /// when the backend cannot answer. A denial is counted (as a would-be
    /// denial when `shadow`), logged and returned.
    async fn decide_group(
        &self,
        requests: &[Request<'_>],
        shadow: bool,
        deadline: &Deadline,
    ) -> Result<Decisions, RateLimited> {
        if let Some(denied) = self.refused(requests, shadow) {
            answered_in_process().await;
            return Err(denied);
        }
        self.decide_remotely(requests, shadow, deadline).await
    }

    /// The memory backend's decisions on `requests`, counted, unless the
    /// check is refused as asked.
    fn decided_in_memory(
        &self,
        memory: &MemoryBackend,
        requests: &[Request<'_>],
        shadow: bool,
    ) -> Result<Decisions, RateLimited> {
        match self.refused(requests, shadow) {
            Some(denied) => Err(denied),
            None => self.settle(requests, Answer::in_memory(memory, requests), shadow),
        }
    }

    /// Asks the backend, and applies the failure policies when it cannot
    /// answer.
    async fn decide_remotely(
        &self,
        requests: &[Request<'_>],
        shadow: bool,
        deadline: &Deadline,
    ) -> Result<Decisions, RateLimited> {
        // The round trip's future is most of a check's (the deny cache's
        // wait, the breaker's timeout): boxed, it is not carried by every
        // future that holds a check, nor copied with it, and the memory
        // backend's checks, which never make it, stay small.
        let round_trip = Box::pin(self.round_trip(requests, deadline));
        // Only a subscriber that records debug spans pays for one: a denial
        // answered in process takes well under a microsecond.
        let answer = if tracing::enabled!(tracing::Level::DEBUG) {
            let first = &requests[0];
            let span = tracing::debug_span!(
                "ratelimit.check",
                rule = first.rule,
                key = first.key,
                cost = first.cost,
                limits = requests.len(),
                backend = self.inner.backend.name()
            );
            round_trip.instrument(span).await
        } else {
            round_trip.await
        };
        match answer {
            Ok(answer) => self.settle(requests, answer, shadow),
            Err(error) => self.fall_back(requests, error, shadow).await,
        }
    }

    /// The admission or denial of `requests` by the backend's `answer`,
    /// counted.
    fn settle(
        &self,
        requests: &[Request<'_>],
        answer: Answer,
        shadow: bool,
    ) -> Result<Decisions, RateLimited> {
        match answer {
            Answer::Admitted(decisions) => {
                for r in requests {
                    self.inner.stats.record(r.rule, Outcome::Allowed);
                }
                Ok(decisions)
            }
            Answer::Denied { index, decision } => {
                Err(self.denied_by_quota(&requests[index], &decision, shadow))
            }
        }
    }

    /// `decision` on the one enforced request of a check, counted: the
    /// decision when it admits, else the denial.
    fn settle_one(
        &self,
        request: &Request<'_>,
        decision: Decision,
    ) -> Result<Decision, RateLimited> {
        if decision.allowed {
            self.inner.stats.record(request.rule, Outcome::Allowed);
            return Ok(decision);
        }
        Err(self.denied_by_quota(request, &decision, false))
    }

    /// The denial of `request` by its quota's `decision`, counted (as a
    /// would-be denial when `shadow`) and logged.
    fn denied_by_quota(
        &self,
        request: &Request<'_>,
        decision: &Decision,
        shadow: bool,
    ) -> RateLimited {
        let denied = RateLimited::from_decision(request.key, decision);
        self.denied(request, denied, Outcome::Denied, shadow)
    }

    /// The denial of a check that can never be decided as asked: a cost
    /// above its quota's capacity (never admittable), or a key named twice
    /// (the caller's mistake, counted as an error). `None` for a valid check.
    fn refused(&self, requests: &[Request<'_>], shadow: bool) -> Option<RateLimited> {
        for r in requests {
            let capacity = r.quota.capacity();
            if r.cost > capacity {
                let denied = RateLimited::never_admittable(r.key, capacity, r.cost);
                return Some(self.denied(r, denied, Outcome::Denied, shadow));
            }
        }
        self.named_twice(requests, shadow)
    }

    /// The denial of a check naming a key twice: its requests would decide
    /// on one state, each as if the other were not there. An enforced
    /// request and one in shadow mode on one key are named twice too (the
    /// shadow request would take from the enforced one's state).
    fn named_twice(&self, requests: &[Request<'_>], shadow: bool) -> Option<RateLimited> {
        for (i, r) in requests.iter().enumerate() {
            if requests[..i].iter().any(|e| e.key == r.key) {
                let capacity = r.quota.capacity();
                // A caller's value may make keys meet (a client's header
                // spelling another limit's key): not a log line a request.
                if super::report::once_a_second(&self.inner.last_duplicate) {
                    tracing::error!(
                        key = r.key,
                        rule = r.rule,
                        "a check names the same key twice; denied: give each limit a key of its \
                         own (logged at most once a second)"
                    );
                }
                let denied = RateLimited::new(r.key, capacity, 0, Duration::MAX)
                    .with_cause(DenialCause::DuplicateKey);
                return Some(self.denied(r, denied, Outcome::Error, shadow));
            }
        }
        None
    }

    /// `denied` by `request`: named after its rule (when it has a name),
    /// counted under it as `outcome` (as a would-be denial when `shadow`),
    /// and logged.
    fn denied(
        &self,
        request: &Request<'_>,
        denied: RateLimited,
        outcome: Outcome,
        shadow: bool,
    ) -> RateLimited {
        let denied = denied.with_quota(request.quota);
        let denied = if request.rule.is_empty() {
            denied
        } else {
            denied.with_rule(request.rule)
        };
        let outcome = match outcome {
            Outcome::Error => Outcome::Error,
            outcome => outcome.shadowed(shadow),
        };
        self.inner.stats.record(request.rule, outcome);
        self.log_denial(&denied, shadow);
        denied
    }

    /// The failure policies' answer to a check the backend could not
    /// decide, each request under its own policy (the limiter's when it
    /// names none), all or nothing: a request failing closed denies the
    /// check; the requests with the local policy are decided together by
    /// the local limiter; those failing open admit.
    async fn fall_back(
        &self,
        requests: &[Request<'_>],
        error: Error,
        shadow: bool,
    ) -> Result<Decisions, RateLimited> {
        answered_in_process().await;
        let default = self.inner.failure_policy;
        let policy_of = |r: &Request<'_>| r.on_error.unwrap_or(default);
        let first = &requests[0];
        self.warn_throttled(first.key, &error, policy_of(first));
        if let Some(closed) = requests
            .iter()
            .find(|r| policy_of(r) == FailurePolicy::Closed)
        {
            let denied = self.unavailable(closed.key, closed.quota.capacity(), error.kind());
            return Err(self.denied(closed, denied, Outcome::FallbackDenied, shadow));
        }
        let local: Vec<usize> = (0..requests.len())
            .filter(|&i| policy_of(&requests[i]) == FailurePolicy::Local)
            .collect();
        let batch: Vec<(&Quota, &str, u64)> = local
            .iter()
            .map(|&i| (requests[i].quota, requests[i].key, requests[i].cost))
            .collect();
        let mut decided = match self.decide_locally(&batch) {
            Ok(decisions) => decisions.into_iter(),
            Err((index, refused)) => {
                let request = &requests[local[index]];
                return Err(self.denied(request, refused, Outcome::FallbackDenied, shadow));
            }
        };
        for r in requests {
            self.inner.stats.record(r.rule, Outcome::FallbackAllowed);
        }
        let mut decisions = requests.iter().map(|r| match policy_of(r) {
            FailurePolicy::Local => decided
                .next()
                .unwrap_or_else(|| Decision::fail_open(r.quota.capacity())),
            _ => Decision::fail_open(r.quota.capacity()),
        });
        Ok(match (requests.len(), decisions.next()) {
            (1, Some(decision)) => Decisions::One(decision),
            (_, first) => Decisions::Many(first.into_iter().chain(decisions).collect()),
        })
    }

    /// Decides `requests` all or nothing on the local limiter, each with the
    /// limiter's share of its quota; a denial says which request denied.
    // A denial is as large here as where `check` returns it.
    #[allow(clippy::result_large_err)]
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
        // The local limiter runs on the limiter's clock, and stamps each
        // decision with the instant it decided at: a refund measures what
        // has refilled since then (an instant read before it would count a
        // refill that never happened, and give back less than a token).
        let mut decisions = self.inner.local.decide_all(&local);
        decisions.iter_mut().for_each(|d| {
            d.fallback = true;
            d.via = Via::Local;
        });
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

    fn unavailable(&self, key: &str, capacity: u64, kind: ErrorKind) -> RateLimited {
        RateLimited::new(key, capacity, 0, self.inner.closed_retry_after)
            .with_cause(DenialCause::BackendUnavailable { kind })
    }
}

/// Whether `requests` are one group: `Some(false)` when every request is
/// enforced (and for none), `Some(true)` when every one is in shadow mode;
/// `None` when they mix the two, and so are decided as two groups.
#[inline]
fn group_of(requests: &[Request<'_>]) -> Option<bool> {
    match requests {
        [] => Some(false),
        [one] => Some(one.shadow),
        [first, rest @ ..] => rest
            .iter()
            .all(|r| r.shadow == first.shadow)
            .then_some(first.shadow),
    }
}

/// The enforced requests of a check and those in shadow mode, each in the
/// order asked.
fn enforced_and_shadowed<'a>(requests: &[Request<'a>]) -> (Vec<Request<'a>>, Vec<Request<'a>>) {
    requests.iter().partition(|r| !r.shadow)
}
