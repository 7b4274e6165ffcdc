//! Script calls on a cluster: routed to a slot's master, batched per node,
//! sent again only when a node refused a call unrun, and given back (a
//! refund) when an all-or-nothing check across slots is denied.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use once_cell::sync::Lazy;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use tokio::sync::mpsc::Sender;

use super::ClusterBackend;
use crate::backend::redis::{
    batch_invocation, decode_one, decode_reply, invocation, invoke, Functions, Job, Request,
    ScriptCall,
};
use crate::backend::Deadline;
use crate::error::Error;

/// The script of every algorithm, flagged so that a call may touch keys of
/// several slots of the node it runs on (a batch): the flag must be the
/// first line. A script of its own, so that standalone Redis older than 7.0,
/// which knows no flags, still runs the unflagged one.
pub(super) static CROSS_SLOT_SCRIPT: Lazy<redis::Script> = Lazy::new(|| {
    redis::Script::new(concat!(
        "#!lua flags=allow-cross-slot-keys\n",
        crate::backend::redis::script_body!(),
        crate::backend::redis::eval_call!()
    ))
});

/// Connections of this limiter's own to masters the cluster client keeps
/// none to: a master that serves no slot yet, which an `ASK` names while
/// the first slot moves to it. Each made with the seed node's user,
/// password and TLS; at most a few.
pub(super) struct Direct {
    seed: redis::ConnectionInfo,
    /// Each with the sending half of a channel whose other half a task on
    /// the connection's runtime holds: closed once that runtime, which runs
    /// the connection, has shut down.
    connections: std::sync::Mutex<HashMap<(String, u16), Kept>>,
}

/// A connection of [`Direct`]'s, and whether its runtime still runs.
type Kept = (MultiplexedConnection, Sender<()>);

/// The most such connections kept: masters being added at one time.
const MAX_DIRECT: usize = 8;

impl Direct {
    pub(super) fn new(seed: redis::ConnectionInfo) -> Self {
        Self {
            seed,
            connections: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// A connection to `host:port` that sends each command after `ASKING`;
    /// `None` when none can be made within `timeout`.
    pub(super) async fn connection(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Option<Asking> {
        let address = (host.to_owned(), port);
        let kept = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&address)
            .filter(|(_, runtime)| !runtime.is_closed())
            .map(|(connection, _)| connection.clone());
        if let Some(connection) = kept {
            return Some(Asking(connection));
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let addr = match self.seed.addr().clone() {
            redis::ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => redis::ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure,
                tls_params,
            },
            _ => redis::ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let client = redis::Client::open(self.seed.clone().set_addr(addr)).ok()?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .ok()?;
        let (alive, mut held) = tokio::sync::mpsc::channel(1);
        runtime.spawn(async move { held.recv().await });
        let mut connections = self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if connections.len() >= MAX_DIRECT {
            connections.clear();
        }
        connections.insert(address, (connection.clone(), alive));
        Some(Asking(connection))
    }

    /// Drops the connection to `host:port`, after a call on it failed.
    pub(super) fn forget(&self, host: &str, port: u16) {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(host.to_owned(), port));
    }
}

/// A connection whose script calls go after `ASKING`, in one pipeline so
/// that nothing else on it takes the `ASKING`, which holds for the next
/// command alone.
pub(super) struct Asking(MultiplexedConnection);

impl Asking {
    /// Sends `command` after `ASKING`, in one pipeline so that nothing else
    /// on the connection takes the `ASKING`; the command's own error, as the
    /// server sent it (a pipeline's error would wrap it, and hide its code).
    pub(super) async fn asked<T: redis::FromRedisValue>(
        &mut self,
        command: redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut asking = redis::pipe();
        asking.cmd("ASKING").ignore().add_command(command);
        let mut replies: Vec<redis::RedisResult<redis::Value>> =
            asking.ignore_errors().query_async(&mut self.0).await?;
        let reply = replies.pop().unwrap_or(Ok(redis::Value::Nil))?;
        Ok(redis::from_redis_value(reply)?)
    }
}

impl redis::aio::ConnectionLike for Asking {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.0.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

impl crate::backend::redis::Connection for Asking {
    async fn send_where(
        &mut self,
        command: redis::Cmd,
        _call: &ScriptCall,
    ) -> redis::RedisResult<redis::Value> {
        self.asked(command).await
    }
}

/// Batch calls in flight at once to one master. Fewer than one Redis gets
/// (`MAX_IN_FLIGHT`): a master answers a third of the decisions, and with as
/// many calls outstanding its batches would carry a third as many decisions
/// each, which is what costs Redis per decision.
pub(super) const NODE_IN_FLIGHT: usize = 2;

impl ClusterBackend {
    /// One script call over keys of one slot, sent again (until
    /// `deadline`) only when a node refused it unrun: to `node`, the master
    /// the limiter's slot map gives them ("" when it gives none), then as
    /// redirects say. The connection is made first, within a timeout of its
    /// own (see [`Deadline`]).
    pub(super) async fn call(
        &self,
        node: &str,
        mode: &str,
        keys: &[String],
        requests: &[Request],
        deadline: &Deadline,
    ) -> Result<Vec<i64>, Error> {
        let connection = self.connection().await?;
        let mut invocation = invocation(mode, keys.iter().zip(requests.iter().copied()));
        if !node.is_empty() {
            invocation.sent_to_node(node);
        }
        let call = call_routed(
            connection,
            self.timeout,
            &self.functions,
            &self.direct,
            &invocation,
            &|| true,
        );
        deadline.bound(call).await
    }
}

/// Runs one script call over keys of one slot, routed by its key, within
/// `timeout`; sent again only when a node refused it unrun, and while
/// `wanted` says its caller still waits: a call sent again after its caller
/// has gone (and the failure policy answered it) would take tokens nobody
/// was told of.
pub(super) async fn call_routed(
    mut connection: ClusterConnection,
    timeout: Duration,
    functions: &Functions,
    direct: &Direct,
    invocation: &ScriptCall,
    wanted: &(dyn Fn() -> bool + Sync),
) -> Result<Vec<i64>, Error> {
    let work = async {
        let mut wait = Duration::from_millis(2);
        let mut sent = false;
        // The call by the client's slot map, once the master the limiter's
        // own named refused it.
        let mut by_slot_map: Option<ScriptCall> = None;
        // Where an `ASK` sent the call: the slot is moving, and the key is
        // already on the new master.
        let mut asked: Option<(String, u16)> = None;
        loop {
            if std::mem::replace(&mut sent, true) && !wanted() {
                return Err(Error::Timeout(timeout));
            }
            let invocation = by_slot_map.as_ref().unwrap_or(invocation);
            if let Some((host, port)) = asked.take() {
                // On a connection of this limiter's own, after `ASKING`.
                // Through the cluster client, a master it keeps no
                // connection to (one added as the slot moves to it, which
                // serves no slot yet) would make it drop and make anew its
                // connections to every node, stalling every master's calls,
                // at each such call.
                if let Some(mut node) = direct.connection(&host, port, timeout).await {
                    match invoke(invocation, &mut node, functions).await {
                        // Refused unrun there too (the move was called off,
                        // say): by the slot map again.
                        Err(error) if refused_unrun(&error) => {}
                        Err(error) => {
                            direct.forget(&host, port);
                            return Err(error.into());
                        }
                        Ok(reply) => return Ok(reply),
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(50));
                continue;
            }
            match invoke(invocation, &mut connection, functions).await {
                // Sent nowhere by the client's own slot map, which falls
                // back to any node it is connected to: it is connected to
                // none (every node is down, or was when it last tried).
                // Each call it cannot send has it begin reconnecting to its
                // initial nodes, so the call is not sent again: sent again
                // until its timeout, each probe of an open breaker would
                // drive several reconnections, each logged by redis-rs.
                Err(error)
                    if error.kind() == redis::ErrorKind::ClusterConnectionNotFound
                        && invocation.by_slot_map().is_none() =>
                {
                    return Err(error.into());
                }
                Err(error) if refused_unrun(&error) => {
                    if let Some(routed) = invocation.by_slot_map() {
                        by_slot_map = Some(routed);
                        continue;
                    }
                    asked = asked_node(&error);
                    if asked.is_some() {
                        continue;
                    }
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
/// A batch the node refused unrun (the cluster is down, the node is no
/// longer a master, or out of memory) is decided key by key. A call that may have run is never
/// sent again: its decisions fail (a `NOPERM` too: a script may meet it at a
/// write, after others).
pub(super) async fn send_node_batch(
    connection: ClusterConnection,
    address: Arc<str>,
    timeout: Duration,
    functions: Arc<Functions>,
    direct: Arc<Direct>,
    stale: Arc<AtomicBool>,
    jobs: Vec<Job>,
) -> bool {
    let mut aside = Vec::new();
    let answered = send_node_batch_with(
        connection, &address, timeout, functions, direct, stale, jobs, &mut aside,
    )
    .await;
    for decided in aside {
        let _ = decided.await;
    }
    answered
}

/// [`send_node_batch`], with the keys found to live elsewhere decided
/// alone in the tasks it adds to `aside`.
#[allow(clippy::too_many_arguments)]
async fn send_node_batch_with(
    connection: ClusterConnection,
    address: &Arc<str>,
    timeout: Duration,
    functions: Arc<Functions>,
    direct: Arc<Direct>,
    stale: Arc<AtomicBool>,
    mut jobs: Vec<Job>,
    aside: &mut Vec<tokio::task::JoinHandle<()>>,
) -> bool {
    for _ in 0..2 {
        // A caller that has gone since (its keys were decided alone first,
        // in the second pass) is not sent: it would consume tokens nobody
        // was answered with.
        jobs.retain(Job::wanted);
        if jobs.len() < 2 {
            break;
        }
        let mut invocation = batch_invocation(
            &CROSS_SLOT_SCRIPT,
            super::routing::slot(jobs[0].key.as_bytes()),
            jobs.iter().map(|job| (&job.key, job.request)),
        );
        invocation.sent_to_node(address);
        let mut node = connection.clone();
        let reply =
            match tokio::time::timeout(timeout, invoke(&invocation, &mut node, &functions)).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(error)) if refused_unrun(&error) => {
                    stale.store(true, Ordering::Release);
                    break;
                }
                // Taking no writes (over `maxmemory`, too few replicas, a
                // failed save): refused before it ran (the flagged script
                // is refused whole), and a denial needs no write. Decided
                // alone, by the script that runs until it writes, denials
                // are answered, and only admissions fail.
                Ok(Err(error)) if crate::error::refuses_writes(&error) => break,
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
                        .map(|job| (&job.quota, &job.request, job.key.as_str())),
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
                // Decided alone, beside the rest, which go again at once: a
                // master that does not answer for the moved keys holds up
                // no others. This batch holds its place in the in-flight
                // window until they are decided too.
                aside.push(tokio::spawn(decide_alone(
                    connection.clone(),
                    None,
                    timeout,
                    functions.clone(),
                    direct.clone(),
                    moved.into_iter().map(|(job, _)| job).collect(),
                )));
                jobs = here.into_iter().map(|(job, _)| job).collect();
            }
            _ => {
                fail(jobs, &Error::UnexpectedReply(format!("{reply:?}")));
                return true;
            }
        }
    }
    decide_alone(
        connection,
        Some(address.clone()),
        timeout,
        functions,
        direct,
        jobs,
    )
    .await;
    true
}

/// Decides each job in a call of its own, concurrently, following
/// redirects; a job whose caller has gone is not sent.
/// `node`: the master the limiter's slot map gives their keys, or `None`
/// for keys found to live elsewhere, which go by the cluster client's map.
pub(super) async fn decide_alone(
    connection: ClusterConnection,
    node: Option<Arc<str>>,
    timeout: Duration,
    functions: Arc<Functions>,
    direct: Arc<Direct>,
    jobs: Vec<Job>,
) {
    let calls: Vec<_> = jobs
        .into_iter()
        .filter(Job::wanted)
        .map(|job| {
            let (connection, functions, direct, node) = (
                connection.clone(),
                functions.clone(),
                direct.clone(),
                node.clone(),
            );
            tokio::spawn(async move {
                let mut invocation = invocation("each", [(&job.key, job.request)]);
                if let Some(node) = &node {
                    invocation.sent_to_node(node);
                }
                let wanted = || job.wanted();
                let result = call_routed(
                    connection,
                    timeout,
                    &functions,
                    &direct,
                    &invocation,
                    &wanted,
                )
                .await
                .and_then(|reply| decode_one(&reply, &job.quota, &job.request, &job.key));
                let _ = job.reply.send(result);
            })
        })
        .collect();
    for call in calls {
        let _ = call.await;
    }
}

/// Fails every job of a batch with `error`.
pub(super) fn fail(jobs: Vec<Job>, error: &Error) {
    for job in jobs {
        let _ = job.reply.send(Err(error.clone()));
    }
}

/// The node (host and port) an `ASK` redirect names; `None` for another
/// error.
pub(super) fn asked_node(redirect: &redis::RedisError) -> Option<(String, u16)> {
    if redirect.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::Ask) {
        return None;
    }
    let (address, _) = redirect.redirect_node()?;
    let (host, port) = address.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// Whether a node refused a call without running it, or the cluster client
/// sent it nowhere (no connection to the master the limiter's map named),
/// so that sending it again cannot apply it twice.
pub(super) fn refused_unrun(error: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as Kind;
    matches!(
        error.kind(),
        redis::ErrorKind::ClusterConnectionNotFound
            | redis::ErrorKind::Server(
                Kind::Moved | Kind::Ask | Kind::TryAgain | Kind::ClusterDown | Kind::ReadOnly
            )
    )
}
