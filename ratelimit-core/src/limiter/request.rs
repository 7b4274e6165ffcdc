//! What a caller asks the limiter for ([`Request`]) and what an admitted
//! check answers ([`Admitted`]).

use std::time::Duration;

use super::FailurePolicy;
use crate::decision::Decision;
use crate::denial::RateLimited;
use crate::quota::Quota;

/// One limit to decide: `cost` tokens (1 unless [`cost`](Self::cost) says
/// otherwise) of `quota` from `key`, with the rule's name, its failure
/// policy, a token lease and shadow mode. [`Limiter::check`](super::Limiter::check)
/// decides one request or several together.
///
/// ```
/// use ratelimit_core::{FailurePolicy, Limiter, Quota, Request};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let limiter = Limiter::memory();
/// let uploads = Quota::per_minute(10)?;
/// let request = Request::new(&uploads, "user:7")
///     .cost(4)
///     .rule("uploads")
///     .on_error(FailurePolicy::Closed);
/// let admitted = limiter.check(request).await?;
/// assert_eq!(admitted.decision().map(|d| d.remaining), Some(6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use = "a request does nothing until it is checked"]
pub struct Request<'a> {
    pub(crate) quota: &'a Quota,
    pub(crate) key: &'a str,
    pub(crate) cost: u64,
    pub(crate) rule: &'static str,
    pub(crate) on_error: Option<FailurePolicy>,
    pub(crate) lease: u64,
    pub(crate) shadow: bool,
}

impl<'a> Request<'a> {
    /// One token of `quota` from `key` (without the limiter's prefix), under
    /// the limiter's failure policy.
    pub const fn new(quota: &'a Quota, key: &'a str) -> Self {
        Self {
            quota,
            key,
            cost: 1,
            rule: "",
            on_error: None,
            lease: 0,
            shadow: false,
        }
    }

    /// Takes `cost` tokens instead of one. A cost of zero reads the key's
    /// state and consumes nothing; a cost above the quota's capacity is
    /// denied as never admittable
    /// ([`DenialCause::CostExceedsCapacity`](crate::DenialCause::CostExceedsCapacity)).
    pub const fn cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// Names the rule: the `rule` label of the metrics, and
    /// [`RateLimited::rule`] of a denial. It names the request's quota; it
    /// does not choose it: a quota kept in [`Limiter::rules`](crate::Limiter::rules)
    /// is the request's when it is given, as
    /// `limiter.rules().get("search").unwrap_or(default)`.
    pub const fn rule(mut self, rule: &'static str) -> Self {
        self.rule = rule;
        self
    }

    /// Uses `policy` instead of the limiter's when the backend fails.
    pub const fn on_error(mut self, policy: FailurePolicy) -> Self {
        self.on_error = Some(policy);
        self
    }

    /// Token leases: takes up to `tokens` tokens in one backend call and
    /// serves them in process until they run out or the lease expires
    /// ([`LimiterBuilder::lease_ttl`](super::LimiterBuilder::lease_ttl)).
    /// The global bound holds exactly; unused leased tokens are lost at
    /// expiry, which can under-admit. One exception: a bucket's lease holds
    /// at most what the bucket still owes for it, as of when it was taken,
    /// and a [refund](super::Limiter::refund) made elsewhere (by another
    /// instance) while it lives makes the bucket owe less; the lease's
    /// holder can then admit up to the tokens left in it beyond the bound,
    /// until the lease ends. A refund by this limiter makes its own lease
    /// of the key owed less too, or drops it when the refunded admission was
    /// made under another quota.
    /// A request of no cost takes no lease. A lease serves a check of this one
    /// request, on a remote backend, for the algorithms other than the leaky
    /// bucket (whose admissions carry each call's own delay) and the sliding
    /// log (which keeps each admission's instant); otherwise each call asks
    /// the backend. A limiter keeps leases of at most 100,000 keys at once:
    /// a key that finds them full (a flood of distinct keys) is decided as
    /// with no lease, each call asking the backend for its own cost.
    pub const fn lease(mut self, tokens: u64) -> Self {
        self.lease = tokens;
        self
    }

    /// Shadow mode, for rolling a new limit out: the request is decided and
    /// recorded as usual, but never denies. A would-be denial is counted as
    /// `shadow_denied` (not `denied`) and reported in
    /// [`Admitted::would_deny`]; like a denial, it consumes nothing of the
    /// requests in shadow mode. In a check with requests that are enforced,
    /// those are decided first, all or nothing, and the requests in shadow
    /// mode are decided after them only if they admit.
    pub const fn shadow(mut self, on: bool) -> Self {
        self.shadow = on;
        self
    }
}

/// A request is a check of one limit.
impl<'a> AsRef<[Request<'a>]> for Request<'a> {
    fn as_ref(&self) -> &[Request<'a>] {
        std::slice::from_ref(self)
    }
}

/// What an admitted [`check`](super::Limiter::check) took: the decision of
/// each request, in the order asked, and shadow mode's would-be denial. It is
/// also the admission's receipt: [`Limiter::refund`](super::Limiter::refund)
/// takes it to give back what the check took, once.
///
/// It borrows the keys and quotas of the requests it admitted.
#[derive(Debug)]
pub struct Admitted<'a> {
    decisions: Decisions,
    /// The requests that took their cost, in the order of `decisions`.
    taken: Taken<'a>,
    /// Boxed: only shadow mode has one, and every check returns the rest.
    would_deny: Option<Box<RateLimited>>,
    /// The limiter that made it, and its resets as of the check.
    origin: Origin,
}

/// Which limiter made an admission, and how many resets it had begun when
/// the admission's check began: what its refund is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    /// The limiter's number, unique in the process and shared by its
    /// clones: no other limiter takes the refund (an address would be
    /// taken again by a limiter made after this one is dropped).
    pub(crate) limiter: u64,
    /// The limiter's count of resets and refunds begun (see `Resets`)
    /// when the check began.
    pub(crate) resets: u64,
    /// The same count when the check's decisions arrived: a refund that
    /// landed later than that was not in them.
    pub(crate) done: u64,
    /// When they arrived, on the limiter's clock (0 when decided in
    /// process, at the instant of their decision).
    pub(crate) arrived_us: u64,
}

/// One decision inline: most checks are of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decisions {
    One(Decision),
    Many(Vec<Decision>),
}

impl Decisions {
    pub(crate) fn as_slice(&self) -> &[Decision] {
        match self {
            Decisions::One(decision) => std::slice::from_ref(decision),
            Decisions::Many(decisions) => decisions,
        }
    }
}

/// The requests of an admission, inline for one.
#[derive(Debug)]
enum Taken<'a> {
    One(Request<'a>),
    Many(Vec<Request<'a>>),
}

impl<'a> Admitted<'a> {
    /// `decisions` of `requests`, one each, in order, by the limiter `origin`.
    pub(crate) fn new(decisions: Decisions, requests: &[Request<'a>], origin: Origin) -> Self {
        let taken = match requests {
            [one] => Taken::One(*one),
            many => Taken::Many(many.to_vec()),
        };
        Self {
            decisions,
            taken,
            would_deny: None,
            origin,
        }
    }

    pub(crate) fn with_would_deny(mut self, denied: RateLimited) -> Self {
        self.would_deny = Some(Box::new(denied));
        self
    }

    /// This admission with its keys and quotas owned, for a receipt kept
    /// while what borrowed them is gone (`#[rate_limit(refund_on = ...)]`).
    #[doc(hidden)]
    pub fn __into_owned(self) -> OwnedAdmitted {
        let taken = self
            .taken()
            .map(|(request, decision)| OwnedTaken {
                quota: *request.quota,
                key: request.key.into(),
                cost: request.cost,
                rule: request.rule,
                decision: *decision,
            })
            .collect();
        OwnedAdmitted {
            taken,
            origin: self.origin,
        }
    }

    /// The limiter that made it.
    pub(crate) fn origin(&self) -> Origin {
        self.origin
    }

    /// Each request that took its cost, with its decision.
    pub(crate) fn taken(&self) -> impl Iterator<Item = (&Request<'a>, &Decision)> {
        let requests = match &self.taken {
            Taken::One(one) => std::slice::from_ref(one),
            Taken::Many(many) => many,
        };
        requests.iter().zip(self.decisions())
    }

    /// The first decision of [`decisions`](Self::decisions): the request's,
    /// for a check of one. `None` when the check asked nothing, or when its
    /// requests are all in shadow mode and would deny.
    pub fn decision(&self) -> Option<&Decision> {
        self.decisions().first()
    }

    /// The decision of each request that took its cost, in the order asked:
    /// every request's, unless requests in shadow mode would deny
    /// ([`would_deny`](Self::would_deny)); those consumed nothing and are
    /// left out.
    pub fn decisions(&self) -> &[Decision] {
        self.decisions.as_slice()
    }

    /// Shadow mode's would-be denial: the denial the requests in shadow
    /// mode would have been given (which key, which rule, when to retry).
    /// The call goes ahead.
    pub fn would_deny(&self) -> Option<&RateLimited> {
        self.would_deny.as_deref()
    }

    /// How long the call must wait for its turn before it runs: the longest
    /// [`Decision::delay`] (the leaky bucket's), zero for every other
    /// algorithm. `#[rate_limit]` sleeps for it before running the body.
    pub fn delay(&self) -> Duration {
        self.decisions()
            .iter()
            .map(|d| d.delay)
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

/// An [`Admitted`] that owns its keys and quotas: what the attribute keeps
/// for `refund_on` while the body runs. Refunded with
/// [`Limiter::__refund_owned`](super::Limiter::__refund_owned).
#[doc(hidden)]
#[derive(Debug)]
pub struct OwnedAdmitted {
    pub(crate) taken: Vec<OwnedTaken>,
    pub(crate) origin: Origin,
}

#[derive(Debug)]
pub(crate) struct OwnedTaken {
    pub(crate) quota: Quota,
    pub(crate) key: Box<str>,
    pub(crate) cost: u64,
    pub(crate) rule: &'static str,
    pub(crate) decision: Decision,
}
