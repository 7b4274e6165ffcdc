//! What one key's replies taught: a bucket's debt, a fixed window's count,
//! or a sliding algorithm's denials, each as of the instants the reply was
//! asked for and arrived; and the answer they give a later request.

use crate::algorithm::{decision, gcra};
use crate::decision::Decision;
use crate::quota::{Algorithm, Quota};

use super::{Waiting, COSTS_PER_KEY, MAX_AGE_US};

/// What is known of one key under one quota.
pub(super) struct Known {
    pub(super) quota: Quota,
    /// The count of rule changes when the reply was asked for.
    pub(super) rules: u64,
    /// When it was last learned, on the cache's clock: a clock gone back
    /// before that cannot use it.
    pub(super) learned_us: u64,
    /// When a reply last replaced what was known (one asked for after every
    /// reply known had arrived, so decided after them all): a denial is
    /// answered from for [`MAX_AGE_US`] after it at most. Replies that
    /// crossed are merged and leave it: they were asked for before what
    /// they merge with arrived, so they cannot tell that the key was not
    /// given back since.
    pub(super) confirmed_us: u64,
    pub(super) state: State,
    /// Set while a caller is asking the backend for the others.
    pub(super) probe: Option<Waiting>,
}

/// What is known, each instant twice: as of the earliest the backend can
/// have decided (`early`, when asked) and the latest (`late`, when its reply
/// arrived).
pub(super) enum State {
    /// The bucket algorithms: the instant the debt is paid off, in the
    /// algorithm's units (`rate.tokens` a microsecond) since the epoch.
    Bucket { early: u128, late: u128 },
    /// The fixed window: at least `count` in the window ending at `end`.
    Window { count: u64, end: Span },
    /// The sliding algorithms: denials of one cost each.
    Denials(Vec<Denial>),
}

/// One instant of the backend's, on the cache's clock: no sooner than
/// `early`, no later than `late`.
#[derive(Clone, Copy)]
pub(super) struct Span {
    pub(super) early: u64,
    pub(super) late: u64,
}

impl Span {
    pub(super) fn max(self, other: Span) -> Span {
        Span {
            early: self.early.max(other.early),
            late: self.late.max(other.late),
        }
    }
}

/// A sliding algorithm's denial of `cost`, with `remaining` one short of it.
#[derive(Clone, Copy)]
pub(super) struct Denial {
    pub(super) cost: u64,
    /// When the denied request can first be admitted.
    pub(super) until: Span,
    pub(super) remaining: u64,
    /// When the key is back to its whole quota.
    pub(super) reset: Span,
}

/// Which kind of state an algorithm's replies teach.
pub(super) enum Kind {
    Bucket { leaky: bool },
    Window,
    Sliding,
}

pub(super) fn kind(quota: &Quota) -> Kind {
    match quota.algorithm() {
        Algorithm::TokenBucket | Algorithm::Gcra => Kind::Bucket { leaky: false },
        Algorithm::LeakyBucket => Kind::Bucket { leaky: true },
        Algorithm::FixedWindow => Kind::Window,
        Algorithm::SlidingLog | Algorithm::SlidingWindow => Kind::Sliding,
    }
}

impl Known {
    /// The bucket's debt at `now_us`, in the algorithm's units.
    pub(super) fn debt(&self, paid_off: u128, now_us: u64) -> u64 {
        let tokens = u128::from(self.quota.rate().tokens());
        let debt = paid_off.saturating_sub(u128::from(now_us) * tokens);
        u64::try_from(debt)
            .unwrap_or(u64::MAX)
            .min(self.quota.depth())
    }

    /// The denial the backend would give a request of `cost` at `now_us`,
    /// when what is known is enough to say it would deny it.
    pub(super) fn denial(&self, cost: u64, now_us: u64) -> Option<Decision> {
        if now_us < self.learned_us || now_us - self.confirmed_us >= MAX_AGE_US {
            return None;
        }
        let quota = &self.quota;
        match &self.state {
            State::Bucket { early, late } => {
                let Kind::Bucket { leaky } = kind(quota) else {
                    return None;
                };
                // Denied even by the earliest the backend may have decided;
                // the wait counts from the latest.
                if gcra::fits(quota, self.debt(*early, now_us), cost) {
                    return None;
                }
                Some(gcra::decide_debt(
                    quota,
                    self.debt(*late, now_us),
                    cost,
                    leaky,
                ))
            }
            State::Window { count, end } => (now_us < end.early && count + cost > quota.capacity())
                .then(|| {
                    let left = end.late - now_us;
                    let remaining = quota.capacity().saturating_sub(*count);
                    decision(quota, false, remaining, left, left, 0)
                }),
            State::Denials(denials) => denials
                .iter()
                .find(|d| d.cost == cost && now_us < d.until.early)
                .map(|d| {
                    let reset = d.reset.late.saturating_sub(now_us);
                    decision(quota, false, d.remaining, d.until.late - now_us, reset, 0)
                }),
        }
    }

    /// Whether a request of `cost` at `now_us`, which this does not deny,
    /// may be the last of that cost to fit, or the first after a denial of
    /// it ended: then one caller asks the backend and the others wait.
    pub(super) fn contended(&self, cost: u64, now_us: u64) -> bool {
        if now_us < self.learned_us {
            return false;
        }
        let capacity = self.quota.capacity();
        match &self.state {
            State::Bucket { late, .. } => {
                let two = u128::from(cost) * 2 * u128::from(self.quota.rate().period_us());
                u128::from(self.debt(*late, now_us)) + two > u128::from(self.quota.depth())
            }
            State::Window { count, end } if now_us < end.early => count + 2 * cost > capacity,
            State::Window { count, .. } => count + cost > capacity,
            State::Denials(denials) => denials.iter().any(|d| d.cost == cost),
        }
    }

    /// Whether this still tells anything at `now_us`.
    pub(super) fn live(&self, now_us: u64) -> bool {
        self.probe.is_some()
            || match &self.state {
                State::Bucket { late, .. } => {
                    *late > u128::from(now_us) * u128::from(self.quota.rate().tokens())
                }
                State::Window { end, .. } => end.late > now_us,
                State::Denials(denials) => denials.iter().any(|d| d.until.late > now_us),
            }
    }

    /// Takes in `learned`, a state learned at `now_us` under the same quota,
    /// from a reply asked for at `asked_us`. A reply asked for after every
    /// reply known here had arrived was decided after them all, and replaces
    /// them: what another writer gave back since (a refund, a reset, a
    /// deleted key) shows in it. Replies that crossed are merged.
    pub(super) fn merge(&mut self, learned: State, asked_us: u64, now_us: u64) {
        if asked_us > self.learned_us {
            self.state = learned;
            self.learned_us = now_us;
            self.confirmed_us = now_us;
            return;
        }
        let window = self.quota.window_us();
        match (&mut self.state, learned) {
            (State::Bucket { early, late }, State::Bucket { early: e, late: l }) => {
                (*early, *late) = ((*early).max(e), (*late).max(l));
            }
            (
                State::Window { count, end },
                State::Window {
                    count: new_count,
                    end: new_end,
                },
            ) => {
                // Each reply's window ends within its span (between the
                // reply's asking and its arrival, plus its `reset_after`),
                // and the ends of two windows are a window apart. Spans
                // apart are of two windows: the later one is kept. Spans
                // that meet are of one window when, together, they are
                // narrower than a window; otherwise (round trips as long as
                // a window) nothing tells, and the new reply is kept alone,
                // never a count with another window's end.
                let width = |span: &Span| span.late - span.early;
                if new_end.early > end.late {
                    (*count, *end) = (new_count, new_end);
                } else if new_end.late < end.early {
                    // An older window's reply, arrived late.
                } else if width(end).saturating_add(width(&new_end)) < window {
                    (*count, *end) = ((*count).max(new_count), end.max(new_end));
                } else {
                    (*count, *end) = (new_count, new_end);
                }
            }
            (State::Denials(denials), State::Denials(new)) => {
                for denial in new {
                    match denials.iter_mut().find(|d| d.cost == denial.cost) {
                        Some(kept) => {
                            kept.until = kept.until.max(denial.until);
                            kept.reset = kept.reset.max(denial.reset);
                        }
                        None => {
                            denials.retain(|d| d.until.late > now_us);
                            if denials.len() >= COSTS_PER_KEY {
                                denials.remove(0);
                            }
                            denials.push(denial);
                        }
                    }
                }
            }
            (state, learned) => *state = learned,
        }
        self.learned_us = self.learned_us.max(now_us);
    }
}
