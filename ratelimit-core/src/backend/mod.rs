//! Where bucket state lives.

#[cfg(feature = "cluster")]
pub(crate) mod cluster;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

#[cfg(feature = "redis")]
use std::future::Future;
#[cfg(feature = "redis")]
use std::pin::Pin;

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
    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        match self {
            Backend::Memory(memory) => Ok(memory.decide(quota, key, cost)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.decide(quota, key, cost));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.decide(quota, key, cost));
                call.await
            }
        }
    }

    /// Decides for every request in one atomic step, admitting all or none.
    /// The keys must be distinct.
    pub(crate) async fn decide_all(
        &self,
        requests: &[(&Quota, &str, u64)],
    ) -> Result<Vec<Decision>, Error> {
        match self {
            Backend::Memory(memory) => Ok(memory.decide_all(requests)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.decide_all(requests));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.decide_all(requests));
                call.await
            }
        }
    }

    /// The decision a request would get now, with nothing written.
    pub(crate) async fn peek(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        match self {
            Backend::Memory(memory) => Ok(memory.peek(quota, key, cost)),
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.peek(quota, key, cost));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.peek(quota, key, cost));
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
    pub(crate) async fn refund(&self, refunds: &[(&Quota, &str, Refund)]) -> Result<(), Error> {
        match self {
            Backend::Memory(memory) => {
                for (quota, key, refund) in refunds {
                    memory.refund(quota, key, refund);
                }
                Ok(())
            }
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.refund(refunds));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.refund(refunds));
                call.await
            }
        }
    }

    /// Deletes a key's state.
    pub(crate) async fn reset(&self, key: &str) -> Result<(), Error> {
        match self {
            Backend::Memory(memory) => {
                memory.reset(key);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Backend::Redis(redis) => {
                let call: Remote<'_, _> = Box::pin(redis.reset(key));
                call.await
            }
            #[cfg(feature = "cluster")]
            Backend::Cluster(cluster) => {
                let call: Remote<'_, _> = Box::pin(cluster.reset(key));
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
            Backend::Cluster(_) => "redis-cluster",
        }
    }
}
