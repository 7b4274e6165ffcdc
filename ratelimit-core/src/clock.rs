//! Time sources, in integer microseconds since the Unix epoch.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
/// The memory backend and the deny cache read it on every decision, so it
/// reads the CPU's time-stamp counter where the counter is invariant
/// (through `quanta`, calibrated once per process against the operating
/// system's monotonic clock, which takes about a millisecond): a few
/// nanoseconds a reading, where the operating system's clock takes tens on
/// some virtual machines. Should the counter ever read below its reading at
/// the anchor (a counter reset by a suspend, or counters out of step between
/// sockets), the clock goes on from the operating system's monotonic clock
/// for good, with a step no larger than the two clocks have drifted apart
/// (the counter's calibration is good to a few parts per million); elsewhere
/// it reads that clock.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    anchor_micros: u64,
    anchor: Instant,
    counter: quanta::Clock,
    /// The counter's reading at the anchor.
    counter_anchor: u64,
    /// Set once the counter has read below `counter_anchor`.
    counter_failed: Arc<AtomicBool>,
}

impl MonotonicClock {
    /// A clock anchored at the current wall time.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        // The operating system's clock is anchored first, so that a switch
        // to it reads a little ahead of the counter rather than behind.
        let anchor = Instant::now();
        let counter_anchor = counter.raw();
        let anchor_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        Self {
            anchor_micros,
            anchor,
            counter,
            counter_anchor,
            counter_failed: Arc::new(AtomicBool::new(false)),
        }
    }

    fn os_clock_micros(&self) -> u64 {
        let elapsed = self.anchor.elapsed();
        self.anchor_micros + elapsed.as_secs() * 1_000_000 + u64::from(elapsed.subsec_micros())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_micros(&self) -> u64 {
        if self.counter_failed.load(Ordering::Relaxed) {
            return self.os_clock_micros();
        }
        let raw = self.counter.raw();
        if raw < self.counter_anchor {
            self.counter_failed.store(true, Ordering::Relaxed);
            return self.os_clock_micros();
        }
        self.anchor_micros + self.counter.delta_as_nanos(self.counter_anchor, raw) / 1_000
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

    /// Moves the clock forward, to `u64::MAX` at most.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(by))
            });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wall_micros() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }

    /// A manual clock moved past the last instant it can name stays there:
    /// it wrapped to the start of the epoch, or stepped back when moved by
    /// `Duration::MAX`.
    #[test]
    fn a_manual_clock_moved_past_its_last_instant_stays_there() {
        let clock = ManualClock::new(u64::MAX - 5);
        clock.advance(Duration::from_micros(10));
        assert_eq!(clock.now_micros(), u64::MAX);
        let clock = ManualClock::new(1_000);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now_micros(), u64::MAX);
    }

    #[test]
    fn the_monotonic_clock_keeps_to_the_wall_clock_and_never_goes_back() {
        let clock = MonotonicClock::new();
        let mut last = clock.now_micros();
        for _ in 0..10_000 {
            let now = clock.now_micros();
            assert!(now >= last, "went back from {last} to {now}");
            last = now;
        }
        std::thread::sleep(Duration::from_millis(20));
        let (now, wall) = (clock.now_micros(), wall_micros());
        assert!(now >= last + 20_000, "20 ms slept, {} µs seen", now - last);
        assert!(
            now.abs_diff(wall) < 100_000,
            "{now} against the wall's {wall}"
        );
    }

    /// A counter that reads below its reading at the anchor (reset by a
    /// suspend, or out of step on another socket) hands the clock to the
    /// operating system's for good, with no jump: the two clocks differ by
    /// their drift since the anchor, a few microseconds here, either way.
    #[test]
    fn a_counter_reading_below_its_anchor_leaves_the_os_clock_in_charge() {
        let mut clock = MonotonicClock::new();
        let before = clock.now_micros();
        clock.counter_anchor = u64::MAX;
        let after = clock.now_micros();
        assert!(clock.counter_failed.load(Ordering::Relaxed));
        assert!(
            after + 1_000 >= before && after.abs_diff(before) < 100_000,
            "{before} then {after}"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(clock.now_micros() >= after + 20_000);
        assert!(clock.clone().counter_failed.load(Ordering::Relaxed));
    }
}
