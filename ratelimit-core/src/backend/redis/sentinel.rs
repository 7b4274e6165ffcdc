//! Following a Sentinel-managed master through switchovers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::RESOLVE_EVERY;

/// The longest wait between two rounds of the Sentinels while none of them
/// can be subscribed to.
const MAX_WATCH_WAIT: Duration = Duration::from_secs(5);

/// A switch watcher that runs: dropped when the watcher ends, or with the
/// watcher when its runtime shuts down, so that the next lane, made on
/// another runtime, starts a watcher anew.
pub(super) struct Watching(Arc<AtomicBool>);

impl Watching {
    /// Marks a watcher as running, unless one is.
    pub(super) fn start(running: &Arc<AtomicBool>) -> Option<Self> {
        (!running.swap(true, Ordering::AcqRel)).then(|| Self(running.clone()))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Follows the Sentinels' `+switch-master` announcements of `master`, as
/// Redis's guidelines for Sentinel clients ask, so a switchover moves the
/// decisions to the new master at once, without waiting for a failure on
/// the old one (which a manual failover leaves answering for seconds). Each
/// announcement, and each new subscription (a switch may have been missed
/// while none was held), bumps `switches`; lanes made before then ask the
/// Sentinels again. Ends once the backend is gone.
pub(super) async fn watch_switches(
    _running: Watching,
    sentinels: Vec<redis::Client>,
    master: String,
    switches: std::sync::Weak<AtomicU64>,
    timeout: Duration,
) {
    use futures_util::StreamExt as _;
    let bump = |switches: &std::sync::Weak<AtomicU64>| match switches.upgrade() {
        Some(switches) => {
            switches.fetch_add(1, Ordering::AcqRel);
            true
        }
        None => false,
    };
    let mut wait = RESOLVE_EVERY;
    // Whether a refused subscription was logged: once a watcher.
    let mut refusal_logged = false;
    loop {
        let mut reached = false;
        for client in &sentinels {
            let Ok(Ok(pubsub)) = tokio::time::timeout(timeout, client.get_async_pubsub()).await
            else {
                continue;
            };
            let (mut sink, mut messages) = pubsub.split();
            let subscribed = tokio::time::timeout(timeout, sink.subscribe("+switch-master")).await;
            match subscribed {
                Ok(Ok(())) => {}
                // A user without SUBSCRIBE or the channel: no switchover is
                // seen until a call fails on the old master, which a manual
                // failover leaves answering for seconds. Said once, as the
                // misconfiguration it is.
                Ok(Err(error))
                    if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
                {
                    if !std::mem::replace(&mut refusal_logged, true) {
                        tracing::error!(
                            %master,
                            sentinel = %client.get_connection_info().addr(),
                            kind = %crate::ErrorKind::Permission,
                            "the Sentinel user may not subscribe to `+switch-master`: switchovers \
                             are followed only once a call fails on the old master; grant it \
                             `+subscribe` and `&+switch-master`"
                        );
                    }
                    continue;
                }
                _ => continue,
            }
            reached = true;
            if !bump(&switches) {
                return;
            }
            let mut alive = tokio::time::interval(Duration::from_secs(1));
            alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    message = messages.next() => {
                        let Some(message) = message else { break };
                        // "<master name> <old ip> <old port> <new ip> <new port>"
                        let payload = message.get_payload_bytes();
                        let named = payload.split(|&b| b == b' ').next() == Some(master.as_bytes());
                        if named {
                            tracing::info!(%master, "Sentinel announced a new master; following it");
                            if !bump(&switches) {
                                return;
                            }
                        }
                    }
                    _ = alive.tick() => {
                        if switches.strong_count() == 0 {
                            return;
                        }
                        // A connection that died silently is found out.
                        let pong = tokio::time::timeout(timeout, sink.ping::<redis::Value>()).await;
                        if !matches!(pong, Ok(Ok(_))) {
                            break;
                        }
                    }
                }
            }
        }
        if switches.strong_count() == 0 {
            return;
        }
        // Sentinels that cannot be reached are tried again less and less
        // often, up to every few seconds, rather than ten times a second
        // each for as long as they are away.
        wait = if reached {
            RESOLVE_EVERY
        } else {
            (wait * 2).min(MAX_WATCH_WAIT)
        };
        tokio::time::sleep(wait).await;
    }
}

/// The fault to report when no Sentinel said where the master is: redis-rs
/// answers the last Sentinel's (or master's) error it met, so a Sentinel
/// that refuses the password, or a server that is no Sentinel at all, would
/// hide behind the next one's being down. Each Sentinel is asked again,
/// all at once, whether it can be reached and is a Sentinel; the most
/// severe fault found is reported, naming the Sentinel: one that fixing the
/// deployment ends (see `ErrorKind::is_misconfiguration`) before one that
/// waiting may end, the first Sentinel's among equals, and `asked`
/// (redis-rs's error) when the Sentinels show none as severe (one as
/// severe is preferred: it names its Sentinel).
pub(super) async fn most_severe(
    sentinels: &[redis::Client],
    timeout: Duration,
    asked: crate::error::Error,
) -> crate::error::Error {
    let found = futures_util::future::join_all(
        sentinels
            .iter()
            .map(|sentinel| sentinel_fault(sentinel, timeout)),
    )
    .await;
    let severity = |error: &crate::error::Error| u8::from(error.kind().is_misconfiguration());
    let mut worst: Option<crate::error::Error> = None;
    for fault in found.into_iter().flatten() {
        if worst
            .as_ref()
            .is_none_or(|worst| severity(&fault) > severity(worst))
        {
            worst = Some(fault);
        }
    }
    match worst {
        Some(fault) if severity(&fault) >= severity(&asked) => fault,
        _ => asked,
    }
}

/// What keeps `sentinel` from answering as a Sentinel: its connection's
/// failure (refused, a refused password, a certificate), or a server that
/// says (`HELLO`) it is not a Sentinel; `None` when it answers as one (or
/// is too old to say what it is).
async fn sentinel_fault(
    sentinel: &redis::Client,
    timeout: Duration,
) -> Option<crate::error::Error> {
    use crate::error::Error;
    let address = sentinel.get_connection_info().addr().to_string();
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let connected = tokio::time::timeout(
        timeout,
        sentinel.get_multiplexed_async_connection_with_config(&config),
    )
    .await;
    let mut connection = match connected {
        Err(_) => return Some(Error::Timeout(timeout)),
        Ok(Err(error)) => return Some(Error::from(error).connecting_to(&address)),
        Ok(Ok(connection)) => connection,
    };
    match super::server::hello(&mut connection, timeout, false).await {
        Err(error) => Some(error.connecting_to(&address)),
        Ok(Some((mode, _))) if mode != "sentinel" => Some(Error::WrongServer {
            address,
            found: if mode == "cluster" {
                "a Redis Cluster node, not a Sentinel"
            } else {
                "a Redis server, not a Sentinel"
            },
            fix: "give `LimiterBuilder::sentinel` the Sentinels' addresses (port 26379 by \
                  default), or this server's to `LimiterBuilder::redis`",
        }),
        Ok(_) => None,
    }
}
