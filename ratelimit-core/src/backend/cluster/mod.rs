//! The Redis Cluster backend: the same script, routed by key to the master
//! of its hash slot through redis-rs's async cluster client, which follows
//! MOVED and ASK and refreshes the slot map after a failover.
//!
//! Concurrent single-key decisions are batched per master: each key goes
//! to the queue of the master serving its slot, as a slot map read with
//! `CLUSTER SLOTS` says (read again after a redirect, and every
//! [`REFRESH_EVERY`]), and each queue runs the standalone backend's batching
//! (`run_batches`: the queue bound, the in-flight window, callers gone
//! dropped). A batch is one call of the script flagged
//! `allow-cross-slot-keys` (Redis 7.0 or later), which may touch keys of
//! several slots of the node running it, one slot per command. The call
//! names no key (the batch's keys go in ARGV) and is sent to the master the
//! slot map gives its first key's slot, so Redis never redirects it whole:
//! the node reads every key before it writes any, and when one is not the
//! node's now (the map was stale, or its slot is migrating and the key has
//! left), it writes nothing and names those keys, which are then decided
//! one per call, as below, while the others go again as one batch. The
//! native module, where every node loads it, decides batches the same way
//! (see `ratelimit-module`).
//!
//! Every other call only ever names keys of one slot, so no call can hit
//! CROSSSLOT: a decision alone names one key; an all-or-nothing check whose
//! keys share a slot (a common hash tag, such as `"{user:<id>}:..."`) is one
//! script call; across slots, the dimensions consume in order and what was
//! taken is given back when a later one denies.
//!
//! A script call changes state, so it is sent once: the cluster client's own
//! retries are off, since it would send a call again after an I/O error,
//! when Redis may have run it and only the reply was lost (a decision or a
//! refund applied twice). This backend sends a call again only when the
//! node refused it without running it (`MOVED`, `ASK`, `TRYAGAIN`,
//! `CLUSTERDOWN`, a write to a demoted master), after the client has begun
//! refreshing its slot map; after an `ASK` at once, to the node it names,
//! with `ASKING`.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::oneshot;

use super::redis::{
    await_answer, decode_all, decode_one, Functions, Job, KeySpace, LastFailure, Request,
    MAX_QUEUED, PING_KEY, PING_QUOTA,
};
use crate::algorithm::Refund;
use crate::backend::Deadline;
use crate::breaker::{Breaker, BreakerConfig, CircuitState};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, Error};
use crate::quota::Quota;

mod calls;
mod routing;

pub(crate) use routing::slot;
use routing::Routing;

/// The backend's name in metrics and logs (see `Limiter::backend_name`).
pub(crate) const NAME: &str = "redis-cluster";

pub(crate) struct ClusterBackend {
    client: ClusterClient,
    /// The same, speaking RESP2, once a node refused RESP3 (`resp2_only`).
    client_resp2: ClusterClient,
    resp2_only: AtomicBool,
    /// The first node given, on a connection of its own: a ping asks it
    /// whether it is a cluster node at all.
    seed: redis::Client,
    /// Connected on first use, on the caller's runtime, which runs the
    /// connection's task; made anew once that runtime has shut down. A
    /// failed attempt is retried on the next call.
    connection: RwLock<Option<Connected>>,
    /// One attempt to connect at a time, and how the last one failed.
    connecting: tokio::sync::Mutex<LastFailure>,
    /// The slot map and the masters' queues; none until first read.
    routing: RwLock<Option<Arc<Routing>>>,
    /// When the slot map was last asked for, and how the reads went; one
    /// reader at a time.
    refreshing: tokio::sync::Mutex<routing::Reads>,
    /// Set by a batch that met a key its node does not serve, or a failed
    /// batch: the next decision reads the slot map again.
    stale: Arc<AtomicBool>,
    /// The second (since `epoch`, plus one) in which a call refused by an
    /// open breaker last set `stale`.
    stale_for_open: std::sync::atomic::AtomicU64,
    epoch: Instant,
    /// The second a failed give-back of a check across slots was last
    /// logged in (see `once_a_second`).
    give_back_warned: Arc<std::sync::atomic::AtomicU64>,
    /// Whether the masters run the script as a function.
    functions: Arc<Functions>,
    /// Connections to masters the cluster client keeps none to.
    direct: Arc<calls::Direct>,
    keys: KeySpace,
    timeout: Duration,
    /// A circuit breaker per master, by address, so a dead master sends its
    /// own keys to the failure policy and no others; the one under "" guards
    /// calls made before the slot map is known.
    breakers: std::sync::Mutex<HashMap<String, Arc<Breaker>>>,
    breaker_config: BreakerConfig,
}

/// The cluster connection, and whether the runtime it was made on still
/// runs: a task spawned there holds the other end of `runtime`, and is
/// dropped with that runtime, as the connection's own task is.
struct Connected {
    connection: ClusterConnection,
    runtime: tokio::sync::mpsc::Sender<()>,
}

impl Connected {
    /// The connection, while its runtime runs.
    fn live(&self) -> Option<ClusterConnection> {
        (!self.runtime.is_closed()).then(|| self.connection.clone())
    }
}

/// The dimensions a check across slots has admitted so far: given back by
/// a task of their own if the check is dropped before it settles them (its
/// caller gave up between two dimensions, or its deadline passed). The dimension being decided when
/// the check was dropped may still be applied by its master, as any call
/// already sent is: a check cut short takes at most that one dimension's
/// cost.
struct Taken<'a> {
    backend: &'a ClusterBackend,
    admitted: Vec<Admission>,
}

/// A dimension a check across slots admitted, and when it was asked for:
/// on the caller's clock when the limiter has one (the decisions' clock),
/// else on the monotonic clock.
struct Admission {
    key: String,
    quota: Quota,
    decision: Decision,
    cost: u64,
    at: (Instant, Option<u64>),
}

impl Admission {
    /// The refund that gives it back now, on `backend`'s clock: what a
    /// bucket still holds of it is what it took less what has refilled
    /// since (given back whole, the refund would return tokens others have
    /// taken meanwhile); `None` when nothing is left to give.
    fn refund(self, backend: &ClusterBackend) -> Option<(String, Request)> {
        let now = backend.now();
        let elapsed = match (self.at, now) {
            ((_, Some(at)), Some(now)) => now.saturating_sub(at),
            ((at, _), _) => u64::try_from(at.elapsed().as_micros()).unwrap_or(u64::MAX),
        };
        let refund = Refund::of(&self.quota, &self.decision, self.cost, elapsed, 0)?;
        Some((self.key, Request::refund(&self.quota, &refund, now)))
    }
}

impl Taken<'_> {
    /// Gives back what the dimensions taken so far admitted (as much as
    /// each bucket still holds), on every master at once, on a task of its
    /// own, so that a refund on its way goes on whoever stops waiting for
    /// it: it is neither cut short nor sent twice. The task, unless there is
    /// nothing to give back, or no connection or runtime to give it on.
    fn give_back(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        if self.admitted.is_empty() {
            return None;
        }
        let (Some(connection), Ok(runtime)) = (
            self.backend.live_connection(),
            tokio::runtime::Handle::try_current(),
        ) else {
            return None;
        };
        let (timeout, functions, direct, last_warning) = (
            self.backend.timeout,
            self.backend.functions.clone(),
            self.backend.direct.clone(),
            self.backend.give_back_warned.clone(),
        );
        let refunds: Vec<_> = std::mem::take(&mut self.admitted)
            .into_iter()
            .filter_map(|taken| taken.refund(self.backend))
            .collect();
        // All at once: a master that does not answer holds back no other
        // master's give-back (which, measured before it, would be stale by
        // then).
        Some(runtime.spawn(async move {
            let given = refunds.into_iter().map(|(key, call)| {
                let (connection, functions, direct, last_warning) = (
                    connection.clone(),
                    functions.clone(),
                    direct.clone(),
                    last_warning.clone(),
                );
                async move {
                    let invocation = super::redis::invocation("refund", [(&key, call)]);
                    let given = calls::call_routed(
                        connection,
                        timeout,
                        &functions,
                        &direct,
                        &invocation,
                        &|| true,
                    );
                    // Once a second at most, as the failure policy's
                    // warning: while a master fails, every check across
                    // slots it admitted a dimension of fails to give it
                    // back, and a line each would flood the log.
                    if let Err(error) = given.await {
                        if crate::limiter::report::once_a_second(&last_warning) {
                            tracing::warn!(
                                %key,
                                %error,
                                "could not give back a multi-dimension check's tokens (logged at \
                                 most once a second)"
                            );
                        }
                    }
                }
            });
            futures_util::future::join_all(given).await;
        }))
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// Said of a call made outside any Tokio runtime, or on one shutting down.
const NO_RUNTIME: Error = Error::NoRuntime {
    what: "a Redis Cluster limiter (its connection and batching)",
};

/// Whether the caller runs on a Tokio runtime, which every cluster call
/// needs (its timeouts, the connection's task).
fn on_a_runtime() -> Result<(), Error> {
    tokio::runtime::Handle::try_current()
        .map(|_| ())
        .map_err(|_| NO_RUNTIME)
}

impl ClusterBackend {
    pub(crate) fn new(
        urls: &[String],
        tls: &crate::tls::TlsConfig,
        prefix: String,
        timeout: Duration,
        clock: Option<Arc<dyn Clock>>,
        breaker_config: BreakerConfig,
    ) -> Result<Self, Error> {
        if urls.is_empty() {
            return Err(ConfigError::MissingAddress {
                what: "a Redis Cluster",
                needs: "at least one node URL",
                example: ".cluster([\"redis://10.0.0.1:7000\"])",
            }
            .into());
        }
        let infos = super::redis::parse_each(urls, "Redis Cluster URL")?;
        // Only certificates need it: the client reads `rediss://` itself.
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
        let secure = super::redis::uses_tls(
            infos.iter().any(super::redis::over_tls),
            tls,
            "Redis Cluster URLs",
        )?;
        // A RESP3 connection hears its node close it while idle (`timeout`
        // in redis.conf, `CLIENT KILL`) and is made again at once; over
        // RESP2 the next call sent on it failed unsent. The RESP2 client is
        // for nodes that refuse `HELLO 3` (the command renamed away).
        let build = |protocol: redis::ProtocolVersion| {
            let builder = ClusterClient::builder(urls.to_vec())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .tcp_settings(super::redis::tcp_settings())
                .use_protocol(protocol)
                // Sent once; see the module's documentation and `call`.
                .retries(0);
            #[cfg(feature = "tls")]
            let builder = if secure && tls.is_set() {
                builder.certs(tls.certificates())
            } else {
                builder
            };
            builder.build().map_err(|source| ConfigError::InvalidUrl {
                what: "Redis Cluster URLs",
                urls: urls.iter().map(|u| super::redis::redacted(u)).collect(),
                source,
            })
        };
        let client = build(redis::ProtocolVersion::RESP3)?;
        let client_resp2 = build(redis::ProtocolVersion::RESP2)?;
        let seed = super::redis::open_client(&urls[0], tls)?;
        let direct = Arc::new(calls::Direct::new(seed.get_connection_info().clone()));
        Ok(Self {
            client,
            client_resp2,
            resp2_only: AtomicBool::new(false),
            seed,
            connection: RwLock::new(None),
            connecting: tokio::sync::Mutex::new(LastFailure::default()),
            routing: RwLock::new(None),
            refreshing: tokio::sync::Mutex::new(routing::Reads::default()),
            stale: Arc::new(AtomicBool::new(false)),
            stale_for_open: std::sync::atomic::AtomicU64::new(0),
            epoch: Instant::now(),
            give_back_warned: Arc::default(),
            functions: Arc::new(Functions::default()),
            direct,
            keys: KeySpace { prefix, clock },
            timeout,
            breakers: std::sync::Mutex::new(HashMap::new()),
            breaker_config,
        })
    }

    /// The breaker of the master at `node` ("" before the slot map is known).
    fn breaker(&self, node: &str) -> Arc<Breaker> {
        let mut breakers = self.breakers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(breaker) = breakers.get(node) {
            return breaker.clone();
        }
        let breaker = Arc::new(Breaker::new(self.breaker_config, self.timeout));
        breakers.insert(node.to_owned(), breaker.clone());
        breaker
    }

    /// The worst state among the masters' breakers.
    pub(crate) fn circuit_state(&self) -> CircuitState {
        let breakers = self.breakers.lock().unwrap_or_else(PoisonError::into_inner);
        let states: Vec<CircuitState> = breakers.values().map(|b| b.state()).collect();
        if states.contains(&CircuitState::Open) {
            CircuitState::Open
        } else if states.contains(&CircuitState::HalfOpen) {
            CircuitState::HalfOpen
        } else {
            CircuitState::Closed
        }
    }

    /// Runs `call` for the master at `node` through its breaker.
    async fn guarded<T>(
        &self,
        node: &str,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let breaker = self.breaker(node);
        let Some(permit) = breaker.permit() else {
            return Err(self.circuit_open(&breaker));
        };
        breaker
            .guard_permitted(permit, NAME, Some(node), call)
            .await
    }

    /// A call refused by an open breaker: its master may have been replaced
    /// (a frozen master's replica promoted), which only a new read of the
    /// slot map shows. Only the breaker's probe reaches a master whose
    /// breaker is open, and a probe sent by address to a master that froze
    /// with its connections open times out, not redirected; without this,
    /// its slots stayed with it until the map's periodic read, ten seconds.
    fn circuit_open(&self, breaker: &Breaker) -> Error {
        use std::sync::atomic::Ordering;
        // Once a second at most: a master with no replica to promote keeps
        // its breaker open for as long as it is down, and every call it
        // refuses would have the map read (every `REFRESH_GAP`).
        let second = self.epoch.elapsed().as_secs() + 1;
        if self.stale_for_open.swap(second, Ordering::AcqRel) != second {
            self.stale.store(true, Ordering::Release);
        }
        breaker.open()
    }

    fn live_connection(&self) -> Option<ClusterConnection> {
        self.connection
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(Connected::live)
    }

    /// A new connection of `client`, within the timeout.
    async fn connect(&self, client: &ClusterClient) -> Result<ClusterConnection, Error> {
        tokio::time::timeout(self.timeout, client.get_async_connection())
            .await
            .map_err(|_| Error::Timeout(self.timeout))
            .and_then(|connected| connected.map_err(Error::from))
    }

    async fn connection(&self) -> Result<ClusterConnection, Error> {
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NO_RUNTIME)?;
        let waited_from = Instant::now();
        let mut failed = self.connecting.lock().await;
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        if let Some(error) = failed.since(waited_from) {
            return Err(error);
        }
        let resp2 = self.resp2_only.load(std::sync::atomic::Ordering::Acquire);
        let mut attempt = self
            .connect(if resp2 {
                &self.client_resp2
            } else {
                &self.client
            })
            .await;
        if !resp2 && attempt.as_ref().is_err_and(refused_resp3) {
            self.resp2_only
                .store(true, std::sync::atomic::Ordering::Release);
            attempt = self.connect(&self.client_resp2).await;
        }
        failed.record(&attempt);
        let connection = attempt?;
        let (runtime_alive, mut held) = tokio::sync::mpsc::channel(1);
        runtime.spawn(async move { held.recv().await });
        *self
            .connection
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Connected {
            connection: connection.clone(),
            runtime: runtime_alive,
        });
        Ok(connection)
    }

    /// Sends `del` after `ASKING` to the node the `ASK` redirect `asked`
    /// names, on a connection of this limiter's own (see
    /// [`calls::call_routed`]).
    async fn delete_where_asked(
        &self,
        del: redis::Cmd,
        asked: &redis::RedisError,
    ) -> Result<(), Error> {
        let (host, port) =
            calls::asked_node(asked).ok_or_else(|| Error::UnexpectedReply(format!("{asked}")))?;
        let Some(mut node) = self.direct.connection(&host, port, self.timeout).await else {
            return Err(Error::Timeout(self.timeout));
        };
        let deleted = node.asked::<i64>(del).await;
        if deleted.is_err() {
            self.direct.forget(&host, port);
        }
        deleted?;
        Ok(())
    }

    fn full_key(&self, key: &str) -> String {
        self.keys.full_key(key)
    }

    fn now(&self) -> Option<u64> {
        self.keys.now()
    }

    /// Verifies that this limiter can decide on the cluster now: the first
    /// node is a cluster node, and on every master the connection, the
    /// credentials, TLS, the script and the keys under the prefix work.
    pub(crate) async fn ping(&self) -> Result<(), Error> {
        on_a_runtime()?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let address = self.seed.get_connection_info().addr().to_string();
        let mut seed = tokio::time::timeout(
            self.timeout,
            self.seed
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| Error::Timeout(self.timeout))?
        .map_err(|error| Error::from(error).connecting_to(&address))?;
        let traits = super::redis::hello(&mut seed, self.timeout, false)
            .await
            .map_err(|error| error.connecting_to(&address))?;
        super::redis::check_server(&address, traits, "cluster", false)?;
        // A key of a slot of each master: every master is asked.
        let mut masters: Vec<(u16, u16, String)> = self.read_slots().await?;
        masters.sort_by(|a, b| a.2.cmp(&b.2));
        masters.dedup_by(|a, b| a.2 == b.2);
        for (first, last, _) in masters {
            let key = (0u32..)
                .map(|n| format!("{PING_KEY}:{n}"))
                .find(|key| (first..=last).contains(&slot(self.full_key(key).as_bytes())))
                .unwrap_or_default();
            // Each master within a timeout of its own: a readiness check
            // of many masters is not one decision.
            self.peek(&PING_QUOTA, &key, 0, &Deadline::after(self.timeout))
                .await?;
            // The peek runs only reads: the writes' commands are asked of
            // ACL, on the master of the key's slot.
            let mut connection = self.connection().await?;
            Deadline::after(self.timeout)
                .bound(super::redis::check_commands(
                    &mut connection,
                    &self.full_key(&key),
                ))
                .await?;
        }
        Ok(())
    }

    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        on_a_runtime()?;
        let key = self.full_key(key);
        let request = Request::new(quota, cost, self.now());
        self.decide_request(quota, key, request, deadline).await
    }

    /// Decides `request` on the full key `key`: in its master's next batch,
    /// or alone when the slot map is not known; until `deadline`, which its
    /// master's breaker sees pass.
    async fn decide_request(
        &self,
        quota: &Quota,
        key: String,
        request: Request,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        let routing = self.routing().await;
        let key = match routing.as_ref().and_then(|r| r.node(&key)) {
            Some((node, queue)) => {
                let (reply, answer) = oneshot::channel();
                let job = Job {
                    key,
                    quota: *quota,
                    request,
                    reply,
                };
                let breaker = self.breaker(node);
                // One permit for the queued decision and its answer: asked
                // twice, the second could be refused (another caller took
                // the probe) while the batch sends the decision anyway.
                let Some(permit) = breaker.permit() else {
                    return Err(self.circuit_open(&breaker));
                };
                match queue.try_send(job) {
                    Ok(()) => {
                        // Dropping `answer` (a timeout here, or the caller's
                        // future dropped) tells the batcher not to send this
                        // decision if it has not yet.
                        return breaker
                            .guard_permitted(
                                permit,
                                NAME,
                                Some(node),
                                await_answer(deadline, answer),
                            )
                            .await;
                    }
                    Err(TrySendError::Full(_)) => return Err(Error::Overloaded(MAX_QUEUED)),
                    // The task's runtime shut down: decided alone, and the
                    // next decision makes new queues.
                    Err(TrySendError::Closed(job)) => job.key,
                }
            }
            // No slot map, or no master for the slot: alone, following
            // redirects.
            None => key,
        };
        let requests = [request];
        let alone = self.call("", "each", std::slice::from_ref(&key), &requests, deadline);
        let reply = self.guarded("", alone).await?;
        decode_one(&reply, quota, &request, &key)
    }

    /// The decision a request of `cost` would get now, with nothing written.
    pub(crate) async fn peek(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        on_a_runtime()?;
        let key = self.full_key(key);
        let request = Request::new(quota, cost, self.now());
        let routing = self.routing().await;
        let node = routing
            .as_ref()
            .and_then(|r| r.node(&key))
            .map_or("", |(node, _)| node);
        let reply = self
            .call(
                node,
                "peek",
                std::slice::from_ref(&key),
                &[request],
                deadline,
            )
            .await?;
        decode_one(&reply, quota, &request, &key)
    }

    /// Deletes the state of `keys`: their quotas are whole again. Each goes
    /// to its own slot's master, all at once.
    pub(crate) async fn reset(&self, keys: &[String], deadline: &Deadline) -> Result<(), Error> {
        on_a_runtime()?;
        let resets = keys.iter().map(|key| self.reset_one(key, deadline));
        futures_util::future::join_all(resets)
            .await
            .into_iter()
            .collect()
    }

    /// Deletes `key`'s state.
    async fn reset_one(&self, key: &str, deadline: &Deadline) -> Result<(), Error> {
        let key = self.full_key(key);
        let routing = self.routing().await;
        let node = routing
            .as_ref()
            .and_then(|r| r.node(&key))
            .map_or("", |(node, _)| node);
        // Sent again where a node refused it unrun (the slot moved, or is
        // moving): a `DEL` applied twice deletes nothing more.
        let work = |mut connection: ClusterConnection| async move {
            let mut wait = Duration::from_millis(2);
            loop {
                let mut del = redis::cmd("DEL");
                del.arg(&key);
                match del.query_async::<i64>(&mut connection).await {
                    // The slot is moving and the key is not on its old
                    // master: deleted where it may be now.
                    Err(error)
                        if error.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) =>
                    {
                        return self.delete_where_asked(del, &error).await;
                    }
                    Err(error) if calls::refused_unrun(&error) => {
                        // The client reads the slot map again on a redirect.
                        self.stale.store(true, std::sync::atomic::Ordering::Release);
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_millis(50));
                    }
                    result => return result.map(|_| ()).map_err(Error::from),
                }
            }
        };
        // The connection within a timeout of its own (see `Deadline`), the
        // deletion within the reset's deadline; the master's breaker sees
        // both.
        let reset = async {
            let connection = self.connection().await?;
            deadline.bound(work(connection)).await
        };
        self.guarded(node, reset).await
    }

    /// Gives back what admissions took: one call per key, as the keys may
    /// live on different slots, all at once, so that a master that does not
    /// answer holds up none of the others' until `deadline`.
    pub(crate) async fn refund(
        &self,
        refunds: &[(&Quota, &str, Refund)],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        on_a_runtime()?;
        let now = self.now();
        let routing = self.routing().await;
        let given = refunds.iter().map(|(quota, key, refund)| {
            let key = self.full_key(key);
            let call = Request::refund(quota, refund, now);
            let node = routing
                .as_ref()
                .and_then(|r| r.node(&key))
                .map_or("", |(node, _)| node);
            async move {
                let calls = [call];
                let refund =
                    self.call(node, "refund", std::slice::from_ref(&key), &calls, deadline);
                self.guarded(node, refund).await
            }
        });
        futures_util::future::join_all(given)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map(|_| ())
    }

    /// All or nothing over keys that may live on different slots, within
    /// `deadline`.
    pub(crate) async fn decide_all(
        &self,
        requests: &[(&Quota, &str, u64)],
        deadline: &Deadline,
    ) -> Result<Vec<Decision>, Error> {
        on_a_runtime()?;
        let now = self.now();
        let keys: Vec<String> = requests
            .iter()
            .map(|(_, key, _)| self.full_key(key))
            .collect();
        let calls: Vec<Request> = requests
            .iter()
            .map(|(q, _, c)| Request::new(q, *c, now))
            .collect();
        let first_slot = keys.first().map(|k| slot(k.as_bytes()));
        if keys.iter().all(|k| Some(slot(k.as_bytes())) == first_slot) {
            let routing = self.routing().await;
            let node = routing
                .as_ref()
                .and_then(|r| r.node(&keys[0]))
                .map_or("", |(node, _)| node);
            let reply = self
                .guarded(node, self.call(node, "all", &keys, &calls, deadline))
                .await?;
            return decode_all(&reply, requests, &calls, &keys);
        }
        // Across slots: consume in order; on a denial (or a failure), give
        // back what the earlier dimensions took. They are held by `taken`
        // meanwhile, which gives them back if the check is dropped before
        // it ends (its caller gave up, or the deadline passed).
        let mut taken = Taken {
            backend: self,
            admitted: Vec::new(),
        };
        let mut decisions = Vec::with_capacity(requests.len());
        for (i, ((quota, _, cost), key)) in requests.iter().zip(&keys).enumerate() {
            // Asked for now: what a bucket refills from then on is not
            // this admission's to give back. (Read once the answer came,
            // the instant would count less refilled, and give back more.)
            let asked = (Instant::now(), self.now());
            // In the master's next batch, as a decision alone would be.
            let outcome = self
                .decide_request(quota, key.clone(), calls[i], deadline)
                .await;
            let admitted = matches!(&outcome, Ok(d) if d.allowed);
            if !admitted {
                // Awaited within the deadline, so that a denial found in
                // time is answered as one, and a caller told of it finds
                // the tokens given back (unless the deadline passed first).
                if let Some(refunds) = taken.give_back() {
                    let _ = deadline
                        .bound(async { refunds.await.map_err(|_| NO_RUNTIME) })
                        .await;
                }
            }
            let decision = outcome?;
            if admitted {
                // Given back, as much as it then holds, if a later one
                // denies.
                taken.admitted.push(Admission {
                    key: key.clone(),
                    quota: **quota,
                    decision,
                    cost: *cost,
                    at: asked,
                });
            }
            decisions.push(decision);
            if !admitted {
                // The later dimensions were not asked; report them as not admitted.
                for (quota, _, _) in &requests[i + 1..] {
                    decisions.push(Decision::from_micros(false, quota.capacity(), 0, 0, 0, 0));
                }
                return Ok(decisions);
            }
        }
        // Every dimension admitted: the check stands.
        taken.admitted.clear();
        Ok(decisions)
    }
}

/// Whether the cluster client's first connections failed because a node
/// refused `HELLO 3` (which redis-rs reports inside its own error).
fn refused_resp3(error: &Error) -> bool {
    let Error::Redis(source) = error else {
        return false;
    };
    if crate::error::is_resp3_refusal(source) {
        return true;
    }
    let text = source.to_string().to_ascii_lowercase();
    text.contains("noproto") || (text.contains("unknown command") && text.contains("hello"))
}
