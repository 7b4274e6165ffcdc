//! A circuit breaker in front of the backend: after a run of failures it stops
//! calling a backend that is down, so each call pays the failure policy's
//! cost instead of a timeout, and it probes the backend again with backoff
//! until it answers. Lock-free: a closed breaker costs one atomic load.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};

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
    /// The probe in flight, by number (0 when none): a probe whose caller
    /// keeps its future without polling it (pinned beside a `select!`
    /// loop, say) would otherwise hold the breaker half open for as long.
    probe: AtomicU64,
    /// The last probe's number.
    probes: AtomicU64,
    /// When the probe in flight was handed out, in microseconds after `epoch`.
    probe_started: AtomicU64,
    /// How long a probe may be in flight before the next caller probes
    /// instead: twice the limiter's timeout, which bounds a probe polled to
    /// its end.
    probe_expiry_us: u64,
    /// Set when the limiter no longer calls through this breaker (a
    /// cluster node that is no longer a master): a call still in flight
    /// through it then reports no state, which nothing would ever clear.
    retired: AtomicBool,
    /// The kind of the last failure recorded ([`ErrorKind::index`]), which
    /// the calls the open breaker skips are told.
    last_failure: AtomicU8,
}

/// Leave to call the backend, handed out by [`Breaker::permit`]. Whoever
/// holds it reports the call's outcome with [`Permit::record`]; a permit
/// dropped unrecorded (its caller's future was dropped mid-call) settles
/// itself: a probe lets the next caller probe at once, so a cancelled probe
/// never leaves the breaker half open with nobody probing.
#[must_use = "a permit records the call's outcome"]
pub(crate) struct Permit<'a> {
    breaker: &'a Breaker,
    /// The number of the probe of an open breaker this is, or 0 for a
    /// call of a closed one.
    probe: u64,
    settled: bool,
}

impl Permit<'_> {
    /// Records the call's outcome: `failed` when the backend itself failed.
    /// Returns the breaker's new state when it changed.
    /// `refused` says a failure was a refused connection: probing a server
    /// that refuses costs under a millisecond, so its probes stay at the
    /// first backoff and a restarted server is used again within it.
    pub(crate) fn record(mut self, failed: bool, refused: bool) -> Option<CircuitState> {
        self.settled = true;
        // A probe overtaken by a later one (its caller left it unpolled
        // past the expiry) reports as any other call does.
        let probe = self.probe != 0 && self.breaker.probe.load(Ordering::Acquire) == self.probe;
        if failed {
            self.breaker.failed(probe, refused)
        } else {
            self.breaker.succeeded(probe)
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe != 0 && !self.settled {
            self.breaker.abandon_probe(self.probe);
        }
    }
}

/// What a call's outcome says of the backend's health, for the breaker:
/// `Some(true)` a failure of the backend itself, `Some(false)` an answer,
/// `None` nothing (a full queue, a configuration fault).
pub(crate) fn failed(result: &Result<impl Sized, Error>) -> Option<bool> {
    match result {
        Ok(_) | Err(Error::ForeignValue { .. }) => Some(false),
        // Taking no writes for now (over `maxmemory`, too few replicas, a
        // failed save), Redis still answers the rest: opened, the breaker
        // would send its denials to the failure policy too.
        #[cfg(feature = "redis")]
        Err(Error::Redis(error)) if crate::error::refuses_writes(error) => Some(false),
        // A key or command the user may not touch is that call's fault, and
        // Redis answered: opened, the breaker would send every other key of
        // the server to the failure policy.
        Err(error) if error.kind() == crate::error::ErrorKind::Permission => Some(false),
        Err(error) if error.is_backend_failure() => Some(true),
        Err(_) => None,
    }
}

/// Counts a backend call's latency and, when it failed, its error by kind.
pub(crate) fn observed<T>(backend: &'static str, started: Instant, result: &Result<T, Error>) {
    crate::metrics::backend_latency(backend, started.elapsed());
    if let Err(error) = result {
        if error.is_backend() {
            crate::metrics::backend_error(backend, error.kind());
        }
    }
}

/// A permit whose call has not settled: dropped so (the call cancelled, or
/// its outcome saying nothing of the backend), it gives up the permit and,
/// for a probe, shows the state the breaker is left in.
struct Unsettled<'a, 'n> {
    permit: Option<Permit<'a>>,
    backend: &'static str,
    node: Option<&'n str>,
}

impl Drop for Unsettled<'_, '_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            let breaker = permit.breaker;
            let probing = permit.probe != 0;
            drop(permit);
            if probing && !breaker.retired.load(Ordering::Acquire) {
                breaker.report_state(self.backend, self.node);
            }
        }
    }
}

impl Breaker {
    /// Runs one call of `backend` (on `node`, for a breaker per node)
    /// through this breaker: skipped with [`Error::CircuitOpen`] while it is
    /// open, timed, and its outcome recorded. A call dropped mid-way (its
    /// caller gave up) records nothing, and a dropped probe lets the next
    /// caller probe.
    pub(crate) async fn guard<T>(
        &self,
        backend: &'static str,
        node: Option<&str>,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let Some(permit) = self.permit() else {
            return Err(self.open());
        };
        self.guard_permitted(permit, backend, node, call).await
    }

    /// [`guard`](Self::guard) under a `permit` already taken: for a call
    /// whose work is handed on (queued for a batch) once it is allowed, and
    /// which must not then be refused by a second ask (another caller may
    /// have taken the probe meanwhile, and the work would go all the same).
    pub(crate) async fn guard_permitted<T>(
        &self,
        permit: Permit<'_>,
        backend: &'static str,
        node: Option<&str>,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let probing = permit.probe != 0;
        if probing && !self.retired.load(Ordering::Acquire) {
            // The probe made the breaker half open: the gauge shows it
            // while the probe is in flight.
            self.report_state(backend, node);
        }
        // A probe that ends without an outcome (its caller gone, or one
        // that says nothing of the backend) leaves the breaker open as it
        // was: the gauge must not stay at half open.
        let mut unsettled = Unsettled {
            permit: Some(permit),
            backend,
            node,
        };
        let started = Instant::now();
        let result = call.await;
        observed(backend, started, &result);
        let Some(failed) = failed(&result) else {
            return result;
        };
        let Some(permit) = unsettled.permit.take() else {
            return result;
        };
        if let (true, Err(error)) = (failed, &result) {
            self.last_failure
                .store(error.kind().index(), Ordering::Release);
        }
        let refused = matches!(&result, Err(error) if error.is_refusal());
        let transition = permit.record(failed, refused);
        if probing && transition.is_none() && !self.retired.load(Ordering::Acquire) {
            // A failed probe leaves the breaker open as it was: the gauge
            // moves back from half open, and nothing is logged (while Redis
            // refuses connections, probes go 50 ms apart).
            self.report_state(backend, node);
        }
        if let Some(state) = transition {
            if self.retired.load(Ordering::Acquire) {
                return result;
            }
            self.report_state(backend, node);
            // Retired meanwhile: its last report must be the one that
            // closes it (see `retire`).
            if self.retired.load(Ordering::Acquire) {
                crate::metrics::circuit_state(backend, node, CircuitState::Closed);
                return result;
            }
            let node = node.unwrap_or("");
            match state {
                CircuitState::Open => tracing::warn!(
                    backend,
                    node,
                    "rate limit backend keeps failing; circuit open, calls skip it until a probe succeeds"
                ),
                _ => tracing::info!(backend, node, "rate limit backend answers again; circuit closed"),
            }
        }
        result
    }

    /// Sets the state gauge to the breaker's state, read after each setting:
    /// a transition that raced the one reported here (a call begun before
    /// the breaker opened, closing it) reports too, and whichever reports
    /// last reads and reports the state left. (Reported as the transition
    /// made, a late report of `Open` could land after the report of the
    /// close that followed it, and show a closed breaker open for good.)
    fn report_state(&self, backend: &'static str, node: Option<&str>) {
        let mut state = self.state();
        loop {
            crate::metrics::circuit_state(backend, node, state);
            let now = self.state();
            if now == state {
                return;
            }
            state = now;
        }
    }

    /// What a call the open breaker skips fails with: the kind of the last
    /// failure recorded.
    pub(crate) fn open(&self) -> Error {
        Error::CircuitOpen {
            cause: ErrorKind::from_index(self.last_failure.load(Ordering::Acquire)),
        }
    }

    /// A breaker for calls made within `timeout` (the limiter's).
    pub(crate) fn new(config: BreakerConfig, timeout: Duration) -> Self {
        Self {
            config,
            epoch: Instant::now(),
            state: AtomicU8::new(CircuitState::Closed as u8),
            failures: AtomicU32::new(0),
            probe_at: AtomicU64::new(0),
            backoff_us: AtomicU64::new(micros(config.initial_backoff)),
            probe: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            probe_started: AtomicU64::new(0),
            probe_expiry_us: micros(timeout).saturating_mul(2).max(1_000),
            retired: AtomicBool::new(false),
            last_failure: AtomicU8::new(ErrorKind::Unavailable.index()),
        }
    }

    /// The limiter no longer calls through this breaker (the cluster node
    /// of `node` is no longer a master): its state is reported closed, and
    /// a call still in flight through it reports nothing more, so that its
    /// gauge does not keep a state nothing would ever clear.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn retire(&self, backend: &'static str, node: &str) {
        self.retired.store(true, Ordering::Release);
        if self.state() != CircuitState::Closed {
            crate::metrics::circuit_state(backend, Some(node), CircuitState::Closed);
        }
    }

    fn now_us(&self) -> u64 {
        micros(self.epoch.elapsed())
    }

    pub(crate) fn state(&self) -> CircuitState {
        match self.state.load(Ordering::Acquire) {
            0 => CircuitState::Closed,
            1 => CircuitState::Open,
            _ => CircuitState::HalfOpen,
        }
    }

    /// Leave to call the backend, or `None` when the call must skip it.
    pub(crate) fn permit(&self) -> Option<Permit<'_>> {
        if self.state.load(Ordering::Acquire) == CircuitState::Closed as u8 {
            return Some(Permit {
                breaker: self,
                probe: 0,
                settled: false,
            });
        }
        let now = self.now_us();
        if now < self.probe_at.load(Ordering::Acquire) {
            return None;
        }
        // No probe in flight, or one in flight past its expiry, whose
        // caller stopped polling it: this call probes.
        let current = self.probe.load(Ordering::Acquire);
        if current != 0
            && now.saturating_sub(self.probe_started.load(Ordering::Acquire)) < self.probe_expiry_us
        {
            return None;
        }
        let probe = self.probes.fetch_add(1, Ordering::AcqRel) + 1;
        // The start before the number, so that whoever sees the number sees
        // its start (seen with an older start, the new probe would look past
        // its time, and be taken over at once). A caller that loses the race
        // below has made the probe in flight look younger: never taken over
        // early.
        self.probe_started.fetch_max(now, Ordering::AcqRel);
        if self
            .probe
            .compare_exchange(current, probe, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return None;
        }
        self.state
            .store(CircuitState::HalfOpen as u8, Ordering::Release);
        Some(Permit {
            breaker: self,
            probe,
            settled: false,
        })
    }

    fn succeeded(&self, probe: bool) -> Option<CircuitState> {
        self.failures.store(0, Ordering::Release);
        if probe || self.state() != CircuitState::Closed {
            self.backoff_us
                .store(micros(self.config.initial_backoff), Ordering::Release);
            self.state
                .store(CircuitState::Closed as u8, Ordering::Release);
            self.probe.store(0, Ordering::Release);
            return Some(CircuitState::Closed);
        }
        None
    }

    fn failed(&self, probe: bool, refused: bool) -> Option<CircuitState> {
        if self.config.failures_to_open == 0 {
            return None;
        }
        // A call begun before the breaker opened says nothing new: only the
        // probe's failure pushes the next probe out and doubles the backoff.
        // (Counted, a burst of calls failing together on one broken
        // connection would hold the breaker open for the longest backoff.)
        if !probe && self.state() != CircuitState::Closed {
            return None;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if probe || failures >= self.config.failures_to_open {
            let backoff = self.backoff_us.load(Ordering::Acquire);
            self.probe_at
                .store(self.now_us().saturating_add(backoff), Ordering::Release);
            let next = if refused {
                micros(self.config.initial_backoff)
            } else {
                backoff
                    .saturating_mul(2)
                    .min(micros(self.config.max_backoff))
            };
            self.backoff_us.store(next.max(1), Ordering::Release);
            let was = self.state.swap(CircuitState::Open as u8, Ordering::AcqRel);
            self.probe.store(0, Ordering::Release);
            // Opened: a failed probe (half open) leaves it open as it was.
            if was == CircuitState::Closed as u8 {
                return Some(CircuitState::Open);
            }
        }
        None
    }

    /// The caller of probe number `probe` went away before the backend
    /// answered: nothing was learnt, so the breaker is open as before and the
    /// next caller probes (unless a later probe took over meanwhile).
    fn abandon_probe(&self, probe: u64) {
        if self.probe.load(Ordering::Acquire) != probe {
            return;
        }
        self.probe_at.store(self.now_us(), Ordering::Release);
        // Only the probe moves the state out of half open, and it is this one.
        let _ = self.state.compare_exchange(
            CircuitState::HalfOpen as u8,
            CircuitState::Open as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        let _ = self
            .probe
            .compare_exchange(probe, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// `duration` in whole microseconds; `u64::MAX` for any longer (a backoff
/// of `Duration::MAX` waits for good rather than wrapping round to none).
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(permit: &Option<Permit<'_>>) -> &'static str {
        match permit {
            None => "skip",
            Some(p) if p.probe != 0 => "probe",
            Some(_) => "call",
        }
    }

    /// A breaker whose probes never outlive their expiry in these tests.
    fn breaker(config: BreakerConfig) -> Breaker {
        Breaker::new(config, Duration::from_secs(3600))
    }

    /// The failure that opens the breaker is the transition its caller
    /// logs; a failed probe, which leaves it open, is none. (Logged too, it
    /// wrote a warning every 50 ms while Redis refused connections.)
    #[test]
    fn a_failed_probe_opens_nothing_anew() {
        let breaker = breaker(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        });
        assert_eq!(
            breaker.permit().unwrap().record(true, true),
            Some(CircuitState::Open)
        );
        for _ in 0..3 {
            // Past the backoff (at least a microsecond).
            std::thread::sleep(Duration::from_millis(2));
            let probe = breaker.permit();
            assert_eq!(kind(&probe), "probe");
            assert_eq!(probe.unwrap().record(true, true), None);
            assert_eq!(breaker.state(), CircuitState::Open);
        }
    }

    #[test]
    fn opens_after_consecutive_failures_and_lets_one_probe_through() {
        let breaker = breaker(BreakerConfig {
            failures_to_open: 2,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        });
        let call = breaker.permit();
        assert_eq!(kind(&call), "call");
        assert_eq!(call.unwrap().record(true, false), None);
        assert_eq!(
            breaker.permit().unwrap().record(true, false),
            Some(CircuitState::Open)
        );
        // Backoff zero: the next caller probes, the one after it skips.
        let probe = breaker.permit();
        assert_eq!(kind(&probe), "probe");
        assert_eq!(kind(&breaker.permit()), "skip");
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        assert_eq!(
            probe.unwrap().record(false, false),
            Some(CircuitState::Closed)
        );
        assert_eq!(kind(&breaker.permit()), "call");
    }

    #[test]
    fn an_open_breaker_skips_the_backend_until_its_backoff_has_passed() {
        let breaker = breaker(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(3600),
        });
        let _ = breaker.permit().unwrap().record(true, false);
        assert_eq!(kind(&breaker.permit()), "skip");
        assert_eq!(breaker.state(), CircuitState::Open);
    }

    /// The longest backoffs a `Duration` holds: the breaker stays open,
    /// where the wait used to wrap round (to a probe at once) or overflow.
    #[test]
    fn a_backoff_of_any_length_keeps_the_breaker_open() {
        for backoff in [Duration::MAX, Duration::from_micros(u64::MAX / 2 + 1)] {
            let breaker = breaker(BreakerConfig {
                failures_to_open: 1,
                initial_backoff: backoff,
                max_backoff: Duration::MAX,
            });
            let _ = breaker.permit().unwrap().record(true, false);
            assert_eq!(kind(&breaker.permit()), "skip", "{backoff:?}");
            assert_eq!(breaker.state(), CircuitState::Open);
        }
    }

    #[test]
    fn a_failed_probe_reopens_with_a_longer_backoff() {
        let breaker = breaker(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::from_secs(3600),
        });
        let _ = breaker.permit().unwrap().record(true, false);
        let probe = breaker.permit();
        assert_eq!(kind(&probe), "probe");
        let _ = probe.unwrap().record(true, false);
        // The doubled backoff (from a 1 µs floor) keeps the breaker open for now.
        assert_eq!(breaker.state(), CircuitState::Open);
    }

    #[test]
    fn failures_of_calls_begun_before_the_breaker_opened_do_not_delay_the_probe() {
        let breaker = breaker(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(3600),
        });
        let late: Vec<_> = (0..10).map(|_| breaker.permit().unwrap()).collect();
        let _ = breaker.permit().unwrap().record(true, false);
        assert_eq!(breaker.state(), CircuitState::Open);
        // Calls that were in flight on the same broken connection fail now.
        for permit in late {
            assert_eq!(permit.record(true, false), None);
        }
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            kind(&breaker.permit()),
            "probe",
            "the first backoff has passed; late failures must not postpone the probe"
        );
    }

    #[test]
    fn a_probe_dropped_unrecorded_lets_the_next_caller_probe_at_once() {
        let breaker = breaker(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::from_secs(3600),
        });
        let _ = breaker.permit().unwrap().record(true, false);
        let probe = breaker.permit();
        assert_eq!(kind(&probe), "probe");
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        drop(probe); // its caller's future was dropped mid-call
        assert_eq!(breaker.state(), CircuitState::Open, "nobody is probing");
        let next = breaker.permit();
        assert_eq!(kind(&next), "probe", "the next caller probes at once");
        assert_eq!(
            next.unwrap().record(false, false),
            Some(CircuitState::Closed)
        );
    }

    /// A probe whose caller keeps its future but stops polling it (pinned
    /// beside a `select!` loop) neither answers nor drops its permit: once
    /// it is in flight past twice the timeout, the next caller probes, and
    /// the stale probe's late report is any call's.
    #[test]
    fn a_probe_left_unpolled_past_its_expiry_is_taken_over() {
        let breaker = Breaker::new(
            BreakerConfig {
                failures_to_open: 1,
                initial_backoff: Duration::ZERO,
                max_backoff: Duration::from_secs(3600),
            },
            // Expiry at 500 ms: what is asked right after a permit is
            // asked well before it, however slowly the thread runs.
            Duration::from_millis(250),
        );
        let _ = breaker.permit().unwrap().record(true, false);
        let stalled = breaker.permit();
        assert_eq!(kind(&stalled), "probe");
        assert_eq!(kind(&breaker.permit()), "skip", "one probe at a time");
        std::thread::sleep(Duration::from_millis(600));
        let next = breaker.permit();
        assert_eq!(kind(&next), "probe", "the stalled probe is taken over");
        assert_eq!(kind(&breaker.permit()), "skip");
        // The stalled probe fails late: not the probe's failure any more.
        assert_eq!(stalled.unwrap().record(true, false), None);
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        assert_eq!(
            next.unwrap().record(false, false),
            Some(CircuitState::Closed)
        );
        // And one dropped after its successor answered changes nothing.
        let _ = breaker.permit().unwrap().record(true, false);
        let stalled = breaker.permit();
        std::thread::sleep(Duration::from_millis(600));
        let next = breaker.permit();
        assert_eq!(kind(&next), "probe");
        drop(stalled);
        assert_eq!(
            kind(&breaker.permit()),
            "skip",
            "the new probe is in flight"
        );
        assert_eq!(breaker.state(), CircuitState::HalfOpen);
        drop(next);
    }

    #[test]
    fn a_refused_connection_keeps_the_probes_at_the_first_backoff() {
        let breaker = breaker(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(3600),
        });
        let _ = breaker.permit().unwrap().record(true, true);
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(300));
            let probe = breaker.permit();
            assert_eq!(
                kind(&probe),
                "probe",
                "a refusal does not double the backoff"
            );
            let _ = probe.unwrap().record(true, true);
        }
        // Other failures double it: 200 ms, then 400 ms.
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(300));
            let _ = breaker.permit().unwrap().record(true, false);
        }
        // Past 200 ms, 150 ms short of 400.
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(
            kind(&breaker.permit()),
            "skip",
            "a timeout doubles the backoff"
        );
    }

    /// A recorder of gauges alone, each made by its function of the key.
    #[cfg(feature = "metrics")]
    struct Gauges<F>(F);

    #[cfg(feature = "metrics")]
    impl<F: Fn(&metrics::Key) -> metrics::Gauge> metrics::Recorder for Gauges<F> {
        fn describe_counter(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_gauge(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn describe_histogram(
            &self,
            _: metrics::KeyName,
            _: Option<metrics::Unit>,
            _: metrics::SharedString,
        ) {
        }
        fn register_counter(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Counter {
            metrics::Counter::noop()
        }
        fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
            (self.0)(key)
        }
        fn register_histogram(
            &self,
            _: &metrics::Key,
            _: &metrics::Metadata<'_>,
        ) -> metrics::Histogram {
            metrics::Histogram::noop()
        }
    }

    /// A call begun before the breaker opened, succeeding just after it
    /// opened, closes it: the gauge must end at the state left, whichever
    /// report lands last. (Reported as each transition made, the report of
    /// `Open` landed after that of the close, and showed the closed breaker
    /// open until its next transition, which a healthy backend never makes.)
    /// Runs `future`, which never waits, to its end.
    #[cfg(feature = "metrics")]
    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        use std::task::{Context, Poll, Waker};
        let mut future = std::pin::pin!(future);
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(value) => value,
            Poll::Pending => unreachable!("nothing here waits"),
        }
    }

    /// While an open breaker's probe is in flight, the gauge shows the
    /// breaker half open (2), as the metric's documentation says. It went
    /// from open to closed, or open again, and never showed 2.
    /// Every value a gauge is set to, in order.
    #[cfg(feature = "metrics")]
    struct Shown(std::sync::Mutex<Vec<f64>>);

    #[cfg(feature = "metrics")]
    impl metrics::GaugeFn for Shown {
        fn increment(&self, _: f64) {}
        fn decrement(&self, _: f64) {}
        fn set(&self, value: f64) {
            self.0.lock().unwrap().push(value);
        }
    }

    /// A breaker opened by one failure (probing 1 ms after), its state gauge
    /// recorded in `Shown` (1.0 so far) by the recorder returned.
    #[cfg(feature = "metrics")]
    fn opened_with_gauge() -> (std::sync::Arc<Shown>, impl metrics::Recorder, Breaker) {
        let shown = std::sync::Arc::new(Shown(std::sync::Mutex::new(Vec::new())));
        let gauge = shown.clone();
        let recorder = Gauges(move |_: &metrics::Key| metrics::Gauge::from_arc(gauge.clone()));
        let breaker = breaker(BreakerConfig {
            failures_to_open: 1,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(1),
        });
        metrics::with_local_recorder(&recorder, || {
            let failed = run(breaker.guard("redis", None, async {
                Err::<(), _>(Error::Timeout(Duration::from_millis(1)))
            }));
            assert!(failed.is_err());
        });
        (shown, recorder, breaker)
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn a_probe_in_flight_shows_the_breaker_half_open() {
        let (shown, recorder, breaker) = opened_with_gauge();
        metrics::with_local_recorder(&recorder, || {
            std::thread::sleep(Duration::from_millis(5));
            let during = run(breaker.guard("redis", None, async {
                Ok::<_, Error>(shown.0.lock().unwrap().last().copied())
            }));
            assert_eq!(during.unwrap(), Some(2.0), "during the probe");
        });
        assert_eq!(*shown.0.lock().unwrap(), [1.0, 2.0, 0.0]);
    }

    /// A probe that ends with no outcome, dropped by its caller or with an
    /// outcome that says nothing of the backend, leaves the breaker open:
    /// the gauge shows it open, not half open.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_probe_that_settles_nothing_shows_the_breaker_open_again() {
        use std::future::Future as _;
        use std::task::{Context, Waker};

        let (shown, recorder, breaker) = opened_with_gauge();
        metrics::with_local_recorder(&recorder, || {
            // A probe whose caller leaves while it waits.
            std::thread::sleep(Duration::from_millis(5));
            let mut probe = std::pin::pin!(breaker.guard(
                "redis",
                None,
                std::future::pending::<Result<(), Error>>()
            ));
            assert!(probe
                .as_mut()
                .poll(&mut Context::from_waker(Waker::noop()))
                .is_pending());
            assert_eq!(shown.0.lock().unwrap().last(), Some(&2.0));
        });
        assert_eq!(breaker.state(), CircuitState::Open);
        assert_eq!(
            shown.0.lock().unwrap().last(),
            Some(&1.0),
            "after the dropped probe"
        );
        metrics::with_local_recorder(&recorder, || {
            // A probe whose outcome says nothing (the limiter's own queue full).
            std::thread::sleep(Duration::from_millis(5));
            let full =
                run(breaker.guard("redis", None, async { Err::<(), _>(Error::Overloaded(1)) }));
            assert!(full.is_err());
        });
        assert_eq!(breaker.state(), CircuitState::Open);
        assert_eq!(
            *shown.0.lock().unwrap(),
            [1.0, 2.0, 1.0, 2.0, 1.0],
            "open, half open while each probe runs, open again"
        );
    }

    #[cfg(feature = "metrics")]
    #[test]
    fn the_state_gauge_ends_at_the_state_left_by_racing_transitions() {
        use std::sync::{Arc, Mutex, OnceLock};

        /// The gauge's last value; on the first report of `Open`, the call
        /// begun before the breaker opened succeeds, and its report lands
        /// first.
        struct Gauge {
            value: Mutex<Option<f64>>,
            breaker: OnceLock<Arc<Breaker>>,
            late_success: Mutex<Option<Permit<'static>>>,
        }
        impl metrics::GaugeFn for Gauge {
            fn increment(&self, _: f64) {}
            fn decrement(&self, _: f64) {}
            fn set(&self, value: f64) {
                if value == CircuitState::Open as u8 as f64 {
                    let late = self.late_success.lock().unwrap().take();
                    if let (Some(permit), Some(breaker)) = (late, self.breaker.get()) {
                        run(breaker
                            .guard_permitted(permit, "redis", None, async { Ok::<_, Error>(()) }))
                        .unwrap();
                    }
                }
                *self.value.lock().unwrap() = Some(value);
            }
        }

        // Leaked, so that the late call's permit may borrow it for good.
        let breaker: &'static Arc<Breaker> =
            Box::leak(Box::new(Arc::new(breaker(BreakerConfig {
                failures_to_open: 1,
                initial_backoff: Duration::from_secs(3600),
                max_backoff: Duration::from_secs(3600),
            }))));
        let gauge = Arc::new(Gauge {
            value: Mutex::new(None),
            breaker: OnceLock::new(),
            late_success: Mutex::new(breaker.permit()),
        });
        let _ = gauge.breaker.set(breaker.clone());
        let shown = gauge.clone();
        let recorder = Gauges(move |_: &metrics::Key| metrics::Gauge::from_arc(shown.clone()));
        metrics::with_local_recorder(&recorder, || {
            let failed = run(breaker.guard("redis", None, async {
                Err::<(), _>(Error::Timeout(Duration::from_millis(1)))
            }));
            assert!(failed.is_err());
        });
        assert_eq!(
            breaker.state(),
            CircuitState::Closed,
            "the late success closed it"
        );
        assert_eq!(
            *gauge.value.lock().unwrap(),
            Some(CircuitState::Closed as u8 as f64),
            "the gauge shows the breaker open"
        );
    }

    /// A call in flight through a breaker the limiter has retired (a
    /// cluster node no longer a master) reports no state when it ends:
    /// nothing would ever clear it.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_retired_breaker_reports_no_state_from_a_call_still_in_flight() {
        use std::collections::HashMap;
        use std::sync::{Arc, Mutex};

        type Seen = Arc<Mutex<HashMap<String, f64>>>;
        struct One(String, Seen);
        impl metrics::GaugeFn for One {
            fn increment(&self, _: f64) {}
            fn decrement(&self, _: f64) {}
            fn set(&self, value: f64) {
                self.1.lock().unwrap().insert(self.0.clone(), value);
            }
        }

        let seen: Seen = Arc::default();
        let into = seen.clone();
        let recorder = Gauges(move |key: &metrics::Key| {
            let node = key
                .labels()
                .find(|label| label.key() == "node")
                .map(|label| label.value().to_owned())
                .unwrap_or_default();
            metrics::Gauge::from_arc(Arc::new(One(node, into.clone())))
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let node = "10.0.0.1:7000";
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                let breaker = breaker(BreakerConfig {
                    failures_to_open: 1,
                    ..BreakerConfig::default()
                });
                let (ended, end) = tokio::sync::oneshot::channel::<()>();
                let call = breaker.guard("cluster", Some(node), async {
                    let _ = end.await;
                    Err::<(), _>(Error::Timeout(Duration::from_millis(1)))
                });
                let retire = async {
                    breaker.retire("cluster", node);
                    let _ = ended.send(());
                };
                let (result, ()) = tokio::join!(call, retire);
                assert!(result.is_err());
                assert_eq!(breaker.state(), CircuitState::Open, "the call failed");
            })
        });
        assert_ne!(
            seen.lock().unwrap().get(node),
            Some(&1.0),
            "a retired breaker's call left its circuit shown open"
        );
    }
}
