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
//! several slots of the node running it, one slot per command: one key of
//! the batch in KEYS routes the call, and the batch's keys go in ARGV. The
//! script reads every key before it writes any; when one is not the node's
//! now (the map was stale, or its slot is migrating), it writes nothing and
//! names those keys, which are then decided one per call, as below, while
//! the others go again as one batch.
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
//! refreshing its slot map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use once_cell::sync::Lazy;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use super::redis::{
    await_answer, batch_invocation, decode_all, decode_one, decode_reply, invocation, invoke,
    run_batches, Functions, Job, KeySpace, Request, ScriptCall, MAX_QUEUED, PING_KEY, PING_QUOTA,
};
use crate::breaker::{Breaker, BreakerConfig, CircuitState};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, Error};
use crate::quota::Quota;

/// The script of every algorithm, flagged so that a call may touch keys of
/// several slots of the node it runs on (a batch): the flag must be the
/// first line. A script of its own, so that standalone Redis older than 7.0,
/// which knows no flags, still runs the unflagged one.
static CROSS_SLOT_SCRIPT: Lazy<redis::Script> = Lazy::new(|| {
    redis::Script::new(concat!(
        "#!lua flags=allow-cross-slot-keys\n",
        super::redis::script_body!(),
        super::redis::eval_call!()
    ))
});

/// How often the slot map is read again when no redirect asked for it: a
/// slot moved by hand (resharding) is found by its first batch anyway, and
/// this bounds how long batches keep meeting it.
const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// The least time between two reads of the slot map: while a slot moves,
/// every batch meeting it asks for one.
const REFRESH_GAP: Duration = Duration::from_millis(100);

/// Batch calls in flight at once to one master. Fewer than one Redis gets
/// (`MAX_IN_FLIGHT`): a master answers a third of the decisions, and with as
/// many calls outstanding its batches would carry a third as many decisions
/// each, which is what costs Redis per decision.
const NODE_IN_FLIGHT: usize = 2;

/// Slots no master serves (in the map) have this owner.
const NO_NODE: u16 = u16::MAX;

/// Where each slot's decisions queue, as `CLUSTER SLOTS` said at `read_at`.
struct Routing {
    /// The index in `lanes` of the master serving each slot.
    owner: Vec<u16>,
    /// Each master's address (`ip:port`, which only tells masters apart:
    /// calls are routed by key) and the queue of its batches.
    lanes: Vec<(String, mpsc::Sender<Job>)>,
    read_at: Instant,
}

impl Routing {
    /// Whether every batching task still runs: they stop with the runtime
    /// they were spawned on.
    fn live(&self) -> bool {
        self.lanes.iter().all(|(_, queue)| !queue.is_closed())
    }

    /// The address and the queue of the master serving `key`.
    fn node(&self, key: &str) -> Option<(&str, &mpsc::Sender<Job>)> {
        let node = *self.owner.get(usize::from(slot(key.as_bytes())))?;
        self.lanes
            .get(usize::from(node))
            .map(|(address, queue)| (address.as_str(), queue))
    }
}

pub(crate) struct ClusterBackend {
    client: ClusterClient,
    /// The first node given, on a connection of its own: a ping asks it
    /// whether it is a cluster node at all.
    seed: redis::Client,
    /// Connected on first use; a failed attempt is retried on the next call.
    connection: tokio::sync::OnceCell<ClusterConnection>,
    /// The slot map and the masters' queues; none until first read.
    routing: RwLock<Option<Arc<Routing>>>,
    /// When the slot map was last asked for; one reader at a time.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    /// Set by a batch that met a key its node does not serve, or a failed
    /// batch: the next decision reads the slot map again.
    stale: Arc<AtomicBool>,
    /// Whether the masters run the script as a function.
    functions: Arc<Functions>,
    keys: KeySpace,
    timeout: Duration,
    /// A circuit breaker per master, by address, so a dead master sends its
    /// own keys to the failure policy and no others; the one under "" guards
    /// calls made before the slot map is known.
    breakers: std::sync::Mutex<HashMap<String, Arc<Breaker>>>,
    breaker_config: BreakerConfig,
}

/// The Redis Cluster hash slot of `key`: CRC16 of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the key.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS
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
        // Only certificates need it: the client reads `rediss://` itself.
        #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
        let secure = super::redis::uses_tls(
            urls.iter().any(|u| u.starts_with("rediss://")),
            tls,
            "Redis Cluster URLs",
        )?;
        let builder = ClusterClient::builder(urls.to_vec())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // Sent once; see the module's documentation and `call`.
            .retries(0);
        #[cfg(feature = "tls")]
        let builder = if secure && tls.is_set() {
            builder.certs(tls.certificates())
        } else {
            builder
        };
        let client = builder.build().map_err(|source| ConfigError::InvalidUrl {
            what: "Redis Cluster URLs",
            urls: urls.iter().map(|u| super::redis::redacted(u)).collect(),
            source,
        })?;
        let seed = super::redis::open_client(&urls[0], tls)?;
        Ok(Self {
            client,
            seed,
            connection: tokio::sync::OnceCell::new(),
            routing: RwLock::new(None),
            refreshing: tokio::sync::Mutex::new(None),
            stale: Arc::new(AtomicBool::new(false)),
            functions: Arc::new(Functions::default()),
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
        let breaker = Arc::new(Breaker::new(self.breaker_config));
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
        breaker.guard("cluster", Some(node), call).await
    }

    async fn connection(&self) -> Result<ClusterConnection, Error> {
        self.connection
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
            .map_err(Error::from)
    }

    fn full_key(&self, key: &str) -> String {
        self.keys.full_key(key)
    }

    fn now(&self) -> Option<u64> {
        self.keys.now()
    }

    /// One script call over keys of one slot, sent again (within the
    /// timeout) only when a node refused it unrun.
    async fn call(
        &self,
        mode: &str,
        keys: &[String],
        requests: &[Request],
    ) -> Result<Vec<i64>, Error> {
        let connection = self.connection().await?;
        let invocation = invocation(mode, keys.iter().zip(requests.iter().copied()));
        call_routed(connection, self.timeout, &self.functions, &invocation).await
    }

    /// The slot map, read now when there is none yet, when a batch found it
    /// stale, or when it is older than `REFRESH_EVERY`; `None` when it
    /// cannot be read, and decisions go one per call meanwhile.
    async fn routing(&self) -> Option<Arc<Routing>> {
        let current = self
            .routing
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match &current {
            Some(routing)
                if routing.live()
                    && routing.read_at.elapsed() < REFRESH_EVERY
                    && !self.stale.load(Ordering::Acquire) =>
            {
                current
            }
            // Boxed: the cold path would make every decision's future as
            // large as redis-rs's.
            _ => Box::pin(self.refresh(current)).await,
        }
    }

    #[cold]
    async fn refresh(&self, current: Option<Arc<Routing>>) -> Option<Arc<Routing>> {
        // With a map in hand, a decision does not wait for another's read.
        let mut last = match &current {
            Some(_) => match self.refreshing.try_lock() {
                Ok(last) => last,
                Err(_) => return current,
            },
            None => self.refreshing.lock().await,
        };
        if last.is_some_and(|at| at.elapsed() < REFRESH_GAP) {
            return self
                .routing
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
        }
        *last = Some(Instant::now());
        // Cleared before the read: a redirect met meanwhile asks again.
        self.stale.store(false, Ordering::Release);
        let masters = match self.read_slots().await {
            Ok(masters) => masters,
            Err(error) => {
                tracing::warn!(%error, "could not read the Redis Cluster slot map");
                return current;
            }
        };
        let connection = self.connection().await.ok()?;
        let mut owner = vec![NO_NODE; usize::from(SLOTS)];
        let mut lanes: Vec<(String, mpsc::Sender<Job>)> = Vec::new();
        for (start, end, address) in masters {
            let index = match lanes.iter().position(|(a, _)| *a == address) {
                Some(index) => index,
                None => {
                    // A master's batching task outlives map reads while it
                    // stays a master and its runtime runs.
                    let kept = current
                        .as_ref()
                        .and_then(|r| r.lanes.iter().find(|(a, _)| *a == address))
                        .filter(|(_, queue)| !queue.is_closed())
                        .map(|(_, queue)| queue.clone());
                    let queue =
                        kept.unwrap_or_else(|| self.spawn_lane(connection.clone(), &address));
                    lanes.push((address, queue));
                    lanes.len() - 1
                }
            };
            let index = u16::try_from(index).unwrap_or(NO_NODE);
            for slot in start..=end.min(SLOTS - 1) {
                owner[usize::from(slot)] = index;
            }
        }
        // A node that is no longer a master (killed, failed over) gets no
        // calls, so its breaker would stay as it was left: forgotten, so the
        // limiter's state is the current masters'.
        self.breakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|node, _| lanes.iter().any(|(address, _)| address == node));
        let routing = Arc::new(Routing {
            owner,
            lanes,
            read_at: Instant::now(),
        });
        *self.routing.write().unwrap_or_else(PoisonError::into_inner) = Some(routing.clone());
        Some(routing)
    }

    /// Starts the batching task of the master at `address`, on the
    /// caller's runtime, and returns its queue.
    fn spawn_lane(&self, connection: ClusterConnection, address: &str) -> mpsc::Sender<Job> {
        let (queue, receiver) = mpsc::channel(MAX_QUEUED);
        let (timeout, stale, functions) =
            (self.timeout, self.stale.clone(), self.functions.clone());
        tracing::debug!(master = %address, "batching decisions for a Redis Cluster master");
        // One connection: the cluster client's clones share its one
        // multiplexed connection to each node.
        tokio::spawn(run_batches(
            receiver,
            vec![connection],
            Some(self.stale.clone()),
            NODE_IN_FLIGHT,
            move |connection, jobs| {
                send_node_batch(connection, timeout, functions.clone(), stale.clone(), jobs)
            },
        ));
        queue
    }

    /// The masters' slot ranges, from `CLUSTER SLOTS`: first slot, last
    /// slot, `ip:port`.
    async fn read_slots(&self) -> Result<Vec<(u16, u16, String)>, Error> {
        let work = async {
            let mut connection = self.connection().await?;
            let reply: redis::Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut connection)
                .await?;
            parse_slots(&reply).ok_or_else(|| Error::UnexpectedReply(format!("{reply:?}")))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
    }

    /// Verifies that this limiter can decide on the cluster now: the first
    /// node is a cluster node, and on every master the connection, the
    /// credentials, TLS, the script and the keys under the prefix work.
    pub(crate) async fn ping(&self) -> Result<(), Error> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let mut seed = tokio::time::timeout(
            self.timeout,
            self.seed
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| Error::Timeout(self.timeout))??;
        let address = self.seed.get_connection_info().addr().to_string();
        let traits = super::redis::hello(&mut seed, self.timeout).await?;
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
            self.peek(&PING_QUOTA, &key, 0).await?;
        }
        Ok(())
    }

    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let key = self.full_key(key);
        let request = Request::new(quota, cost, self.now());
        self.decide_request(quota, key, request).await
    }

    /// Decides `request` on the full key `key`: in its master's next batch,
    /// or alone when the slot map is not known.
    async fn decide_request(
        &self,
        quota: &Quota,
        key: String,
        request: Request,
    ) -> Result<Decision, Error> {
        let cost = request.cost;
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
                let Some(permit) = breaker.permit() else {
                    return Err(Error::CircuitOpen);
                };
                drop(permit);
                match queue.try_send(job) {
                    Ok(()) => {
                        // Dropping `answer` (a timeout here, or the caller's
                        // future dropped) tells the batcher not to send this
                        // decision if it has not yet.
                        return breaker
                            .guard("cluster", Some(node), await_answer(self.timeout, answer))
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
        let reply = self
            .guarded(
                "",
                self.call("each", std::slice::from_ref(&key), &[request]),
            )
            .await?;
        decode_one(&reply, quota, cost, &key)
    }

    /// The decision a request of `cost` would get now, with nothing written.
    pub(crate) async fn peek(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let key = self.full_key(key);
        let reply = self
            .call(
                "peek",
                std::slice::from_ref(&key),
                &[Request::new(quota, cost, self.now())],
            )
            .await?;
        decode_one(&reply, quota, cost, &key)
    }

    /// Deletes `key`'s state: its quota is whole again.
    pub(crate) async fn reset(&self, key: &str) -> Result<(), Error> {
        let work = async {
            let mut connection = self.connection().await?;
            redis::cmd("DEL")
                .arg(self.full_key(key))
                .query_async::<i64>(&mut connection)
                .await
                .map_err(Error::from)
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| Error::Timeout(self.timeout))??;
        Ok(())
    }

    /// All or nothing over keys that may live on different slots.
    pub(crate) async fn decide_all(
        &self,
        requests: &[(&Quota, &str, u64)],
    ) -> Result<Vec<Decision>, Error> {
        let now = self.now();
        let keys: Vec<String> = requests
            .iter()
            .map(|(_, key, _)| self.full_key(key))
            .collect();
        // Across slots a dimension may be refunded: its sliding-log
        // admissions carry a tag the refund removes them by.
        let calls: Vec<Request> = requests
            .iter()
            .map(|(q, _, c)| Request::tagged(q, *c, now, refund_tag()))
            .collect();
        let first_slot = keys.first().map(|k| slot(k.as_bytes()));
        if keys.iter().all(|k| Some(slot(k.as_bytes())) == first_slot) {
            let routing = self.routing().await;
            let node = routing
                .as_ref()
                .and_then(|r| r.node(&keys[0]))
                .map_or("", |(node, _)| node);
            let reply = self.guarded(node, self.call("all", &keys, &calls)).await?;
            return decode_all(&reply, requests, &keys);
        }
        // Across slots: consume in order; on a denial (or a failure), give
        // back what the earlier dimensions took.
        let mut decisions = Vec::with_capacity(requests.len());
        for (i, ((quota, _, _), key)) in requests.iter().zip(&keys).enumerate() {
            // In the master's next batch, as a decision alone would be.
            let outcome = self.decide_request(quota, key.clone(), calls[i]).await;
            let admitted = matches!(&outcome, Ok(d) if d.allowed);
            if !admitted {
                for j in 0..i {
                    if decisions.get(j).is_some_and(|d: &Decision| d.allowed) {
                        // A refund that fails leaves the dimension consumed:
                        // it under-admits, never over-admits.
                        if let Err(error) = self.call("refund", &keys[j..=j], &calls[j..=j]).await {
                            tracing::warn!(key = %keys[j], %error, "could not give back a multi-dimension check's tokens");
                        }
                    }
                }
            }
            let decision = outcome?;
            decisions.push(decision);
            if !admitted {
                // The later dimensions were not asked; report them as not admitted.
                for (quota, _, _) in &requests[i + 1..] {
                    decisions.push(Decision::from_micros(false, quota.capacity(), 0, 0, 0, 0));
                }
                return Ok(decisions);
            }
        }
        Ok(decisions)
    }
}

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16_384;

/// Runs one script call over keys of one slot, routed by its key, within
/// `timeout`; sent again only when a node refused it unrun.
async fn call_routed(
    mut connection: ClusterConnection,
    timeout: Duration,
    functions: &Functions,
    invocation: &ScriptCall,
) -> Result<Vec<i64>, Error> {
    let work = async {
        let mut wait = Duration::from_millis(2);
        loop {
            match invoke(invocation, &mut connection, functions).await {
                Err(error) if refused_unrun(&error) => {
                    // The slot map is being refreshed (the client starts
                    // that on a redirect); give it a moment.
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(50));
                }
                result => return Ok::<Vec<i64>, Error>(result?),
            }
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| Error::Timeout(timeout))?
}

/// Sends one batch of decisions whose keys the slot map puts on one master,
/// and hands each caller its decision; whether the node answered. Keys the
/// node turns out not to serve are decided alone and the rest go again
/// once as a batch: the script wrote nothing, so nothing is applied twice.
/// A batch the node refused unrun (the routing key moved, the cluster is
/// down) is decided key by key. A call that may have run is never sent
/// again: its decisions fail.
async fn send_node_batch(
    connection: ClusterConnection,
    timeout: Duration,
    functions: Arc<Functions>,
    stale: Arc<AtomicBool>,
    mut jobs: Vec<Job>,
) -> bool {
    for _ in 0..2 {
        if jobs.len() < 2 {
            break;
        }
        let invocation = batch_invocation(
            &CROSS_SLOT_SCRIPT,
            &jobs[0].key,
            jobs.iter().map(|job| (&job.key, job.request)),
        );
        let mut node = connection.clone();
        let reply =
            match tokio::time::timeout(timeout, invoke(&invocation, &mut node, &functions)).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(error)) if refused_unrun(&error) => {
                    stale.store(true, Ordering::Release);
                    break;
                }
                Ok(Err(error)) => {
                    fail(jobs, &Error::from(error));
                    return false;
                }
                Err(_) => {
                    fail(jobs, &Error::Timeout(timeout));
                    return false;
                }
            };
        match reply.split_first() {
            Some((0, answers)) => {
                let decoded = decode_reply(
                    answers,
                    jobs.iter()
                        .map(|job| (&job.quota, job.request.cost, job.key.as_str())),
                );
                match decoded {
                    Ok(results) => {
                        for (job, result) in jobs.into_iter().zip(results) {
                            // The caller may have timed out and gone.
                            let _ = job.reply.send(result);
                        }
                    }
                    Err(error) => fail(jobs, &error),
                }
                return true;
            }
            Some((&count, indexes))
                if count > 0
                    && indexes.len() == count as usize
                    && indexes.iter().all(|&i| i >= 1 && i as usize <= jobs.len()) =>
            {
                stale.store(true, Ordering::Release);
                let mut elsewhere = vec![false; jobs.len()];
                for &i in indexes {
                    elsewhere[i as usize - 1] = true;
                }
                let (moved, here): (Vec<_>, Vec<_>) = jobs
                    .into_iter()
                    .zip(elsewhere)
                    .partition(|(_, elsewhere)| *elsewhere);
                // Decided alone first, then the rest go again: this batch
                // holds its place in the in-flight window meanwhile.
                decide_alone(
                    connection.clone(),
                    timeout,
                    functions.clone(),
                    moved.into_iter().map(|(job, _)| job).collect(),
                )
                .await;
                jobs = here.into_iter().map(|(job, _)| job).collect();
            }
            _ => {
                fail(jobs, &Error::UnexpectedReply(format!("{reply:?}")));
                return true;
            }
        }
    }
    decide_alone(connection, timeout, functions, jobs).await;
    true
}

/// Decides each job in a call of its own, concurrently, following
/// redirects; a job whose caller has gone is not sent.
async fn decide_alone(
    connection: ClusterConnection,
    timeout: Duration,
    functions: Arc<Functions>,
    jobs: Vec<Job>,
) {
    let calls: Vec<_> = jobs
        .into_iter()
        .filter(Job::wanted)
        .map(|job| {
            let (connection, functions) = (connection.clone(), functions.clone());
            tokio::spawn(async move {
                let invocation = invocation("each", [(&job.key, job.request)]);
                let result = call_routed(connection, timeout, &functions, &invocation)
                    .await
                    .and_then(|reply| decode_one(&reply, &job.quota, job.request.cost, &job.key));
                let _ = job.reply.send(result);
            })
        })
        .collect();
    for call in calls {
        let _ = call.await;
    }
}

/// Fails every job of a batch with `error`.
fn fail(jobs: Vec<Job>, error: &Error) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

/// The masters' slot ranges in a `CLUSTER SLOTS` reply: for each range, its
/// first and last slot and its master's `ip:port` (the first node listed).
fn parse_slots(reply: &redis::Value) -> Option<Vec<(u16, u16, String)>> {
    use redis::Value;
    let Value::Array(ranges) = reply else {
        return None;
    };
    ranges
        .iter()
        .map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let number = |value: &Value| match value {
                Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (start, end) = (number(fields.first()?)?, number(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let ip = match master.first()? {
                Value::BulkString(ip) => String::from_utf8_lossy(ip).into_owned(),
                Value::SimpleString(ip) => ip.clone(),
                _ => return None,
            };
            let port = match master.get(1)? {
                Value::Int(port) => *port,
                _ => return None,
            };
            Some((start, end, format!("{ip}:{port}")))
        })
        .collect()
}

/// Whether a node refused a call without running it, so that sending it
/// again cannot apply it twice.
fn refused_unrun(error: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as Kind;
    matches!(
        error.kind(),
        redis::ErrorKind::Server(
            Kind::Moved | Kind::Ask | Kind::TryAgain | Kind::ClusterDown | Kind::ReadOnly
        )
    )
}

/// A tag unique to one request, below 2^53 (Lua's doubles hold it exactly)
/// and never 0 (no tag).
fn refund_tag() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: once_cell::sync::Lazy<u64> =
        once_cell::sync::Lazy::new(|| RandomState::new().hash_one(std::process::id()));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (RandomState::new().hash_one((*SEED, n)) & ((1 << 53) - 1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    fn slots_follow_the_cluster_specification() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(
            slot(b"foo{}{bar}"),
            slot(b"foo{}{bar}"),
            "an empty tag hashes the whole key"
        );
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }
}
