//! Where bucket state lives.

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

use std::future::Future;
#[cfg(feature = "redis")]
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use crate::algorithm::Refund;
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::Quota;

/// A remote backend's call, boxed as a `dyn Future`: a network round trip
/// dwarfs the allocation, and the box keeps the pipeline's future small and
/// its type shallow, so that the future of a caller holding a check (an axum
/// handler's, a spawned task's) is `Send`-checked without walking redis-rs's
/// types, which would pass the compiler's recursion limit.
#[cfg(feature = "redis")]
type Remote<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// When one operation of the limiter (a check, a refund, an inspection, a
/// reset) must have its backend's answer: the limiter's timeout after its
/// first wait, however many calls it makes (a wait for another caller's
/// answer and then a call of its own, a check across Redis Cluster slots, a
/// refund of keys on several masters; a leased request whose lease is
/// refused asks for its own cost within a deadline of its own, as the
/// backend has just answered, and so does the shadow half of a mixed
/// check). Connections, a Sentinel's answer
/// and a Cluster's slot map are made with timeouts of their own, not the
/// operation's: one cut short would keep none of its progress, and the
/// next operation would start it again. Read from the clock only when a
/// wait begins, so an answer given in process never reads it.
pub(crate) struct Deadline {
    timeout: Duration,
    at: OnceLock<Option<tokio::time::Instant>>,
    /// Set once, by [`renew`](Self::renew): the instant that replaces `at`.
    renewed: OnceLock<Option<tokio::time::Instant>>,
}

impl Deadline {
    /// A deadline `timeout` after the first wait it bounds.
    pub(crate) fn after(timeout: Duration) -> Self {
        Self {
            timeout,
            at: OnceLock::new(),
            renewed: OnceLock::new(),
        }
    }

    /// The instant, set now if no wait has begun (`None`: too far to name).
    pub(crate) fn at(&self) -> Option<tokio::time::Instant> {
        if let Some(renewed) = self.renewed.get() {
            return *renewed;
        }
        *self
            .at
            .get_or_init(|| tokio::time::Instant::now().checked_add(self.timeout))
    }

    /// Moves the deadline to one timeout from now, once: for a caller that
    /// waited for another caller's call past that call's time (see the deny
    /// cache's probes), whose own call would otherwise have what is left,
    /// which a backend that is only slow may not answer within. Whether it
    /// was moved now.
    pub(crate) fn renew(&self) -> bool {
        self.renewed
            .set(tokio::time::Instant::now().checked_add(self.timeout))
            .is_ok()
    }

    /// The timeout it was made with.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The error of a wait cut short by this deadline.
    pub(crate) fn timed_out(&self) -> Error {
        Error::Timeout(self.timeout)
    }

    /// Whether the deadline has passed (it is set now if no wait began).
    pub(crate) fn has_passed(&self) -> bool {
        self.at()
            .is_some_and(|at| at <= tokio::time::Instant::now())
    }

    /// `call`'s outcome, or [`Error::Timeout`] once the deadline passes
    /// (`call` is then dropped, as a caller's future may be at any await).
    /// Off a Tokio runtime `call` runs unbounded: it fails at once with
    /// [`Error::NoRuntime`], as every remote backend needs one.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) async fn bound<T>(
        &self,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match self.at() {
            Some(at) if tokio::runtime::Handle::try_current().is_ok() => {
                tokio::time::timeout_at(at, call)
                    .await
                    .unwrap_or_else(|_| Err(self.timed_out()))
            }
            _ => call.await,
        }
    }
}

/// The backends, dispatched by `match`: the memory backend answers inline,
/// with no allocation (see [`Remote`] for the others).
pub(crate) enum Backend {
    Memory(memory::MemoryBackend),
    #[cfg(feature = "redis")]
    Redis(Box<redis::RedisBackend>),
    #[cfg(feature = "cluster")]
    Cluster(Box<cluster::ClusterBackend>),
}

impl Backend {
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        match self {
            Backend::Memory(memory) => Ok(memory.decide(quota, key, cost)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.decide(quota, key, cost, deadline));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.decide(quota, key, cost, deadline));
                call.await
            }
        }
    }

    /// Decides for every request in one atomic step, admitting all or none.
    /// The keys must be distinct.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn decide_all(
        &self,
        requests: &[(&Quota, &str, u64)],
        deadline: &Deadline,
    ) -> Result<Vec<Decision>, Error> {
        match self {
            Backend::Memory(memory) => Ok(memory.decide_all(requests)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.decide_all(requests, deadline));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.decide_all(requests, deadline));
                call.await
            }
        }
    }

    /// The decision a request would get now, with nothing written.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn peek(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        match self {
            Backend::Memory(memory) => Ok(memory.peek(quota, key, cost)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.peek(quota, key, cost, deadline));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.peek(quota, key, cost, deadline));
                call.await
            }
        }
    }

    /// Whether the backend keeps a circuit breaker per node (Redis
    /// Cluster): then the limiter's own breaker stays out of its calls.
    pub(crate) fn guards_nodes(&self) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Backend::Cluster(_) => true,
            _ => false,
        }
    }

    /// The worst state among the backend's own breakers, if it keeps any.
    pub(crate) fn circuit_state(&self) -> Option<crate::breaker::CircuitState> {
        match self {
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => Some(cluster.circuit_state()),
            _ => None,
        }
    }

    /// Verifies that decisions can be made now (see [`Limiter::ping`](crate::Limiter::ping)).
    pub(crate) async fn ping(&self) -> Result<(), Error> {
        match self {
            Backend::Memory(_) => Ok(()),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.ping());
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.ping());
                call.await
            }
        }
    }

    /// Gives back what admissions took (see [`Refund`]).
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn refund(
        &self,
        refunds: &[(&Quota, &str, Refund)],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        match self {
            Backend::Memory(memory) => {
                for (quota, key, refund) in refunds {
                    memory.refund(quota, key, refund);
                }
                Ok(())
            }
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.refund(refunds, deadline));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.refund(refunds, deadline));
                call.await
            }
        }
    }

    /// Deletes the state of `keys`.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) async fn reset(&self, keys: &[String], deadline: &Deadline) -> Result<(), Error> {
        match self {
            Backend::Memory(memory) => {
                for key in keys {
                    memory.reset(key);
                }
                Ok(())
            }
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.reset(keys, deadline));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.reset(keys, deadline));
                call.await
            }
        }
    }

    /// The memory backend, which decides in this process.
    pub(crate) fn memory(&self) -> Option<&memory::MemoryBackend> {
        match self {
            Backend::Memory(memory) => Some(memory),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Whether calls can fail (and so go through the circuit breaker).
    pub(crate) fn can_fail(&self) -> bool {
        self.memory().is_none()
    }

    pub(crate) fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            #[cfg(feature = "redis")]
            Backend::Redis(_) => "redis",
            #[cfg(feature = "cluster")]
            Backend::Cluster(_) => cluster::NAME,
        }
    }
}
