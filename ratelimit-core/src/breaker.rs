//! A circuit breaker in front of the backend: after a run of failures it stops
//! calling a backend that is down, so each call pays the failure policy's
//! cost instead of a timeout, and it probes the backend again with backoff
//! until it answers. Lock-free: a closed breaker costs one atomic load.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How the breaker reacts to failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// Consecutive failed calls that open the breaker (0 disables it).
    pub failures_to_open: u32,
    /// The wait before the first probe of an open breaker.
    pub initial_backoff: Duration,
    /// The longest wait between probes; the wait doubles up to it.
    pub max_backoff: Duration,
}

impl Default for BreakerConfig {
    /// Opens after 3 consecutive failures; probes after 50 ms, doubling up to
    /// 500 ms, so a backend that comes back is used again within about half a
    /// second.
    fn default() -> Self {
        Self {
            failures_to_open: 3,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
        }
    }
}

/// The breaker's state, as exported in metrics (`0`, `1`, `2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CircuitState {
    /// Calls go to the backend.
    Closed = 0,
    /// Calls skip the backend; the failure policy answers.
    Open = 1,
    /// One probe call is in flight; the others skip the backend.
    HalfOpen = 2,
}

pub(crate) struct Breaker {
    config: BreakerConfig,
    epoch: Instant,
    state: AtomicU8,
    failures: AtomicU32,
    /// Microseconds after `epoch` when the next probe may go.
    probe_at: AtomicU64,
    backoff_us: AtomicU64,
    probing: AtomicBool,
}

/// What the caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Call the backend.
    Call,
    /// Call the backend as the one probe of an open breaker.
    Probe,
    /// Do not call the backend.
    Skip,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            epoch: Instant::now(),
            state: AtomicU8::new(CircuitState::Closed as u8),
            failures: AtomicU32::new(0),
            probe_at: AtomicU64::new(0),
            backoff_us: AtomicU64::new(config.initial_backoff.as_micros() as u64),
            probing: AtomicBool::new(false),
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    pub(crate) fn state(&self) -> CircuitState {
        match self.state.load(Ordering::Acquire) {
            0 => CircuitState::Closed,
            1 => CircuitState::Open,
            _ => CircuitState::HalfOpen,
        }
    }

    pub(crate) fn permit(&self) -> Permit {
        if self.state.load(Ordering::Acquire) == CircuitState::Closed as u8 {
            return Permit::Call;
        }
        if self.now_us() >= self.probe_at.load(Ordering::Acquire)
            && self
                .probing
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.state
                .store(CircuitState::HalfOpen as u8, Ordering::Release);
            return Permit::Probe;
        }
        Permit::Skip
    }

    /// Records a call's outcome. Returns the new state when it changed.
    pub(crate) fn record(&self, permit: Permit, success: bool) -> Option<CircuitState> {
        if success {
            self.failures.store(0, Ordering::Release);
            if permit == Permit::Probe || self.state() != CircuitState::Closed {
                self.backoff_us.store(
                    self.config.initial_backoff.as_micros() as u64,
                    Ordering::Release,
                );
                self.state
                    .store(CircuitState::Closed as u8, Ordering::Release);
                self.probing.store(false, Ordering::Release);
                return Some(CircuitState::Closed);
            }
            return None;
        }
        if self.config.failures_to_open == 0 {
            return None;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if permit == Permit::Probe || failures >= self.config.failures_to_open {
            let backoff = self.backoff_us.load(Ordering::Acquire);
            self.probe_at
                .store(self.now_us() + backoff, Ordering::Release);
            let next = (backoff * 2).min(self.config.max_backoff.as_micros() as u64);
            self.backoff_us.store(next.max(1), Ordering::Release);
            let was = self.state.swap(CircuitState::Open as u8, Ordering::AcqRel);
            self.probing.store(false, Ordering::Release);
            if was != CircuitState::Open as u8 {
                return Some(CircuitState::Open);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_lets_one_probe_through() {
        let breaker = Breaker::new(BreakerConfig {
            failures_to_open: 2,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        });
        assert_eq!(breaker.permit(), Permit::Call);
        assert_eq!(breaker.record(Permit::Call, false), None);
        assert_eq!(
            breaker.record(Permit::Call, false),
            Some(CircuitState::Open)
        );
        // Backoff zero: the next caller probes, the one after it skips.
        assert_eq!(breaker.permit(), Permit::Probe);
        assert_eq!(breaker.permit(), Permit::Skip);
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        assert_eq!(
            breaker.record(Permit::Probe, true),
            Some(CircuitState::Closed)
        );
        assert_eq!(breaker.permit(), Permit::Call);
    }

    #[test]
    fn an_open_breaker_skips_the_backend_until_its_backoff_has_passed() {
        let breaker = Breaker::new(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(3600),
        });
        breaker.record(Permit::Call, false);
        assert_eq!(breaker.permit(), Permit::Skip);
        assert_eq!(breaker.state(), CircuitState::Open);
    }

    #[test]
    fn a_failed_probe_reopens_with_a_longer_backoff() {
        let breaker = Breaker::new(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::from_secs(3600),
        });
        breaker.record(Permit::Call, false);
        assert_eq!(breaker.permit(), Permit::Probe);
        breaker.record(Permit::Probe, false);
        // The doubled backoff (from a 1 µs floor) keeps the breaker open for now.
        assert_eq!(breaker.state(), CircuitState::Open);
    }
}
