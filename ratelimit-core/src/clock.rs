//! Time sources, in integer microseconds since the Unix epoch.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of the current time for decisions, in microseconds since the Unix
/// epoch.
///
/// The memory backend always reads a `Clock`; the Redis backend reads Redis
/// `TIME` unless [`LimiterBuilder::clock`](crate::LimiterBuilder::clock) gives
/// it one. A clock may go backwards: the algorithms never mint tokens when it does.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time in microseconds since the Unix epoch.
    fn now_micros(&self) -> u64;
}

/// The wall clock, anchored once and advanced by the monotonic clock, so that
/// decisions never see the wall clock jump.
///
/// The monotonic clock is read from the CPU's time-stamp counter where it is
/// invariant (through `quanta`, calibrated once per process against the
/// operating system's monotonic clock), else from the operating system: a
/// reading then costs a few nanoseconds instead of a clock call, and the
/// memory backend reads the clock on every decision.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    anchor_micros: u64,
    /// The counter's raw reading at `anchor_micros`.
    anchor: u64,
    counter: quanta::Clock,
}

impl MonotonicClock {
    /// A clock anchored at the current wall time.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        let anchor = counter.raw();
        let anchor_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            anchor_micros,
            anchor,
            counter,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_micros(&self) -> u64 {
        let elapsed = self.counter.delta_as_nanos(self.anchor, self.counter.raw());
        self.anchor_micros + elapsed / 1_000
    }
}

/// The system wall clock, read on every call (it can jump, as wall clocks do).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }
}

/// A clock that moves only when told to, for tests. Clones share one time.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_core::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// let same = clock.clone();
/// clock.advance(Duration::from_millis(2));
/// assert_eq!(same.now_micros(), 3_000);
/// clock.set(500); // backwards is allowed
/// assert_eq!(same.now_micros(), 500);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock stopped at `micros` since the epoch.
    pub fn new(micros: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(micros)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Sets the clock, forward or backward.
    pub fn set(&self, micros: u64) {
        self.now.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
