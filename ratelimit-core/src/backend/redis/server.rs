//! What a server says of itself (`HELLO`), and whether it is the kind the
//! limiter was configured for.

use std::time::Duration;

use crate::error::Error;

/// What a server told `HELLO` of itself: its mode (`standalone`,
/// `cluster` or `sentinel`) and its role (`master` or `replica`). `HELLO`
/// needs no ACL permission, unlike `ROLE` or `INFO`. `None` from a server
/// too old to know the command.
///
/// `resp3` says what the connection speaks, which the `HELLO` asked with
/// keeps (a bare `HELLO`, which changes nothing, needs Redis 6.2).
pub(crate) async fn hello<C: redis::aio::ConnectionLike>(
    connection: &mut C,
    timeout: Duration,
    resp3: bool,
) -> Result<Option<(String, String)>, Error> {
    let reply = tokio::time::timeout(
        timeout,
        redis::cmd("HELLO")
            .arg(if resp3 { 3 } else { 2 })
            .query_async::<redis::Value>(connection),
    )
    .await
    .map_err(|_| Error::Timeout(timeout))?;
    let fields = match reply {
        Ok(redis::Value::Array(fields)) => fields
            .chunks(2)
            .filter_map(|pair| match pair {
                [name, value] => Some((name.clone(), value.clone())),
                _ => None,
            })
            .collect(),
        Ok(redis::Value::Map(fields)) => fields,
        Ok(_) => return Ok(None),
        // "unknown command": a Redis older than 6.0, or one with `HELLO`
        // renamed away (which refuses a RESP3 connection's `HELLO 3` so).
        // Any other `ERR` (a database the server does not have) is the
        // connection's failure.
        Err(error)
            if error.code() == Some("ERR")
                && error
                    .detail()
                    .is_some_and(|detail| detail.trim_start().starts_with("unknown command")) =>
        {
            return Ok(None)
        }
        Err(error) => return Err(error.into()),
    };
    let text = |wanted: &str| {
        fields.iter().find_map(|(name, value)| {
            let name = redis::from_redis_value_ref::<String>(name).ok()?;
            (name == wanted)
                .then(|| redis::from_redis_value_ref::<String>(value).ok())
                .flatten()
        })
    };
    Ok(text("mode").zip(text("role")))
}

/// Whether a server that `HELLO` described as `traits` can serve a limiter
/// that expects `expected_mode` (`standalone` or `cluster`) and, for one
/// Redis, a master. `sentinel` says a Sentinel named this server.
pub(crate) fn check_server(
    address: &str,
    traits: Option<(String, String)>,
    expected_mode: &str,
    sentinel: bool,
) -> Result<(), Error> {
    let Some((mode, role)) = traits else {
        return Ok(());
    };
    let wrong = |found, fix| Error::WrongServer {
        address: address.to_owned(),
        found,
        fix,
    };
    match (expected_mode, mode.as_str()) {
        (_, "sentinel") => Err(wrong(
            "a Sentinel",
            "configure it with `LimiterBuilder::sentinel`, naming the master",
        )),
        ("standalone", "cluster") => Err(wrong(
            "a Redis Cluster node",
            "configure the cluster's nodes with `LimiterBuilder::cluster`",
        )),
        ("cluster", "standalone") => Err(wrong(
            "one Redis, not a Redis Cluster node",
            "configure it with `LimiterBuilder::redis`",
        )),
        ("standalone", _) if role != "master" && sentinel => Err(wrong(
            "a replica, though the Sentinels name it the master (a failover is under way)",
            "the next call asks the Sentinels again",
        )),
        ("standalone", _) if role != "master" => Err(wrong(
            "a read-only replica",
            "give the master's address, or its Sentinels with `LimiterBuilder::sentinel`",
        )),
        _ => Ok(()),
    }
}
