//! The Redis backend: one Lua script holds every algorithm; each call decides
//! for one or more keys atomically, on multiplexed, auto-reconnecting
//! connections.
//!
//! Concurrent decisions are batched: while a few script calls are in flight,
//! the decisions that arrive wait and then go together in the next call (up
//! to [`MAX_BATCH`]), on one of [`BATCH_CONNECTIONS`] connections in turn.
//! All-or-nothing checks join the same batches, each decided on its own
//! within the call (the script's 'runs' mode). With no queue, a decision
//! goes at once, alone.
//! Redis's own work per decision is what bounds throughput, and one script
//! call deciding for many keys costs far less than as many calls.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use once_cell::sync::Lazy;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use crate::algorithm::Refund;
use crate::backend::Deadline;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::Quota;

pub(crate) use batcher::{await_answer, run_batches, Job, MAX_QUEUED};
#[cfg(feature = "cluster")]
pub(crate) use endpoint::parse_each;
#[cfg(feature = "cluster")]
pub(crate) use endpoint::tcp_settings;
pub(crate) use endpoint::{open_client, redacted, Endpoint, KeySpace};
#[cfg(feature = "cluster")]
pub(crate) use script::check_commands;
#[cfg(feature = "cluster")]
pub(crate) use script::Connection;
pub(crate) use script::{invoke, Functions, ScriptCall};
pub(crate) use server::{check_server, hello};
pub(crate) use wire::{decode_one, invocation, Request};
// What the cluster backend shares with this one beyond the above.
use batcher::{send_batch, Check, Work, BATCH_CONNECTIONS, MAX_IN_FLIGHT, NO_RUNTIME};
use sentinel::{watch_switches, Watching};
#[cfg(feature = "cluster")]
pub(crate) use {
    endpoint::{over_tls, uses_tls},
    script::{eval_call, script_body},
    wire::{batch_invocation, decode_all, decode_reply},
};

mod batcher;
mod endpoint;
mod script;
mod sentinel;
mod server;
mod wire;

/// Whether `error` is a replica's refusal of a write.
pub(crate) fn is_read_only(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

/// The connections and the batching task of one Tokio runtime. They live
/// as long as that runtime: when it shuts down, its tasks are dropped, the
/// queue closes, and the next decision makes a new lane on its own runtime.
struct Lane {
    queue: mpsc::Sender<Work>,
    /// For inspections and resets, which go alone.
    connection: ConnectionManager,
    /// The address the connections go to.
    address: redis::ConnectionAddr,
    /// Set when a call failed and the endpoint follows failovers: the next
    /// decision asks the Sentinels where the master is now.
    stale: Arc<AtomicBool>,
    /// Set when the server answered `READONLY`: it is a replica now (a
    /// master demoted behind an address that now leads to another, such as
    /// a DNS name or a proxy), and the connections, which stay open to it,
    /// are made anew, finding the address again.
    demoted: Arc<AtomicBool>,
    /// Whether this master runs the script as a function.
    functions: Arc<Functions>,
    /// The Sentinels' announced switches, and how many this lane has seen:
    /// one more sends the next decision to ask them where the master is.
    switches: Arc<AtomicU64>,
    seen: AtomicU64,
}

impl Lane {
    /// Marks the lane's server demoted when `error` is its `READONLY`.
    fn demoted_if(&self, error: &redis::RedisError) {
        if is_read_only(error) {
            self.demoted.store(true, Ordering::Release);
        }
    }

    fn live(&self) -> bool {
        !self.queue.is_closed()
            && !self.stale.load(Ordering::Acquire)
            && !self.demoted.load(Ordering::Acquire)
            && self.switches.load(Ordering::Acquire) == self.seen.load(Ordering::Acquire)
    }
}

pub(crate) struct RedisBackend {
    endpoint: Endpoint,
    /// Made on first use, inside the caller's Tokio runtime, which the
    /// connection managers and the batching task run on.
    lane: RwLock<Option<Arc<Lane>>>,
    /// One lane is made at a time, and Sentinels are asked at most once per
    /// `RESOLVE_EVERY` after a failure.
    renewing: tokio::sync::Mutex<Renewing>,
    keys: KeySpace,
    timeout: Duration,
    /// Switches the Sentinels announced, counted by a watcher started with
    /// the first lane (and again with the next lane made after its runtime
    /// shut down).
    switches: Arc<AtomicU64>,
    /// Whether a switch watcher runs (see [`Watching`]).
    watching: Arc<AtomicBool>,
    /// Set when a server refused RESP3 (`HELLO 3`, Redis before 6.0): the
    /// connections made from then on speak RESP2.
    resp2_only: AtomicBool,
}

/// What the making of lanes remembers between attempts.
#[derive(Default)]
struct Renewing {
    /// When the Sentinels were last asked.
    last_resolve: Option<std::time::Instant>,
    /// How the last attempt failed.
    failed: LastFailure,
}

/// How the last of a series of attempts made one at a time (to connect)
/// failed, and when it ended. Callers that waited for that attempt take its
/// answer rather than each trying again in turn: behind a server that does
/// not answer, the last of them would wait one timeout per caller before it.
#[derive(Default)]
pub(crate) struct LastFailure(Option<(std::time::Instant, Error)>);

impl LastFailure {
    /// The failure of an attempt that ended after `waited_from`, when the
    /// caller began to wait for its turn.
    pub(crate) fn since(&self, waited_from: std::time::Instant) -> Option<Error> {
        self.0
            .as_ref()
            .filter(|(ended, _)| *ended >= waited_from)
            .map(|(_, error)| error.clone())
    }

    /// Keeps how an attempt that ends now went.
    pub(crate) fn record<T>(&mut self, result: &Result<T, Error>) {
        self.0 = result
            .as_ref()
            .err()
            .map(|error| (std::time::Instant::now(), error.clone()));
    }
}

/// The key a ping reads (under the limiter's prefix), and the quota it reads
/// it with: nothing is written.
pub(crate) const PING_KEY: &str = "ratelimit:ping";
pub(crate) static PING_QUOTA: Lazy<Quota> =
    Lazy::new(|| Quota::per_second(1).expect("1/s is a valid quota"));

/// After a failure on a Sentinel-served master, how often the Sentinels are
/// asked where the master is now.
const RESOLVE_EVERY: Duration = Duration::from_millis(100);

impl RedisBackend {
    pub(crate) fn new(
        endpoint: Endpoint,
        prefix: String,
        timeout: Duration,
        clock: Option<Arc<dyn Clock>>,
    ) -> Self {
        Self {
            endpoint,
            lane: RwLock::new(None),
            renewing: tokio::sync::Mutex::new(Renewing::default()),
            keys: KeySpace { prefix, clock },
            timeout,
            switches: Arc::new(AtomicU64::new(0)),
            watching: Arc::new(AtomicBool::new(false)),
            resp2_only: AtomicBool::new(false),
        }
    }

    /// A new connection manager to `client`; it connects on first use.
    ///
    /// It speaks RESP3 where the server can: a RESP3 connection hears its
    /// server close it (`timeout` in redis.conf, `CLIENT KILL`) and is made
    /// again at once, while a RESP2 one learns of it only by failing the
    /// next call sent on it, which never reached the server.
    fn new_connection(&self, client: &redis::Client) -> Result<ConnectionManager, Error> {
        let resp3;
        let client = if self.resp2_only.load(Ordering::Acquire) {
            client
        } else {
            let info = client.get_connection_info().clone();
            let settings = info
                .redis_settings()
                .clone()
                .set_protocol(redis::ProtocolVersion::RESP3);
            resp3 = redis::Client::open(info.set_redis_settings(settings))?;
            &resp3
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(0)
            .set_max_delay(Duration::from_secs(1));
        ConnectionManager::new_lazy_with_config(client.clone(), config).map_err(Error::from)
    }

    fn current(&self) -> Option<Arc<Lane>> {
        self.lane
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The live lane, or a new one on the caller's runtime when there is none,
    /// its runtime has shut down, or (with Sentinel) a call failed.
    async fn lane(&self) -> Result<Arc<Lane>, Error> {
        match self.current() {
            Some(lane) if lane.live() => Ok(lane),
            // Boxed: the cold path (a Sentinel query) would otherwise make
            // every decision's future as deep and as large as redis-rs's.
            _ => Box::pin(self.renew_lane()).await,
        }
    }

    #[cold]
    async fn renew_lane(&self) -> Result<Arc<Lane>, Error> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NO_RUNTIME)?;
        let waited_from = std::time::Instant::now();
        let mut renewing = self.renewing.lock().await;
        if let Some(error) = renewing.failed.since(waited_from) {
            return Err(error);
        }
        let result = self
            .renew_locked(&runtime, &mut renewing.last_resolve)
            .await;
        renewing.failed.record(&result);
        result
    }

    /// [`renew_lane`](Self::renew_lane), with the lock held.
    async fn renew_locked(
        &self,
        runtime: &tokio::runtime::Handle,
        last_resolve: &mut Option<std::time::Instant>,
    ) -> Result<Arc<Lane>, Error> {
        let current = self.current();
        let stale = match &current {
            Some(lane) if lane.live() => return Ok(lane.clone()),
            Some(lane) if !lane.queue.is_closed() => {
                // Stale: ask the Sentinels, at most once per RESOLVE_EVERY;
                // meanwhile calls go to the master as last known.
                if last_resolve.is_some_and(|at| at.elapsed() < RESOLVE_EVERY) {
                    return Ok(lane.clone());
                }
                Some(lane.clone())
            }
            _ => None,
        };
        *last_resolve = Some(std::time::Instant::now());
        if let Endpoint::Sentinel {
            master, sentinels, ..
        } = &self.endpoint
        {
            if let Some(running) = Watching::start(&self.watching) {
                runtime.spawn(watch_switches(
                    running,
                    sentinels.clone(),
                    master.clone(),
                    Arc::downgrade(&self.switches),
                    self.timeout,
                ));
            }
        }
        // Read before asking: a switch announced meanwhile is seen again.
        let switches = self.switches.load(Ordering::Acquire);
        let asked = self.endpoint.client(self.timeout).await;
        // Counted from the answer: callers that waited for it do not ask
        // again at once.
        *last_resolve = Some(std::time::Instant::now());
        let client = match asked {
            Ok(client) => client,
            // Sentinels that cannot say where the master is stop nothing:
            // calls go on to the master as last known, which answers them
            // while it is still the master (and fails them, for the failure
            // policy to answer, if it is not).
            Err(error) => match stale {
                Some(lane) => {
                    // The switches announced so far were asked about: the
                    // master as last known stands until a call fails or
                    // the Sentinels announce more (the watcher counts one
                    // when it reaches them again), rather than every call
                    // asking the Sentinels that did not answer.
                    lane.seen.store(switches, Ordering::Release);
                    tracing::warn!(
                        %error,
                        master = %lane.address,
                        "the Redis Sentinels did not say where the master is; deciding on the \
                         master as last known"
                    );
                    return Ok(lane);
                }
                // The caller is told: of the faults met on the way, the
                // most severe, naming its Sentinel.
                None => {
                    return Err(match &self.endpoint {
                        Endpoint::Sentinel { sentinels, .. } => {
                            sentinel::most_severe(sentinels, self.timeout, error).await
                        }
                        Endpoint::Fixed(_) => error,
                    })
                }
            },
        };
        let address = client.get_connection_info().addr().clone();
        if let Some(lane) = stale {
            if lane.address == address && !lane.demoted.load(Ordering::Acquire) {
                // The master did not move: its connections reconnect by
                // themselves.
                lane.stale.store(false, Ordering::Release);
                lane.seen.store(switches, Ordering::Release);
                return Ok(lane);
            }
            if lane.address == address {
                tracing::warn!(
                    server = %address,
                    "the Redis server answered as a replica; connecting to its address again"
                );
            } else {
                tracing::warn!(master = %address, "the Redis master moved; deciding on the new one");
            }
        }
        let mut connections = (0..BATCH_CONNECTIONS)
            .map(|_| self.new_connection(&client))
            .collect::<Result<Vec<_>, _>>()?;
        // Before the first decision on a server: it must be what this
        // limiter expects (not a cluster node, not a replica). The
        // connection is made here too, so a refused password or certificate
        // is this call's error rather than a timeout.
        let spoke_resp3 = !self.resp2_only.load(Ordering::Acquire);
        let mut traits = hello(&mut connections[0].clone(), self.timeout, spoke_resp3).await;
        // A server that took `HELLO 3` knows `HELLO`: one that says it does
        // not (`Ok(None)`), or knows no RESP3, refused the connection's
        // first command, and is spoken to in RESP2.
        let refused_resp3 = match &traits {
            Ok(None) => true,
            Ok(Some(_)) => false,
            Err(error) => error.is_resp3_refusal(),
        };
        if spoke_resp3 && refused_resp3 {
            self.resp2_only.store(true, Ordering::Release);
            connections = (0..BATCH_CONNECTIONS)
                .map(|_| self.new_connection(&client))
                .collect::<Result<Vec<_>, _>>()?;
            traits = hello(&mut connections[0].clone(), self.timeout, false).await;
        }
        let traits = traits.map_err(|error| error.connecting_to(&address))?;
        check_server(
            &address.to_string(),
            traits,
            "standalone",
            self.endpoint.follows_failovers(),
        )?;
        let (queue, receiver) = mpsc::channel(MAX_QUEUED);
        let stale = Arc::new(AtomicBool::new(false));
        let demoted = Arc::new(AtomicBool::new(false));
        let functions = Arc::new(Functions::default());
        let lane = Arc::new(Lane {
            queue,
            connection: connections[0].clone(),
            address,
            stale: stale.clone(),
            demoted: demoted.clone(),
            functions: functions.clone(),
            switches: self.switches.clone(),
            seen: AtomicU64::new(switches),
        });
        let on_failure = self.endpoint.follows_failovers().then_some(stale);
        // A batch the master as last known answered says it still is the
        // master (a replica refuses the call): the Sentinels need not be
        // asked, which a failed batch had called for.
        let on_success = on_failure.clone();
        runtime.spawn(run_batches(
            receiver,
            connections,
            on_failure,
            MAX_IN_FLIGHT,
            move |connection, batch| {
                let answered = send_batch(connection, functions.clone(), demoted.clone(), batch);
                let stale = on_success.clone();
                async move {
                    let answered = answered.await;
                    if let (true, Some(stale)) = (answered, stale) {
                        stale.store(false, Ordering::Release);
                    }
                    answered
                }
            },
        ));
        *self.lane.write().unwrap_or_else(PoisonError::into_inner) = Some(lane.clone());
        Ok(lane)
    }

    /// Marks `lane` stale after a failed call, when the endpoint follows
    /// failovers.
    fn failed(&self, lane: &Lane) {
        if self.endpoint.follows_failovers() {
            lane.stale.store(true, Ordering::Release);
        }
    }

    /// Queues `job` for the next batch, without waiting.
    async fn enqueue(&self, job: Work) -> Result<(), Error> {
        let job = match self.lane().await?.queue.try_send(job) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => return Err(Error::Overloaded(MAX_QUEUED)),
            // The runtime shut down since `lane` looked: once more, on a new lane.
            Err(TrySendError::Closed(job)) => job,
        };
        Box::pin(self.renew_lane())
            .await?
            .queue
            .try_send(job)
            .map_err(|e| match e {
                TrySendError::Full(_) => Error::Overloaded(MAX_QUEUED),
                TrySendError::Closed(_) => NO_RUNTIME,
            })
    }

    fn full_key(&self, key: &str) -> String {
        self.keys.full_key(key)
    }

    fn now(&self) -> Option<u64> {
        self.keys.now()
    }

    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            key: self.full_key(key),
            quota: *quota,
            request: Request::new(quota, cost, self.now()),
            reply,
        };
        self.enqueue(Work::One(job)).await?;
        await_answer(deadline, answer).await
    }

    /// Decides for every key at once, admitting all or none, in the next
    /// batch's script call. The keys must be distinct.
    pub(crate) async fn decide_all(
        &self,
        requests: &[(&Quota, &str, u64)],
        deadline: &Deadline,
    ) -> Result<Vec<Decision>, Error> {
        if requests.is_empty() {
            // Nothing to decide: no run of no keys is ever sent.
            return Ok(Vec::new());
        }
        let now = self.now();
        let (reply, answer) = oneshot::channel();
        let check = Check {
            keys: requests
                .iter()
                .map(|(_, key, _)| self.full_key(key))
                .collect(),
            quotas: requests.iter().map(|(quota, _, _)| **quota).collect(),
            requests: requests
                .iter()
                .map(|(quota, _, cost)| Request::new(quota, *cost, now))
                .collect(),
            reply,
        };
        self.enqueue(Work::All(check)).await?;
        await_answer(deadline, answer).await
    }

    /// Runs one script call on `lane`'s connection, until `deadline`; a
    /// failure may mean the master moved.
    async fn call(
        &self,
        lane: &Lane,
        invocation: &ScriptCall,
        connection: &mut ConnectionManager,
        deadline: &Deadline,
    ) -> Result<Vec<i64>, Error> {
        let call = async {
            invoke(invocation, connection, &lane.functions)
                .await
                .map_err(|error| {
                    lane.demoted_if(&error);
                    Error::from(error)
                })
        };
        let reply = deadline.bound(call).await;
        if reply.is_err() {
            self.failed(lane);
        }
        reply
    }
}

impl RedisBackend {
    /// The decision a request of `cost` would get now, with nothing written.
    pub(crate) async fn peek(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
        deadline: &Deadline,
    ) -> Result<Decision, Error> {
        let lane = self.lane().await?;
        let mut connection = lane.connection.clone();
        let key = self.full_key(key);
        let request = Request::new(quota, cost, self.now());
        let invocation = invocation("peek", [(&key, request)]);
        let reply = self
            .call(&lane, &invocation, &mut connection, deadline)
            .await?;
        decode_one(&reply, quota, &request, &key)
    }

    /// Verifies that this limiter can decide on the server now: connected,
    /// authenticated, over TLS where asked, the right kind of server, the
    /// script loaded, and the keys under the prefix (and `TIME`) permitted.
    pub(crate) async fn ping(&self) -> Result<(), Error> {
        let lane = self.lane().await?;
        let mut connection = lane.connection.clone();
        let resp3 = !self.resp2_only.load(Ordering::Acquire);
        let traits = hello(&mut connection, self.timeout, resp3).await?;
        check_server(
            &lane.address.to_string(),
            traits,
            "standalone",
            self.endpoint.follows_failovers(),
        )?;
        let key = self.full_key(PING_KEY);
        let request = Request::new(&PING_QUOTA, 0, self.now());
        let invocation = invocation("peek", [(&key, request)]);
        let reply = self
            .call(
                &lane,
                &invocation,
                &mut connection,
                &Deadline::after(self.timeout),
            )
            .await?;
        decode_one(&reply, &PING_QUOTA, &request, &key)?;
        // The peek runs only reads: the writes' commands are asked of ACL.
        Deadline::after(self.timeout)
            .bound(script::check_commands(&mut connection, &key))
            .await
    }

    /// Gives back what admissions took, in one script call (see
    /// `refund.lua`).
    pub(crate) async fn refund(
        &self,
        refunds: &[(&Quota, &str, Refund)],
        deadline: &Deadline,
    ) -> Result<(), Error> {
        let lane = self.lane().await?;
        let mut connection = lane.connection.clone();
        let now = self.now();
        let keys: Vec<String> = refunds
            .iter()
            .map(|(_, key, _)| self.full_key(key))
            .collect();
        let invocation = invocation(
            "refund",
            keys.iter()
                .zip(refunds)
                .map(|(key, (quota, _, refund))| (key, Request::refund(quota, refund, now))),
        );
        self.call(&lane, &invocation, &mut connection, deadline)
            .await?;
        Ok(())
    }

    /// Deletes the state of `keys`: their quotas are whole again.
    pub(crate) async fn reset(&self, keys: &[String], deadline: &Deadline) -> Result<(), Error> {
        let lane = self.lane().await?;
        let mut connection = lane.connection.clone();
        let mut del = redis::cmd("DEL");
        for key in keys {
            del.arg(self.full_key(key));
        }
        let deleted = async {
            del.query_async::<i64>(&mut connection)
                .await
                .inspect_err(|error| lane.demoted_if(error))
                .map_err(Error::from)
        };
        deadline.bound(deleted).await?;
        Ok(())
    }
}
