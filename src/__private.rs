//! Support for the code `#[rate_limit]` generates. Every item here is named by
//! absolute path from generated code only.

use std::fmt::Display;
use std::future::Future;

pub use ratelimit_core::{Algorithm, FailurePolicy, KeyBuilder, Limiter, Quota, RateLimited};

use std::time::Duration;

use ratelimit_core::{Admitted, DenialCause, OwnedAdmitted, Request};

/// One `#[rate_limit]` attribute, built in a `static` at compile time: how
/// its calls are named and decided. Its quota is a `static` of its own
/// ([`quota`]), or the value of `quota = <expression>` at each call.
#[derive(Debug)]
pub struct Rule {
    /// Reported in denials and metrics: the rule's name for `rule = "..."`,
    /// else the module path and the function's name (the attribute cannot
    /// see an impl's type, so methods of one name in one module share it).
    pub name: &'static str,
    /// `rule = "..."`: the name looked up in the limiter's rules at each call.
    pub named: Option<&'static str>,
    /// `on_error = ...`: the failure policy, overriding the limiter's.
    pub on_error: Option<FailurePolicy>,
    /// `mode = shadow`.
    pub shadow: bool,
    /// `lease = N`.
    pub lease: u64,
    /// `on_limit = wait(max = ...)`: how long a denied call may wait for its
    /// turn before it gives up.
    pub wait: Option<Duration>,
    /// The algorithm of the attribute's own quota (the token bucket for
    /// `quota = <expression>`): keys of a quota of another algorithm are
    /// kept apart (see [`Call::new`]).
    pub algorithm: Algorithm,
    /// Among stacked attributes, the place (from 1) of one whose key
    /// template an earlier one has too; 0 for any other.
    pub apart: u32,
}

impl Rule {
    /// The rule of the function `name` (its path).
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            named: None,
            on_error: None,
            shadow: false,
            lease: 0,
            wait: None,
            algorithm: Algorithm::TokenBucket,
            apart: 0,
        }
    }

    /// A stacked attribute at `position` (from 1) whose key template an
    /// earlier attribute has too: it decides on `key~<position>`.
    pub const fn apart(mut self, position: u32) -> Self {
        self.apart = position;
        self
    }

    /// The algorithm of the attribute's own quota.
    pub const fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// `rule = "..."`: the quota comes from the limiter's rule of that name
    /// when one is set; the rule's name is reported in denials and metrics.
    pub const fn named(mut self, rule: &'static str) -> Self {
        self.name = rule;
        self.named = Some(rule);
        self
    }

    /// `on_error = open | closed | local`.
    pub const fn on_error(mut self, policy: FailurePolicy) -> Self {
        self.on_error = Some(policy);
        self
    }

    /// `mode = shadow`.
    pub const fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// `lease = N`.
    pub const fn lease(mut self, tokens: u64) -> Self {
        self.lease = tokens;
        self
    }

    /// `on_limit = wait(max = ...)`, in microseconds.
    pub const fn wait_micros(mut self, max: u64) -> Self {
        self.wait = Some(Duration::from_micros(max));
        self
    }

    /// The quota of a call: the limiter's rule named by `rule = "..."` when
    /// one is set, the attribute's own numbers otherwise.
    #[inline]
    pub fn resolve(&self, limiter: &Limiter, defaults: &Quota) -> Quota {
        match self.named {
            Some(name) => limiter.rules().get(name).unwrap_or(*defaults),
            None => *defaults,
        }
    }
}

/// The attribute's own quota, from parts it checked at compile time. It
/// runs in a `static`, so an invalid quota that slipped through would fail
/// the build, never a request.
pub const fn quota(
    algorithm: Algorithm,
    capacity: u64,
    tokens: u64,
    period_us: u64,
    window_us: u64,
) -> Quota {
    Quota::__checked(algorithm, capacity, tokens, period_us, window_us)
}

/// The limiter used when the attribute names none.
#[inline]
pub fn global_limiter() -> &'static Limiter {
    ratelimit_core::global()
}

/// A value usable in a key template placeholder.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used in a rate limit key: placeholders need `std::fmt::Display`",
    label = "this placeholder's value must implement `Display`",
    note = "implement `Display` for `{Self}`, or name a field of it that does, such as `<arg.id>`"
)]
pub trait KeyPart {
    /// Appends the escaped value.
    fn push_to(&self, key: &mut KeyBuilder);
    /// Appends the value as a whole key (`key = <expression>`).
    fn push_whole_to(&self, key: &mut KeyBuilder);
}

impl<T: Display + ?Sized> KeyPart for T {
    #[inline]
    fn push_to(&self, key: &mut KeyBuilder) {
        key.push_value(self);
    }
    #[inline]
    fn push_whole_to(&self, key: &mut KeyBuilder) {
        key.push_whole(self);
    }
}

/// The function's return type, which a denied call returns instead of
/// running the body: `Result<T, E>` where `E: From<RateLimited>`, by whatever
/// name it is written (`Result<T, E>`, `ApiResult<T>`, a crate's own
/// `Result<T>`). The attribute cannot see through an alias, so the compiler
/// checks it here, and the generated call carries the return type's span so
/// that the error points at it.
#[diagnostic::on_unimplemented(
    message = "`#[rate_limit]` cannot return a denial as `{Self}`; return `Result<T, E>` where `E: From<RateLimited>`",
    label = "a denied call returns `Err(E::from(denied))`, so this must be a `Result`",
    note = "an alias of `Result` works too, such as `type ApiResult<T> = Result<T, ApiError>` with `impl From<RateLimited> for ApiError`"
)]
pub trait ReturnsDenial: Sized {
    /// The value a denied call returns.
    fn denied(denied: RateLimited) -> Self;
}

impl<T, E: From<RateLimited>> ReturnsDenial for Result<T, E> {
    #[inline]
    fn denied(denied: RateLimited) -> Self {
        Err(E::from(denied))
    }
}

/// Whether a call failed, for `refund_on`. Apart from [`ReturnsDenial`],
/// and without its `From<RateLimited>` bound: an error type that cannot
/// carry a denial is reported once, where the denial is returned, at the
/// return type.
#[diagnostic::on_unimplemented(
    message = "`#[rate_limit]` cannot return a denial as `{Self}`; return `Result<T, E>` where `E: From<RateLimited>`",
    label = "`refund_on` refunds on `Ok` or `Err`, so this must be a `Result`"
)]
pub trait Outcome {
    /// Whether the call failed.
    fn is_err(&self) -> bool;
}

impl<T, E> Outcome for Result<T, E> {
    #[inline]
    fn is_err(&self) -> bool {
        Result::is_err(self)
    }
}

/// A request's cost: any unsigned integer.
#[diagnostic::on_unimplemented(
    message = "`cost` must be an unsigned integer, not `{Self}`",
    label = "expected `u8`, `u16`, `u32`, `u64` or `usize`"
)]
pub trait IntoCost {
    /// The cost in tokens.
    fn into_cost(self) -> u64;
}

macro_rules! into_cost {
    ($($t:ty),*) => {$(
        impl IntoCost for $t {
            #[inline]
            fn into_cost(self) -> u64 {
                self as u64
            }
        }
    )*};
}
into_cost!(u8, u16, u32, u64, usize);

impl<T: IntoCost + Copy> IntoCost for &T {
    #[inline]
    fn into_cost(self) -> u64 {
        (*self).into_cost()
    }
}

/// `quota = <expression>`: a `Quota` or a reference to one.
#[diagnostic::on_unimplemented(
    message = "`quota` must give a `ratelimit::Quota` or a reference to one, not `{Self}`",
    label = "expected `Quota` or `&Quota`",
    note = "build quotas once, such as `static VIP: LazyLock<Quota> = ...`, and choose one per call"
)]
pub trait IntoQuota {
    /// The quota.
    fn into_quota(self) -> Quota;
}

impl IntoQuota for Quota {
    #[inline]
    fn into_quota(self) -> Quota {
        self
    }
}

impl<T: IntoQuota + Copy> IntoQuota for &T {
    #[inline]
    fn into_quota(self) -> Quota {
        (*self).into_quota()
    }
}

/// One attribute's check of one call, prepared before the body runs.
#[derive(Debug)]
pub struct Call<'a> {
    limiter: &'a Limiter,
    rule: &'static Rule,
    quota: Quota,
    /// The key given to the limiter.
    key: String,
    /// The length of the key as the attribute built it, which denials report.
    shown: usize,
    cost: u64,
}

impl<'a> Call<'a> {
    /// `cost` tokens of `quota` from `key`, on `limiter`, under `rule`.
    ///
    /// A quota whose algorithm is not the attribute's own (a named rule or a
    /// `quota = ...` of another algorithm) decides on `key~<algorithm>`:
    /// each algorithm keeps state of its own shape, and a key must never
    /// meet another algorithm's state when a rule changes algorithm at run
    /// time. A stacked attribute whose template an earlier one has too
    /// decides on `key~<position>` (see [`acquire_all`]). Denials still
    /// report `key`.
    #[inline]
    pub fn new(
        limiter: &'a Limiter,
        rule: &'static Rule,
        quota: Quota,
        mut key: String,
        cost: u64,
    ) -> Self {
        let shown = key.len();
        ratelimit_core::key::__keep_apart(&mut key, rule.algorithm, &quota);
        if rule.apart != 0 {
            use std::fmt::Write as _;
            let _ = write!(key, "~{}", rule.apart);
        }
        Self {
            limiter,
            rule,
            quota,
            key,
            shown,
            cost,
        }
    }

    /// What the limiter is asked for this call.
    fn request(&self) -> Request<'_> {
        let rule = self.rule;
        let request = Request::new(&self.quota, &self.key)
            .cost(self.cost)
            .rule(rule.name)
            .lease(rule.lease)
            .shadow(rule.shadow);
        match rule.on_error {
            Some(policy) => request.on_error(policy),
            None => request,
        }
    }

    /// The denial of a call its limiter admitted for later (a leaky bucket's
    /// turn, `delay` away) where nothing can sleep until then: outside a
    /// Tokio runtime, such as under `futures::executor::block_on`. Running
    /// the body early would break the bucket's pace; the call is denied and
    /// its tokens given back.
    fn no_turn(&self, delay: Duration) -> RateLimited {
        let key = self.key.get(..self.shown).unwrap_or(&self.key);
        let mut denied = RateLimited::new(key, self.quota.capacity(), 0, delay);
        denied.rule = Some(self.rule.name);
        denied
    }

    /// The denial as the attribute's key names it.
    fn shown(&self, mut denied: RateLimited) -> RateLimited {
        if denied.key.len() > self.shown && denied.key == self.key {
            denied.key.truncate(self.shown);
        }
        denied
    }
}

/// Takes the call's tokens; the denial names the rule. `None`: the call is
/// exempt (`exempt = <expression>` was true), and nothing is asked.
///
/// With `on_limit = wait(max)`, a call denied by the quota sleeps for its
/// `retry_after` and tries again while it can still be admitted within `max`
/// of the first try; dropping the future cancels the wait. A leaky bucket's
/// call sleeps until its turn; dropped before then, it gives the turn back.
pub async fn acquire(call: Option<Call<'_>>) -> Result<(), RateLimited> {
    let Some(call) = call else {
        return Ok(());
    };
    let admitted = admit(&call).await?;
    let delay = admitted.delay();
    if !delay.is_zero() {
        let mut taking = Taking::default();
        taking.hold(call.limiter, admitted, delay);
        if let Err(delay) = taking.turn().await {
            give_back(&mut taking.held).await;
            return Err(call.no_turn(delay));
        }
        taking.keep();
    }
    Ok(())
}

/// Whether the caller can sleep: on a Tokio runtime, whose timers
/// `on_limit = wait` and a leaky bucket's turn sleep on (outside one, as
/// under `futures::executor::block_on`, Tokio's sleep panics).
fn can_sleep() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}

/// The call's admission by its limiter, after the waits `on_limit = wait`
/// allows; the denial names the rule.
async fn admit<'a>(call: &'a Call<'_>) -> Result<Admitted<'a>, RateLimited> {
    // `None` inside: a deadline past any instant.
    let deadline = call
        .rule
        .wait
        .map(|max| tokio::time::Instant::now().checked_add(max));
    loop {
        match call.limiter.check(call.request()).await {
            Ok(admitted) => return Ok(admitted),
            Err(denied) => {
                let waitable = matches!(
                    denied.cause,
                    DenialCause::Quota | DenialCause::LocalFallback
                );
                // Outside a Tokio runtime nothing can sleep: the denial
                // stands.
                if let (Some(deadline), true, true) = (deadline, waitable, can_sleep()) {
                    // A wait past any instant (a `retry_after` of years) is
                    // past the deadline too.
                    let wake = tokio::time::Instant::now().checked_add(denied.retry_after);
                    if let Some(wake) = wake.filter(|wake| deadline.is_none_or(|d| *wake <= d)) {
                        tokio::time::sleep_until(wake).await;
                        continue;
                    }
                }
                return Err(call.shown(denied));
            }
        }
    }
}

/// What a call's checks have taken while its body has not started: given
/// back if the call goes no further, because a later check denies or the
/// caller drops the future at a later check or while it waits its turn.
#[derive(Default)]
struct Taking {
    held: Vec<(Limiter, OwnedAdmitted)>,
    /// When the body may run: the latest turn a leaky bucket gave.
    turn: Option<tokio::time::Instant>,
}

impl Taking {
    fn hold(&mut self, limiter: &Limiter, admitted: Admitted<'_>, delay: Duration) {
        if !delay.is_zero() {
            let turn = tokio::time::Instant::now() + delay;
            self.turn = Some(self.turn.map_or(turn, |t| t.max(turn)));
        }
        self.held.push((limiter.clone(), admitted.__into_owned()));
    }

    /// Sleeps until the body's turn: a leaky bucket admits a call for later,
    /// so bodies run at the bucket's pace. `Err` with the wait left when
    /// nothing can sleep (see [`can_sleep`]).
    async fn turn(&self) -> Result<(), Duration> {
        let Some(turn) = self.turn else {
            return Ok(());
        };
        if !can_sleep() {
            return Err(turn.saturating_duration_since(tokio::time::Instant::now()));
        }
        tokio::time::sleep_until(turn).await;
        Ok(())
    }

    /// The body runs: what was taken stays taken.
    fn keep(mut self) -> Vec<(Limiter, OwnedAdmitted)> {
        std::mem::take(&mut self.held)
    }
}

/// Refunds each admission in `held`, taking it out as it goes: a later check
/// denied, and everything taken goes back before the denial is returned
/// (dropped halfway, a `Taking` sends the rest as it drops).
async fn give_back(held: &mut Vec<(Limiter, OwnedAdmitted)>) {
    while let Some((limiter, admitted)) = held.pop() {
        if let Err(error) = limiter.__refund_owned(admitted).await {
            limiter.__refund_lost("the tokens of a call that was not run", &error);
        }
    }
}

impl Drop for Taking {
    /// The caller dropped the call before its body ran. A refund needs I/O,
    /// so it runs as a task of its own on the caller's runtime. With none,
    /// or one shutting down (which drops the task unrun, and with it what it
    /// holds, never a `Taking` again), the tokens stay taken: that admits
    /// less, never more.
    fn drop(&mut self) {
        give_back_later(std::mem::take(&mut self.held));
    }
}

/// Refunds each admission in `held` as a task of its own on the caller's
/// runtime, for a call (or a request) dropped before its body ran: a
/// refund needs I/O, and `Drop` cannot wait. With no runtime, or one
/// shutting down, the tokens stay taken: that admits less, never more.
pub(crate) fn give_back_later(mut held: Vec<(Limiter, OwnedAdmitted)>) {
    if held.is_empty() {
        return;
    }
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { give_back(&mut held).await });
    }
}

/// Several `#[rate_limit]` on one function: every one must admit, and none
/// consumes unless all do (one atomic check on one limiter; those in shadow
/// mode are decided after the others, and never deny). Checks on different
/// limiters, or that wait, run one after the other in the order written;
/// when one denies, or the caller drops the call before its body runs, what
/// the earlier ones took is given back.
/// Exempt checks (`None`) are left out. Each check keeps its own failure
/// policy.
///
/// Two checks on the same key (the common burst-plus-sustained pair on one
/// template) keep state of their own: the later one decides on
/// `key~<position>` (its place among the attributes, from 1), which no
/// escaped value can spell. Where the templates are the same, that is fixed
/// when the function is compiled (see [`Rule::apart`]), so an earlier check
/// being exempt on a call changes no key; where different templates build
/// the same key on a call, it is found here, among the checks that are not
/// exempt. Denials still report the key as built.
pub async fn acquire_all(calls: &mut [Option<Call<'_>>]) -> Result<(), RateLimited> {
    acquire_several(calls, false).await.map(drop)
}

/// What `refund_on` gives back: each admission of a call's checks, with the
/// limiter that made it. It owns what it holds, so the body may use the
/// arguments (and the `limiter = ...` expression's source) as it would
/// without `refund_on`.
#[derive(Debug)]
pub struct Receipt {
    kept: Vec<(Limiter, OwnedAdmitted)>,
}

/// `refund_on = err | ok`: which outcome of the body gives the call's
/// tokens back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundOn {
    /// The body returned `Err`: only successes count.
    Err,
    /// The body returned `Ok`: only failures count.
    Ok,
}

/// [`acquire_all`] (or [`acquire`], for one call), keeping each admission
/// for [`settle`].
pub async fn acquire_kept(calls: &mut [Option<Call<'_>>]) -> Result<Receipt, RateLimited> {
    acquire_several(calls, true).await
}

/// The body's output, as an async block whose `return`s and `?`s give the
/// function's return type `T`: naming it here lets the compiler infer the
/// block's output.
#[inline]
pub fn output<T, F: Future<Output = T>>(body: F) -> F {
    body
}

/// Gives the call's tokens back when `output` is the outcome `refund_on`
/// names. A refund that fails is logged; the output stands.
pub async fn settle<R: Outcome>(receipt: Receipt, output: &R, refund_on: RefundOn) {
    let refund = match refund_on {
        RefundOn::Err => output.is_err(),
        RefundOn::Ok => !output.is_err(),
    };
    if !refund {
        return;
    }
    for (limiter, admitted) in receipt.kept {
        if let Err(error) = limiter.__refund_owned(admitted).await {
            limiter.__refund_lost("a call's tokens", &error);
        }
    }
}

/// The admissions of `calls` (see [`acquire_all`]), kept when `keep`.
async fn acquire_several(
    calls: &mut [Option<Call<'_>>],
    keep: bool,
) -> Result<Receipt, RateLimited> {
    for i in 1..calls.len() {
        let (earlier, rest) = calls.split_at_mut(i);
        let Some(call) = rest[0].as_mut() else {
            continue;
        };
        if earlier.iter().flatten().any(|e| e.key == call.key) {
            call.key.push('~');
            call.key.push_str(&(i + 1).to_string());
        }
    }
    let calls: Vec<&Call<'_>> = calls.iter().flatten().collect();
    let Some((first, rest)) = calls.split_first() else {
        return Ok(Receipt { kept: Vec::new() });
    };
    let atomic = rest.iter().all(|call| call.limiter.__same(first.limiter))
        && calls.iter().all(|call| call.rule.wait.is_none());
    let mut taking = Taking::default();
    if !atomic || calls.len() == 1 {
        for call in &calls {
            match admit(call).await {
                Ok(admitted) => {
                    let delay = admitted.delay();
                    taking.hold(call.limiter, admitted, delay);
                }
                Err(denied) => {
                    give_back(&mut taking.held).await;
                    return Err(denied);
                }
            }
        }
    } else {
        let requests: Vec<Request<'_>> = calls.iter().map(|call| call.request()).collect();
        let admitted = first.limiter.check(&requests[..]).await.map_err(|denied| {
            match calls.iter().find(|call| call.key == denied.key) {
                Some(call) => call.shown(denied),
                None => denied,
            }
        })?;
        // A leaky bucket among them: the call's turn comes after the longest delay.
        let delay = admitted.delay();
        if keep || !delay.is_zero() {
            taking.hold(first.limiter, admitted, delay);
        }
    }
    if let Err(delay) = taking.turn().await {
        give_back(&mut taking.held).await;
        return Err(first.no_turn(delay));
    }
    let kept = taking.keep();
    Ok(Receipt {
        kept: if keep { kept } else { Vec::new() },
    })
}
