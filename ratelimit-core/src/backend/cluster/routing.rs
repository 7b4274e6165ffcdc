//! The slot map: which master serves each hash slot, read with `CLUSTER
//! SLOTS` and kept until a redirect or its age says to read it again; and a
//! batching lane per master.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use tokio::sync::mpsc;

use super::calls::{send_node_batch, NODE_IN_FLIGHT};
use super::ClusterBackend;
use crate::backend::redis::{run_batches, Job, MAX_QUEUED};
use crate::error::Error;

/// How often the slot map is read again when no redirect asked for it: a
/// slot moved by hand (resharding) is found by its first batch anyway, and
/// this bounds how long batches keep meeting it.
pub(super) const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// The least time between two reads of the slot map: while a slot moves,
/// every batch meeting it asks for one.
pub(super) const REFRESH_GAP: Duration = Duration::from_millis(100);

/// The most time between two reads of the slot map while they fail: the
/// gap doubles from `REFRESH_GAP` up to it. While every node is down, each
/// read has the cluster client try to reconnect to every node.
pub(super) const FAILED_REFRESH_GAP: Duration = Duration::from_secs(1);

/// The reads of the slot map so far, which the reader holds.
#[derive(Default)]
pub(super) struct Reads {
    /// When the last read began or ended.
    last: Option<Instant>,
    /// The reads that failed since the last that did not.
    failures: u32,
    /// When a failed read was last logged: once a second at most.
    logged: Option<Instant>,
}

impl Reads {
    /// The least time after the last read before the next: `REFRESH_GAP`,
    /// doubled for each read that failed since one did not, up to
    /// `FAILED_REFRESH_GAP`.
    fn gap(&self) -> Duration {
        REFRESH_GAP
            .saturating_mul(1 << self.failures.min(8))
            .min(FAILED_REFRESH_GAP)
            .max(REFRESH_GAP)
    }
}

/// Slots no master serves (in the map) have this owner.
pub(super) const NO_NODE: u16 = u16::MAX;

/// Hash slots in a Redis Cluster.
pub(super) const SLOTS: u16 = 16_384;

/// Where each slot's decisions queue, as `CLUSTER SLOTS` said at `read_at`.
pub(super) struct Routing {
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
    pub(super) fn live(&self) -> bool {
        self.lanes.iter().all(|(_, queue)| !queue.is_closed())
    }

    /// The address and the queue of the master serving `key`.
    pub(super) fn node(&self, key: &str) -> Option<(&str, &mpsc::Sender<Job>)> {
        let node = *self.owner.get(usize::from(slot(key.as_bytes())))?;
        self.lanes
            .get(usize::from(node))
            .map(|(address, queue)| (address.as_str(), queue))
    }
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
    /// The slot map, read now when there is none yet, when a batch found it
    /// stale, or when it is older than `REFRESH_EVERY`; `None` when it
    /// cannot be read, and decisions go one per call meanwhile.
    pub(super) async fn routing(&self) -> Option<Arc<Routing>> {
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
    pub(super) async fn refresh(&self, current: Option<Arc<Routing>>) -> Option<Arc<Routing>> {
        let waited_from = Instant::now();
        // With a map in hand, a decision does not wait for another's read.
        let mut last = match &current {
            Some(_) => match self.refreshing.try_lock() {
                Ok(last) => last,
                Err(_) => return current,
            },
            None => self.refreshing.lock().await,
        };
        // `last` is when the last read began or ended: a read that ended
        // while this caller waited answers it too, map or failure, so that
        // callers queued behind nodes that do not answer each wait one
        // timeout rather than one per caller ahead of them.
        // While reads fail, they come further apart (see `Reads::gap`).
        let gap = last.gap();
        if last
            .last
            .is_some_and(|at| at >= waited_from || at.elapsed() < gap)
        {
            return self
                .routing
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
        }
        last.last = Some(Instant::now());
        // Cleared before the read: a redirect met meanwhile asks again.
        self.stale.store(false, Ordering::Release);
        let read = self.read_slots().await;
        last.last = Some(Instant::now());
        let masters = match read {
            Ok(masters) => {
                last.failures = 0;
                masters
            }
            Err(error) => {
                last.failures = last.failures.saturating_add(1);
                if last
                    .logged
                    .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
                {
                    last.logged = Some(Instant::now());
                    tracing::warn!(
                        %error,
                        failed_reads = last.failures,
                        "could not read the Redis Cluster slot map (logged at most once a second)"
                    );
                }
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
            .retain(|node, breaker| {
                let kept = lanes.iter().any(|(address, _)| address == node);
                if !kept {
                    // Its gauge would keep the state it was left in, and an
                    // alert on it would fire while nothing is wrong.
                    breaker.retire(super::NAME, node);
                }
                kept
            });
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
    pub(super) fn spawn_lane(
        &self,
        connection: ClusterConnection,
        address: &str,
    ) -> mpsc::Sender<Job> {
        let (queue, receiver) = mpsc::channel(MAX_QUEUED);
        let (timeout, stale, functions, direct) = (
            self.timeout,
            self.stale.clone(),
            self.functions.clone(),
            self.direct.clone(),
        );
        let master: Arc<str> = Arc::from(address);
        tracing::debug!(master = %address, "batching decisions for a Redis Cluster master");
        // One connection: the cluster client's clones share its one
        // multiplexed connection to each node.
        tokio::spawn(run_batches(
            receiver,
            vec![connection],
            Some(self.stale.clone()),
            NODE_IN_FLIGHT,
            move |connection, jobs| {
                send_node_batch(
                    connection,
                    master.clone(),
                    timeout,
                    functions.clone(),
                    direct.clone(),
                    stale.clone(),
                    jobs,
                )
            },
        ));
        queue
    }

    /// The masters' slot ranges, from `CLUSTER SLOTS`: first slot, last
    /// slot, `ip:port`.
    pub(super) async fn read_slots(&self) -> Result<Vec<(u16, u16, String)>, Error> {
        let work = async {
            let mut connection = self.connection().await?;
            let reply: redis::Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut connection)
                .await?;
            // A master the map names no endpoint for is at the IP its
            // metadata gives, else at the host the map was asked of (any
            // node; all are reached at one host then, the seed's).
            let seed = match self.seed.get_connection_info().addr() {
                redis::ConnectionAddr::Tcp(host, _)
                | redis::ConnectionAddr::TcpTls { host, .. } => host.clone(),
                _ => String::new(),
            };
            parse_slots(&reply, &seed).ok_or_else(|| Error::UnexpectedReply(format!("{reply:?}")))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| Error::Timeout(self.timeout))?
    }
}

/// The masters' slot ranges in a `CLUSTER SLOTS` reply: for each range, its
/// first and last slot and its master's `ip:port` (the first node listed).
/// A master whose endpoint is unknown (null, as under
/// `cluster-preferred-endpoint-type unknown-endpoint`, or empty or `?`) is
/// at the `ip` or `hostname` its entry's metadata gives, else at
/// `seed_host`, the host the map was asked of.
pub(super) fn parse_slots(
    reply: &redis::Value,
    seed_host: &str,
) -> Option<Vec<(u16, u16, String)>> {
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
            let text = |value: &Value| match value {
                Value::BulkString(text) => Some(String::from_utf8_lossy(text).into_owned()),
                Value::SimpleString(text) => Some(text.clone()),
                _ => None,
            };
            let ip = match master.first()? {
                Value::Nil => None,
                value => Some(text(value)?),
            }
            .filter(|ip| !ip.is_empty() && ip != "?")
            .or_else(|| {
                // The metadata: a map, or (RESP2) an array of names and values.
                let pairs: Vec<(&Value, &Value)> = match master.get(3)? {
                    Value::Array(items) => items
                        .chunks_exact(2)
                        .map(|pair| (&pair[0], &pair[1]))
                        .collect(),
                    Value::Map(items) => items.iter().map(|(k, v)| (k, v)).collect(),
                    _ => return None,
                };
                ["ip", "hostname"].into_iter().find_map(|name| {
                    pairs
                        .iter()
                        .find(|(k, _)| text(k).as_deref() == Some(name))
                        .and_then(|(_, v)| text(v))
                        .filter(|v| !v.is_empty() && v != "?")
                })
            })
            .unwrap_or_else(|| seed_host.to_owned());
            let port = match master.get(1)? {
                Value::Int(port) => *port,
                _ => return None,
            };
            Some((start, end, format!("{ip}:{port}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::slot;

    #[test]
    pub(super) fn slots_follow_the_cluster_specification() {
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
