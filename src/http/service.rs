//! The service a [`RateLimitLayer`](super::RateLimitLayer) wraps around
//! another: each request's limits decided in one check, and the response
//! given its rate limit fields or replaced by the denial's.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::header::RETRY_AFTER;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use tower::Service;

use super::denial::Denial;
use super::exempt::Exemption;
use super::fields;
use super::key::{peer_ip, NoPeerAddress, Pushed};
use super::limit::{Limit, MissingKey};
use super::problem::{self, TooManyRequests};
use crate::{
    Admitted, Algorithm, DenialCause, KeyBuilder, Limiter, Quota, RateLimited,
    Request as LimitRequest,
};

/// What every request of one layer needs, computed once.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) limiter: Limiter,
    pub(super) limits: Vec<Prepared>,
    /// Each exemption with its `rule` label, `<layer>.<exemption>`.
    pub(super) exemptions: Vec<(Exemption, &'static str)>,
    pub(super) on_denied: Option<Hook<DenialHook>>,
    pub(super) refund_on: Option<Hook<RefundOn>>,
    pub(super) legacy_headers: bool,
    pub(super) shadow: bool,
    pub(super) request_id_header: HeaderName,
    /// The layer's name, and its log of requests with no peer address.
    pub(super) name: &'static str,
    pub(super) no_peer_address: NoPeerAddress,
}

/// A layer's denial-response hook.
pub(super) type DenialHook = dyn Fn(&Denial<'_>) -> Response + Send + Sync;

/// Which response statuses a layer gives its admission back for.
pub(super) type RefundOn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// A closure of the layer's configuration, shown as `(..)`.
pub(super) struct Hook<F: ?Sized>(pub(super) Arc<F>);

impl<F: ?Sized> Clone for Hook<F> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<F: ?Sized> fmt::Debug for Hook<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(..)")
    }
}

/// A limit with its name and prefix worked out.
#[derive(Debug)]
pub(super) struct Prepared {
    pub(super) limit: Limit,
    /// The policy name, metrics label and denials' rule.
    pub(super) name: &'static str,
    pub(super) prefix: String,
    /// See [`QuotaSource::home_algorithm`].
    pub(super) home: Algorithm,
    /// The policy field of a fixed quota, the same for every request.
    pub(super) fixed: Option<HeaderValue>,
}

/// The `RateLimit-Policy` member of the limit `name` under `quota`.
pub(super) fn policy_field(name: &str, quota: &Quota) -> HeaderValue {
    let policy = quota.policy();
    fields::policy_value(name, policy.quota_units(), Some(policy.window_secs()))
}

/// One limit's part of a request: its key and quota now.
pub(super) struct Asked<'a> {
    limit: &'a Prepared,
    quota: Quota,
    key: String,
}

impl Asked<'_> {
    /// The limit's `RateLimit-Policy` member.
    fn policy_field(&self) -> HeaderValue {
        match &self.limit.fixed {
            Some(fixed) => fixed.clone(),
            None => policy_field(self.limit.name, &self.quota),
        }
    }
}

/// What a request's limits decided.
pub(super) enum Verdict<'a> {
    /// Every limit admitted; one decision per limit asked.
    Admitted(Admitted<'a>),
    /// The limit at this index denied; the others took nothing.
    Denied(usize, RateLimited),
}

impl Shared {
    /// The `rule` label of the first exemption that covers the request.
    fn exempted(&self, parts: &Parts) -> Option<&'static str> {
        if self.exemptions.iter().any(|(e, _)| e.needs_peer()) && peer_ip(parts).is_none() {
            self.no_peer_address.report(self.name);
        }
        self.exemptions
            .iter()
            .find(|(exemption, _)| exemption.covers(parts))
            .map(|(_, rule)| *rule)
    }

    /// The limits that apply to the request, with their keys and quotas;
    /// a limit whose key is missing and [`MissingKey::Unlimited`] is left out.
    /// `Err` with the limit's name when an address limit finds no peer
    /// address: the server's mistake, never mended by a shared bucket,
    /// which would make a limit per client one limit for all of them.
    async fn asked(&self, parts: &Parts) -> Result<Vec<Asked<'_>>, &'static str> {
        let mut asked = Vec::with_capacity(self.limits.len());
        for limit in &self.limits {
            let spec = &limit.limit;
            let mut key = KeyBuilder::new();
            key.push_literal(&limit.prefix);
            match spec
                .source
                .push_value(parts, spec.ipv6_prefix_len, &mut key)
                .await
            {
                Pushed::Value => {}
                Pushed::Missing => match spec.missing_key {
                    MissingKey::SharedBucket => key.push_literal("%unknown"),
                    MissingKey::Unlimited => continue,
                },
                Pushed::NoPeerAddress => {
                    self.no_peer_address.report(self.name);
                    return Err(limit.name);
                }
            }
            let quota = spec.quota.resolve(&self.limiter, parts);
            let mut key = key.finish();
            ratelimit_core::key::__keep_apart(&mut key, limit.home, &quota);
            asked.push(Asked { limit, quota, key });
        }
        Ok(asked)
    }

    async fn decide<'a>(&self, asked: &'a [Asked<'_>]) -> Verdict<'a> {
        let requests: Vec<LimitRequest<'_>> = asked
            .iter()
            .map(|a| {
                let request = LimitRequest::new(&a.quota, &a.key)
                    .rule(a.limit.name)
                    .shadow(self.shadow);
                match a.limit.limit.on_error {
                    Some(policy) => request.on_error(policy),
                    None => request,
                }
            })
            .collect();
        let at = |denied: &RateLimited| asked.iter().position(|a| a.key == denied.key).unwrap_or(0);
        match self.limiter.check(&requests[..]).await {
            Ok(admitted) => match admitted.would_deny() {
                // Shadow mode's would-be denial.
                Some(denied) => Verdict::Denied(at(denied), denied.clone()),
                None => Verdict::Admitted(admitted),
            },
            Err(denied) => Verdict::Denied(at(&denied), denied),
        }
    }

    /// Gives the admission back when the layer refunds responses of
    /// `status`. A refund that fails is logged; the response stands.
    async fn settle(&self, admitted: Admitted<'_>, status: StatusCode) {
        let Some(Hook(refund_on)) = &self.refund_on else {
            return;
        };
        if !refund_on(status) {
            return;
        }
        if let Err(error) = self.limiter.refund(admitted).await {
            self.limiter.__refund_lost("a request's tokens", &error);
        }
    }

    /// Adds the fields of admitted limits to a response of the service.
    fn admitted(
        &self,
        response: &mut Response,
        asked: &[Asked<'_>],
        decisions: &[crate::Decision],
    ) {
        let inner_denial = problem::denial_numbers(response);
        let headers = response.headers_mut();
        if let (true, Some((limit, remaining, retry_after))) = (self.legacy_headers, inner_denial) {
            // A handler under this layer was denied (by `#[rate_limit]`):
            // the legacy fields report that denial, the tightest limit.
            fields::set_legacy(headers, limit, Some(remaining), retry_after);
        }
        for (asked, decision) in asked.iter().zip(decisions) {
            let name = asked.limit.name;
            headers.append(fields::ratelimit_policy(), asked.policy_field());
            if decision.fallback {
                // The backend failed and the failure policy admitted the
                // request: the remaining quota is unknown, and `r=0` would
                // be false.
                if self.legacy_headers {
                    fields::set_legacy(headers, decision.limit, None, None);
                }
                continue;
            }
            let reset = fields::ceil_secs(decision.reset_after);
            headers.append(
                fields::ratelimit(),
                fields::ratelimit_value(name, decision.remaining, Some(reset)),
            );
            if self.legacy_headers {
                fields::set_legacy(
                    headers,
                    decision.limit,
                    Some(decision.remaining),
                    Some(reset),
                );
            }
        }
    }

    /// The fields of a denial by the limit at `at` on a response that is
    /// not its problem response (shadow mode's pass-through): every policy,
    /// and the denying limit's `RateLimit` when its quota denied (a failure
    /// policy's numbers are not the advertised policy's). The other limits
    /// took nothing and were not read, so they have no `RateLimit`.
    fn denial_fields(
        &self,
        headers: &mut HeaderMap,
        asked: &[Asked<'_>],
        at: usize,
        denied: &RateLimited,
    ) {
        for (i, a) in asked.iter().enumerate() {
            headers.append(fields::ratelimit_policy(), a.policy_field());
            if i != at || denied.cause != DenialCause::Quota {
                continue;
            }
            let retry = denied
                .is_retryable()
                .then(|| fields::ceil_secs(denied.retry_after));
            headers.append(
                fields::ratelimit(),
                fields::ratelimit_value(a.limit.name, denied.remaining, retry),
            );
            if self.legacy_headers {
                fields::set_legacy(headers, denied.limit, Some(denied.remaining), retry);
            }
        }
    }

    /// The response to a denial by the limit at `at`: the hook's, with
    /// every limit's fields, or the problem response.
    fn denied(
        &self,
        asked: &[Asked<'_>],
        at: usize,
        denied: RateLimited,
        request: &Parts,
    ) -> Response {
        let denying = &asked[at];
        if let Some(Hook(hook)) = &self.on_denied {
            let denial = Denial {
                limit: denying.limit.name,
                denied: &denied,
                policy: denying.quota.policy(),
                request,
            };
            let retry_after = denial.retry_after_secs();
            let mut response = hook(&denial);
            let headers = response.headers_mut();
            // The layer's fields, once each: a hook that sends the default
            // problem (`denial.problem()`) has some of them already.
            headers.remove(fields::ratelimit_policy());
            headers.remove(fields::ratelimit());
            self.denial_fields(headers, asked, at, &denied);
            if let (Some(secs), false) = (retry_after, headers.contains_key(RETRY_AFTER)) {
                headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            }
            return response;
        }
        let (limit, remaining, cause) = (denied.limit, denied.remaining, denied.cause);
        let problem = TooManyRequests::new(denied).policy_name(denying.limit.name);
        let reset = problem.retry_after_secs();
        let mut response = problem.into_response();
        let headers = response.headers_mut();
        for (i, a) in asked.iter().enumerate() {
            if i != at {
                headers.append(fields::ratelimit_policy(), a.policy_field());
            }
        }
        // Only a denial by the quota itself knows what is left (see
        // `TooManyRequests`).
        if self.legacy_headers && cause == DenialCause::Quota {
            fields::set_legacy(response.headers_mut(), limit, Some(remaining), reset);
        }
        response
    }
}

/// A request admitted for later, waiting for its turn: dropped before it
/// (the client left), it gives the turn back, as a `#[rate_limit]` call
/// does (see `give_back_later`).
struct Waiting<'a> {
    limiter: &'a Limiter,
    admitted: Option<Admitted<'a>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(admitted) = self.admitted.take() {
            crate::__private::give_back_later(vec![(
                self.limiter.clone(),
                admitted.__into_owned(),
            )]);
        }
    }
}

/// The service of [`RateLimitLayer`](super::RateLimitLayer).
#[derive(Clone)]
pub struct RateLimitService<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("layer", &self.shared)
            .finish()
    }
}

impl<S, B> Service<Request<B>> for RateLimitService<S>
where
    S: Service<Request<B>, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response, S::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service polled ready is the one to call; leave a fresh clone
        // in its place (tower's documented pattern for cloned services).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            if let Some(rule) = shared.exempted(&parts) {
                shared.limiter.__exempt(rule);
                return inner.call(Request::from_parts(parts, body)).await;
            }
            let request_id = problem::request_id(&parts.headers, &shared.request_id_header);
            let asked = match shared.asked(&parts).await {
                Ok(asked) => asked,
                // In shadow mode nothing is refused: the error is logged.
                Err(_) if shared.shadow => {
                    return inner.call(Request::from_parts(parts, body)).await;
                }
                Err(limit) => {
                    let mut response = problem::misconfigured(limit);
                    if let Some(id) = request_id {
                        problem::attach_request_id(&mut response, &id);
                    }
                    return Ok(response);
                }
            };
            if asked.is_empty() {
                return inner.call(Request::from_parts(parts, body)).await;
            }
            let mut response = match shared.decide(&asked).await {
                Verdict::Admitted(admitted) => {
                    // A leaky bucket admits a request for later: wait for its
                    // turn, which goes back if the request goes first (the
                    // client left).
                    let delay = admitted.delay();
                    let admitted = if delay.is_zero() {
                        admitted
                    } else {
                        let mut waiting = Waiting {
                            limiter: &shared.limiter,
                            admitted: Some(admitted),
                        };
                        tokio::time::sleep(delay).await;
                        match waiting.admitted.take() {
                            Some(admitted) => admitted,
                            None => return inner.call(Request::from_parts(parts, body)).await,
                        }
                    };
                    let mut response = match inner.call(Request::from_parts(parts, body)).await {
                        Ok(response) => response,
                        // No response: the server, or a layer outside this
                        // one, answers the error, as a server error unless
                        // told otherwise; the refund takes it for one.
                        Err(error) => {
                            shared
                                .settle(admitted, StatusCode::INTERNAL_SERVER_ERROR)
                                .await;
                            return Err(error);
                        }
                    };
                    shared.admitted(&mut response, &asked, admitted.decisions());
                    shared.settle(admitted, response.status()).await;
                    response
                }
                Verdict::Denied(at, denied) if shared.shadow => {
                    let mut response = inner.call(Request::from_parts(parts, body)).await?;
                    shared.denial_fields(response.headers_mut(), &asked, at, &denied);
                    response
                }
                Verdict::Denied(at, denied) => shared.denied(&asked, at, denied, &parts),
            };
            if let Some(id) = request_id {
                problem::attach_request_id(&mut response, &id);
            }
            Ok(response)
        })
    }
}
