//! Support for the code `#[rate_limit]` generates. Every item here is named by
//! absolute path from generated code only.

use std::borrow::Borrow;
use std::fmt::Display;

pub use ratelimit_core::{FailurePolicy, KeyBuilder, Limiter, Quota, RateLimited};

use std::time::Duration;

use ratelimit_core::{Algorithm, CallOptions, DenialCause, Dimension};

/// One `#[rate_limit]` attribute, built in a `static` at compile time.
#[derive(Debug)]
pub struct Rule {
    /// The function's path, reported in denials.
    pub name: &'static str,
    /// The attribute's quota.
    pub quota: Quota,
    /// The rule's name, failure policy and mode, for the limiter.
    pub options: CallOptions,
    /// `on_limit = wait(max = ...)`: how long a denied call may wait for its
    /// turn before it gives up.
    pub wait: Option<Duration>,
}

impl Rule {
    /// A rule from parts the attribute checked at compile time. `algorithm`
    /// indexes `Algorithm::ALL` and must be the algorithm called
    /// `algorithm_name`, which the build checks, as this runs in a `static`.
    pub const fn new(
        name: &'static str,
        algorithm: usize,
        algorithm_name: &'static str,
        capacity: u64,
        tokens: u64,
        period_us: u64,
        window_us: u64,
    ) -> Self {
        assert!(
            same(Algorithm::ALL[algorithm].name(), algorithm_name),
            "the `#[rate_limit]` attribute and the `ratelimit` runtime disagree on algorithms; \
             use the same version of `ratelimit` and `ratelimit-macros`"
        );
        Self {
            name,
            quota: Quota::__checked(algorithm, capacity, tokens, period_us, window_us),
            options: CallOptions::new(name),
            wait: None,
        }
    }

    /// `on_error = open | closed | local`.
    pub const fn on_error(mut self, policy: FailurePolicy) -> Self {
        self.options = self.options.on_error(policy);
        self
    }

    /// `mode = shadow`.
    pub const fn shadow(mut self) -> Self {
        self.options = self.options.shadow(true);
        self
    }

    /// `on_limit = wait(max = ...)`, in microseconds.
    pub const fn wait_micros(mut self, max: u64) -> Self {
        self.wait = Some(Duration::from_micros(max));
        self
    }
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The limiter used when the attribute names none.
#[inline]
pub fn global_limiter() -> &'static Limiter {
    ratelimit_core::global()
}

/// `limiter = <expression>` accepts a `Limiter`, a reference to one, an
/// `Arc<Limiter>` or a `Box<Limiter>`.
#[inline]
pub fn borrow_limiter<L: Borrow<Limiter> + ?Sized>(limiter: &L) -> &Limiter {
    limiter.borrow()
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

/// Takes `cost` tokens for `key` under `rule`; the denial names the rule.
///
/// With `on_limit = wait(max)`, a call denied by the quota sleeps for its
/// `retry_after` and tries again while it can still be admitted within `max`
/// of the first try; dropping the future cancels the wait.
pub async fn acquire(
    limiter: &Limiter,
    rule: &'static Rule,
    key: &str,
    cost: u64,
) -> Result<(), RateLimited> {
    let deadline = rule.wait.map(|max| tokio::time::Instant::now() + max);
    loop {
        match limiter
            .acquire_with(&rule.quota, key, cost, &rule.options)
            .await
        {
            Ok(decision) => {
                // The leaky bucket admits a call for later: its turn comes
                // after `delay`, so the body runs at the bucket's pace.
                if !decision.delay.is_zero() {
                    tokio::time::sleep(decision.delay).await;
                }
                return Ok(());
            }
            Err(denied) => {
                let waitable = matches!(
                    denied.cause,
                    DenialCause::Quota | DenialCause::LocalFallback
                );
                if let (Some(deadline), true) = (deadline, waitable) {
                    let wake = tokio::time::Instant::now() + denied.retry_after;
                    if wake <= deadline {
                        tokio::time::sleep_until(wake).await;
                        continue;
                    }
                }
                return Err(denied);
            }
        }
    }
}

/// Several `#[rate_limit]` on one function: every one must admit, and none
/// consumes unless all do (one atomic check on one limiter). Checks on
/// different limiters, or that wait or run in shadow mode, run one after the
/// other in the order written.
pub async fn acquire_all(
    checks: &[(&Limiter, &'static Rule, &str, u64)],
) -> Result<(), RateLimited> {
    let Some(((first, _, _, _), rest)) = checks.split_first() else {
        return Ok(());
    };
    let atomic = rest.iter().all(|(limiter, _, _, _)| limiter.__same(first))
        && checks
            .iter()
            .all(|(_, rule, _, _)| rule.wait.is_none() && !rule.options.shadow);
    if !atomic {
        for (limiter, rule, key, cost) in checks {
            acquire(limiter, rule, key, *cost).await?;
        }
        return Ok(());
    }
    let dimensions: Vec<Dimension<'_>> = checks
        .iter()
        .map(|(_, rule, key, cost)| Dimension::new(&rule.quota, key).cost(*cost).rule(rule.name))
        .collect();
    let decisions = first.check_all(&dimensions).await?;
    // A leaky bucket among them: the call's turn comes after the longest delay.
    if let Some(delay) = decisions
        .iter()
        .map(|d| d.delay)
        .max()
        .filter(|d| !d.is_zero())
    {
        tokio::time::sleep(delay).await;
    }
    Ok(())
}
