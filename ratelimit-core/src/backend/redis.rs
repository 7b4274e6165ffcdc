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

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use once_cell::sync::Lazy;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::algorithm::gcra;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::{ConfigError, Error};
use crate::quota::{Algorithm, Quota};

/// The most decisions one script call carries. A cap well under the number
/// of decisions usually waiting splits a burst of arrivals over two or more
/// calls, so Redis starts on the first while the client still sends the
/// next: measured on 100,000 keys with 64 decisions in flight, 32 kept Redis
/// busier and decided more per second than 128, with the same ~20 decisions
/// per call on average.
const MAX_BATCH: usize = 32;

/// Connections the batches take turns on. Redis reads every call waiting on
/// one connection in one pass and sends their replies together at its end,
/// so with one connection the replies come back in waves and Redis idles
/// while the client turns a wave around; two connections let it answer one
/// while the other's next call is on its way (measured: Redis ~97% busy
/// instead of ~94%).
const BATCH_CONNECTIONS: usize = 2;

/// Script calls in flight at once from one limiter; decisions arriving while
/// all are busy queue for the next batch. Until Redis has answered a call,
/// and again after a call fails, a call goes alone: a frozen Redis is sent
/// one batch per failure rather than this many, and holds less to apply
/// when it thaws.
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// The most decisions waiting for a script call. A decision arriving while
/// this many wait (Redis is slower than the calls arrive) fails at once with
/// [`Error::Overloaded`], which the failure policy answers: the queue, and
/// the work Redis is left with, stay bounded however long Redis is slow.
pub(crate) const MAX_QUEUED: usize = 4_096;

/// A Redis limiter decides on a Tokio runtime, which runs its connection and
/// batching tasks: said when it has none, or when that runtime has shut down
/// (the batching task is gone).
const NO_RUNTIME: Error = Error::NoRuntime {
    what: "a Redis limiter (its connection and batching)",
};

/// The script for EVALSHA, built once per process: its definitions, then the
/// call. `Script` sends EVALSHA and, on NOSCRIPT (after a restart or
/// `SCRIPT FLUSH`), loads the script and retries once. Used where Redis
/// functions are not (see [`LIBRARY`]).
pub(crate) static SCRIPT: Lazy<redis::Script> =
    Lazy::new(|| redis::Script::new(concat!(script_body!(), eval_call!())));

/// The script's text, file by file: one list for the standalone script, the
/// cluster's flagged one and the function library (a macro, as `concat!`
/// takes only literals).
macro_rules! script_body {
    () => {
        concat!(
            include_str!("../../scripts/prelude.lua"),
            include_str!("../../scripts/gcra.lua"),
            include_str!("../../scripts/fixed_window.lua"),
            include_str!("../../scripts/sliding_log.lua"),
            include_str!("../../scripts/sliding_window.lua"),
            include_str!("../../scripts/refund.lua"),
            include_str!("../../scripts/entry.lua"),
        )
    };
}
pub(crate) use script_body;

/// What makes the script's definitions a script call (see entry.lua): the
/// global KEYS, which the prelude's local of that name hides.
macro_rules! eval_call {
    () => {
        "return decide_call(_G.KEYS, ARGV)\n"
    };
}
pub(crate) use eval_call;

/// The same definitions as a Redis function library (Redis 7.0 and later,
/// Valkey), loaded once per server by `FUNCTION LOAD`: Redis then runs them
/// once, at load, where EVALSHA runs them on every call, which measured a
/// large share of what a call costs Redis (`benches/floors.sh`). Named after
/// the script's hash, so that two versions of this crate sharing a Redis each
/// call their own; flagged for keys of several slots, which a cluster batch
/// needs and a single-slot call does not mind.
pub(crate) struct Library {
    /// The function's name, also the library's.
    function: String,
    /// The library's source, for `FUNCTION LOAD`.
    code: String,
}

pub(crate) static LIBRARY: Lazy<Library> = Lazy::new(|| {
    let function = format!("ratelimit_{}", &SCRIPT.get_hash()[..16]);
    let code = format!(
        "#!lua name={function}\n{}\nredis.register_function{{function_name='{function}', \
         callback=decide_call, flags={{'allow-cross-slot-keys'}}}}\n",
        script_body!()
    );
    Library { function, code }
});

/// Whether one server (a master, or the masters of one cluster) runs the
/// library: until it refuses it (a Redis older than 7.0, an ACL user without
/// `FCALL` or `FUNCTION LOAD`), calls go as FCALL, and from then on as
/// EVALSHA.
#[derive(Debug, Default)]
pub(crate) struct Functions {
    refused: AtomicBool,
}

impl Functions {
    /// From now on, EVALSHA. The log names the error's code alone: a reply
    /// to an unknown command quotes the call's arguments, which hold keys.
    fn refuse(&self, error: &redis::RedisError) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::info!(
                code = error.code().unwrap_or("none"),
                "this Redis does not run the limiter as a function (FCALL or FUNCTION LOAD \
                 refused); calling it by EVALSHA"
            );
        }
    }
}

/// One call of the script: its keys and arguments, sent as FCALL of the
/// library or as EVALSHA of `script`.
pub(crate) struct ScriptCall {
    script: &'static redis::Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall {
    pub(crate) fn new(script: &'static redis::Script) -> Self {
        Self {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    pub(crate) fn key<T: redis::ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(crate) fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    fn fcall(&self) -> redis::Cmd {
        let mut fcall = redis::cmd("FCALL");
        fcall
            .arg(&LIBRARY.function)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        fcall
    }

    fn evalsha(&self) -> redis::ScriptInvocation<'static> {
        let mut invocation = self.script.prepare_invoke();
        invocation.key(&self.keys).arg(&self.args);
        invocation
    }
}

/// Runs `call`, as FCALL while `functions` allows, loading the library when
/// the server has not got it (first use, a restart, `FUNCTION FLUSH`), and
/// otherwise, or when Redis is out of memory, as EVALSHA. Errors are told
/// apart by redis-rs's kinds and Redis's codes, never by their text. A flush
/// landing between a load and the call it serves makes the call fail as
/// before the load, so each is tried a couple more times rather than
/// reported as a backend failure.
pub(crate) async fn invoke<C: redis::aio::ConnectionLike>(
    call: &ScriptCall,
    connection: &mut C,
    functions: &Functions,
) -> Result<Vec<i64>, redis::RedisError> {
    match invoke_once(call, connection, functions).await {
        // A refused connection sent nothing: it is the reconnection attempt
        // a connection manager made at an earlier failure, which it reports
        // to the next call while it starts a new one. Sent again, the call
        // waits for that new attempt, so the first call after a restart is
        // decided rather than failed (and the breaker kept closed).
        Err(error) if error.is_connection_refusal() => {
            invoke_once(call, connection, functions).await
        }
        result => result,
    }
}

async fn invoke_once<C: redis::aio::ConnectionLike>(
    call: &ScriptCall,
    connection: &mut C,
    functions: &Functions,
) -> Result<Vec<i64>, redis::RedisError> {
    let mut loads = 0;
    while !functions.refused.load(Ordering::Relaxed) {
        match call.fcall().query_async(connection).await {
            // A generic error: the function is missing (never loaded here,
            // flushed, a restart), or FCALL cannot run (Redis before 7.0, the
            // command renamed away). Told apart by codes alone: the load
            // fails where FUNCTION is unknown, and FCALL failing again after
            // two loads (one may meet a flush landing between the load and
            // the call) cannot run here; EVALSHA decides from then on (and
            // answers with a call's own error, if that is what it was).
            Err(error) if error.code() == Some("ERR") => {
                if loads == 2 {
                    functions.refuse(&error);
                    break;
                }
                loads += 1;
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&LIBRARY.code);
                match load.query_async::<redis::Value>(connection).await {
                    Ok(_) => {}
                    Err(error) if error.is_io_error() || error.is_timeout() => return Err(error),
                    // Over `maxmemory`: this call goes by EVALSHA, which
                    // needs no load, and the next tries again.
                    Err(error) if error.code() == Some("OOM") => break,
                    // No FUNCTION command, not allowed, or a Lua that
                    // rejects the library.
                    Err(error) => functions.refuse(&error),
                }
            }
            // Not allowed to call functions, or the keys: EVALSHA either
            // decides or is refused the keys too, and says so.
            Err(error)
                if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
            {
                functions.refuse(&error)
            }
            // Over `maxmemory`, Redis refuses a function that may write
            // before it runs, while the plain script runs until it writes:
            // a call that only denies is still answered that way.
            Err(error) if error.code() == Some("OOM") => break,
            result => return result,
        }
    }
    let invocation = call.evalsha();
    let mut attempts = 0;
    loop {
        match invocation.invoke_async(connection).await {
            Err(error)
                if attempts < 2
                    && error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                attempts += 1;
            }
            result => return result,
        }
    }
}

/// What a server told `HELLO` of itself: its mode (`standalone`,
/// `cluster` or `sentinel`) and its role (`master` or `replica`). `HELLO`
/// needs no ACL permission, unlike `ROLE` or `INFO`. `None` from a server
/// too old to know the command.
pub(crate) async fn hello<C: redis::aio::ConnectionLike>(
    connection: &mut C,
    timeout: Duration,
) -> Result<Option<(String, String)>, Error> {
    let reply = tokio::time::timeout(
        timeout,
        redis::cmd("HELLO").query_async::<redis::Value>(connection),
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
        // "unknown command": a Redis older than 6.0.
        Err(error) if error.code() == Some("ERR") => return Ok(None),
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

/// `url` with any password replaced by `***`, for errors and logs: a Redis
/// URL carries the password of its user (`redis://user:secret@host`).
pub(crate) fn redacted(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    match url[scheme_end..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &url[scheme_end..scheme_end + at];
            let user = userinfo.split(':').next().unwrap_or("");
            let hidden = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            format!("{}{hidden}{}", &url[..scheme_end], &url[scheme_end + at..])
        }
        None => url.to_owned(),
    }
}

/// A client for `url`, with `tls`'s certificates for a `rediss://` URL; an
/// invalid URL is a configuration error that names the URL without its
/// password.
pub(crate) fn open_client(url: &str, tls: &crate::tls::TlsConfig) -> Result<redis::Client, Error> {
    use redis::IntoConnectionInfo as _;
    let invalid = |source| {
        Error::from(ConfigError::InvalidUrl {
            what: "Redis URL",
            urls: vec![redacted(url)],
            source,
        })
    };
    let info = url.into_connection_info().map_err(invalid)?;
    let secure = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    if tls.is_set() && !secure {
        return Err(ConfigError::TlsWithoutRediss { what: "a URL" }.into());
    }
    #[cfg(feature = "tls")]
    if secure {
        crate::tls::ensure_crypto_provider();
        if tls.is_set() {
            return redis::Client::build_with_tls(info, tls.certificates()).map_err(invalid);
        }
    }
    #[cfg(not(feature = "tls"))]
    if secure {
        return Err(ConfigError::FeatureOff {
            what: "`rediss://`",
            feature: "tls",
        }
        .into());
    }
    redis::Client::open(info).map_err(invalid)
}

/// One key's request: what the script needs besides the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub algorithm: u64,
    pub cost: u64,
    /// The caller's clock, or `None` for Redis `TIME`.
    pub now: Option<u64>,
    pub params: [u64; 3],
}

impl Request {
    pub(crate) fn new(quota: &Quota, cost: u64, now: Option<u64>) -> Self {
        Self::tagged(quota, cost, now, 0)
    }

    /// A request whose admission the sliding log records under `tag`
    /// (non-zero, below 2^53, unique to this request), so that a refund
    /// with the same tag removes exactly what it added, however often it is
    /// applied. Other algorithms ignore the tag.
    pub(crate) fn tagged(quota: &Quota, cost: u64, now: Option<u64>, tag: u64) -> Self {
        let rate = quota.rate();
        let algorithm = quota.algorithm();
        let params = if algorithm.is_windowed() {
            [quota.capacity(), quota.window_us(), tag]
        } else {
            [rate.tokens(), rate.period_us(), quota.capacity()]
        };
        Self {
            algorithm: algorithm.wire_id(),
            cost,
            now,
            params,
        }
    }

    /// Adds the group of seven fields that stands for `count` keys with
    /// this request.
    fn push_group(&self, count: usize, invocation: &mut ScriptCall) {
        invocation.arg(count).arg(self.algorithm).arg(self.cost);
        match self.now {
            Some(now) => invocation.arg(now),
            None => invocation.arg(""),
        };
        for p in self.params {
            invocation.arg(p);
        }
    }
}

/// Prepares one script call in `mode` for `requests`, in order: their keys,
/// and one group of fields for each run of equal requests on distinct keys
/// (concurrent decisions on one quota make one group, so Redis reads one
/// argument a key). A key named again starts a new group: the script reads a
/// group's values before any of its decisions writes.
pub(crate) fn invocation<'a, K: AsRef<str> + 'a>(
    mode: &str,
    requests: impl IntoIterator<Item = (&'a K, Request)>,
) -> ScriptCall {
    let mut invocation = ScriptCall::new(&SCRIPT);
    invocation.arg(mode);
    let (keys, groups) = grouped(requests);
    for key in keys {
        invocation.key(key);
    }
    for (count, request) in groups {
        request.push_group(count, &mut invocation);
    }
    invocation
}

/// Prepares one 'batch' call of `script` (the script flagged for keys of
/// several slots) for `requests`, whose keys all live on the Redis Cluster
/// node serving `routing`: that key alone is in KEYS, which is what the
/// cluster client routes by; the keys go in ARGV, then the groups.
#[cfg(feature = "cluster")]
pub(crate) fn batch_invocation<'a, K: AsRef<str> + 'a>(
    script: &'static redis::Script,
    routing: &str,
    requests: impl IntoIterator<Item = (&'a K, Request)>,
) -> ScriptCall {
    let mut invocation = ScriptCall::new(script);
    let (keys, groups) = grouped(requests);
    invocation.key(routing).arg("batch").arg(keys.len());
    for key in keys {
        invocation.arg(key);
    }
    for (count, request) in groups {
        request.push_group(count, &mut invocation);
    }
    invocation
}

/// The keys of `requests` in order, and the groups that stand for them: a
/// count of keys and their request, for each run of equal requests on
/// distinct keys.
fn grouped<'a, K: AsRef<str> + 'a>(
    requests: impl IntoIterator<Item = (&'a K, Request)>,
) -> (Vec<&'a str>, Vec<(usize, Request)>) {
    let mut keys = Vec::new();
    let mut groups = Vec::new();
    let mut run: Option<Request> = None;
    let mut run_keys: HashSet<&str> = HashSet::new();
    for (key, request) in requests {
        let key = key.as_ref();
        if let Some(current) = run {
            if current != request || run_keys.contains(key) {
                groups.push((run_keys.len(), current));
                run_keys.clear();
            }
        }
        run = Some(request);
        run_keys.insert(key);
        keys.push(key);
    }
    if let Some(current) = run {
        groups.push((run_keys.len(), current));
    }
    (keys, groups)
}

/// How many numbers the script answers for one key of `algorithm`: the
/// bucket algorithms answer with the debt their decision follows from.
fn answer_len(algorithm: Algorithm) -> usize {
    if algorithm.is_windowed() {
        5
    } else {
        1
    }
}

/// Reads each key's decision from a script reply, in order: `keys` gives
/// each key's quota, cost and full name. A reply of the wrong length is one
/// error for the whole call.
pub(crate) fn decode_reply<'a>(
    reply: &[i64],
    keys: impl IntoIterator<Item = (&'a Quota, u64, &'a str)>,
) -> Result<Vec<Result<Decision, Error>>, Error> {
    let unexpected = || Error::UnexpectedReply(format!("{reply:?}"));
    let mut rest = reply;
    let mut decisions = Vec::new();
    for (quota, cost, key) in keys {
        let len = answer_len(quota.algorithm());
        if rest.len() < len {
            return Err(unexpected());
        }
        let (answer, tail) = rest.split_at(len);
        rest = tail;
        decisions.push(decode(quota, cost, key, answer));
    }
    if !rest.is_empty() {
        return Err(unexpected());
    }
    Ok(decisions)
}

/// The decisions of an all-or-nothing call on `requests`, whose full key
/// names are `keys`: every one, or the first error.
#[cfg(feature = "cluster")]
pub(crate) fn decode_all(
    reply: &[i64],
    requests: &[(&Quota, &str, u64)],
    keys: &[String],
) -> Result<Vec<Decision>, Error> {
    decode_reply(
        reply,
        requests
            .iter()
            .zip(keys)
            .map(|((quota, _, cost), key)| (*quota, *cost, key.as_str())),
    )?
    .into_iter()
    .collect()
}

/// The decision of a script call on one key.
pub(crate) fn decode_one(
    reply: &[i64],
    quota: &Quota,
    cost: u64,
    key: &str,
) -> Result<Decision, Error> {
    decode_reply(reply, [(quota, cost, key)])?
        .pop()
        .unwrap_or_else(|| Err(Error::UnexpectedReply(format!("{reply:?}"))))
}

/// One key's decision from its answer, whose length `answer_len` gave: one
/// number (the debt) for the bucket algorithms, five for the windows.
fn decode(quota: &Quota, cost: u64, key: &str, answer: &[i64]) -> Result<Decision, Error> {
    let algorithm = quota.algorithm();
    match *answer {
        [-1, ..] => Err(Error::ForeignValue {
            key: key.to_owned(),
            algorithm,
        }),
        [debt] if debt >= 0 => Ok(gcra::decide_debt(
            quota,
            debt as u64,
            cost,
            algorithm == Algorithm::LeakyBucket,
        )),
        [allowed @ (0 | 1), remaining, retry, reset, delay]
            if remaining >= 0 && retry >= 0 && reset >= 0 && delay >= 0 =>
        {
            Ok(Decision::from_micros(
                allowed == 1,
                quota.capacity(),
                remaining as u64,
                retry as u64,
                reset as u64,
                delay as u64,
            ))
        }
        _ => Err(Error::UnexpectedReply(format!("{answer:?}"))),
    }
}

/// One queued decision.
pub(crate) struct Job {
    /// The full key name.
    pub key: String,
    pub quota: Quota,
    pub request: Request,
    pub reply: oneshot::Sender<Result<Decision, Error>>,
}

/// One queued all-or-nothing check: its keys' full names, quotas and
/// requests, in order.
pub(crate) struct Check {
    keys: Vec<String>,
    quotas: Vec<Quota>,
    requests: Vec<Request>,
    reply: oneshot::Sender<Result<Vec<Decision>, Error>>,
}

/// What one Redis's batches carry: single decisions, and all-or-nothing
/// checks, which share script calls with them (a check goes as a run of its
/// own, see `runs_invocation`).
pub(crate) enum Work {
    One(Job),
    All(Check),
}

/// Queued work whose caller may have gone.
pub(crate) trait Waiting {
    /// Whether its caller still waits for the answer.
    fn wanted(&self) -> bool;
}

impl Waiting for Job {
    fn wanted(&self) -> bool {
        Job::wanted(self)
    }
}

impl Waiting for Work {
    fn wanted(&self) -> bool {
        match self {
            Work::One(job) => job.wanted(),
            Work::All(check) => !check.reply.is_closed(),
        }
    }
}

impl Work {
    /// Each key's quota, cost and full name, in the order of the reply.
    fn keys(&self) -> impl Iterator<Item = (&Quota, u64, &str)> {
        let (one, all) = match self {
            Work::One(job) => (Some((&job.quota, job.request.cost, job.key.as_str())), None),
            Work::All(check) => (None, Some(check)),
        };
        let all = all.into_iter().flat_map(|check| {
            check
                .quotas
                .iter()
                .zip(&check.requests)
                .zip(&check.keys)
                .map(|((quota, request), key)| (quota, request.cost, key.as_str()))
        });
        one.into_iter().chain(all)
    }
}

/// Where the Redis to decide on is: one address, or the master a set of
/// Sentinels name (asked again after a failure, to follow a failover).
pub(crate) enum Endpoint {
    Fixed(redis::Client),
    Sentinel {
        client: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
        /// The master's name, and the Sentinels, whose `+switch-master`
        /// announcements a watcher follows.
        master: String,
        sentinels: Vec<redis::ConnectionInfo>,
    },
}

impl Endpoint {
    /// The endpoint for `sentinels` (their URLs), serving `master`. The
    /// master's connections take the first URL's user, password and
    /// database.
    pub(crate) fn sentinel(master: &str, sentinels: &[String]) -> Result<Self, Error> {
        use redis::IntoConnectionInfo as _;
        let invalid = |source| {
            Error::from(ConfigError::InvalidUrl {
                what: "Redis Sentinel URLs",
                urls: sentinels.iter().map(|u| redacted(u)).collect(),
                source,
            })
        };
        if master.is_empty() || sentinels.is_empty() {
            return Err(ConfigError::MissingAddress {
                what: "Redis Sentinel",
                needs: "the master's name and at least one Sentinel URL",
                example: ".sentinel(\"mymaster\", [\"redis://10.0.0.1:26379\"])",
            }
            .into());
        }
        let infos = sentinels
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        let node = redis::sentinel::SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(infos[0].redis_settings().clone());
        // redis-rs takes a `String` without its TLS feature and any
        // `AsRef<str>` with it: an owned name suits both.
        #[allow(clippy::unnecessary_to_owned)]
        let client = redis::sentinel::SentinelClient::build(
            infos.clone(),
            master.to_owned(),
            Some(node),
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(invalid)?;
        Ok(Endpoint::Sentinel {
            client: tokio::sync::Mutex::new(client),
            master: master.to_owned(),
            sentinels: infos,
        })
    }

    /// A client for the Redis to use now; with Sentinel, the master they
    /// name now.
    pub(crate) async fn client(&self, timeout: Duration) -> Result<redis::Client, Error> {
        match self {
            Endpoint::Fixed(client) => Ok(client.clone()),
            Endpoint::Sentinel {
                client: sentinel, ..
            } => {
                let ask = async { sentinel.lock().await.async_get_client().await };
                Ok(tokio::time::timeout(timeout, ask)
                    .await
                    .map_err(|_| Error::Timeout(timeout))??)
            }
        }
    }

    fn follows_failovers(&self) -> bool {
        matches!(self, Endpoint::Sentinel { .. })
    }
}

/// Follows the Sentinels' `+switch-master` announcements of `master`, as
/// Redis's guidelines for Sentinel clients ask, so a switchover moves the
/// decisions to the new master at once, without waiting for a failure on
/// the old one (which a manual failover leaves answering for seconds). Each
/// announcement, and each new subscription (a switch may have been missed
/// while none was held), bumps `switches`; lanes made before then ask the
/// Sentinels again. Ends once the backend is gone.
async fn watch_switches(
    sentinels: Vec<redis::ConnectionInfo>,
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
    loop {
        for sentinel in &sentinels {
            let Ok(client) = redis::Client::open(sentinel.clone()) else {
                continue;
            };
            let Ok(Ok(pubsub)) = tokio::time::timeout(timeout, client.get_async_pubsub()).await
            else {
                continue;
            };
            let (mut sink, mut messages) = pubsub.split();
            let subscribed = tokio::time::timeout(timeout, sink.subscribe("+switch-master")).await;
            if !matches!(subscribed, Ok(Ok(()))) {
                continue;
            }
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
        tokio::time::sleep(RESOLVE_EVERY).await;
    }
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
    /// Whether this master runs the script as a function.
    functions: Arc<Functions>,
    /// The Sentinels' announced switches, and how many this lane has seen:
    /// one more sends the next decision to ask them where the master is.
    switches: Arc<AtomicU64>,
    seen: AtomicU64,
}

impl Lane {
    fn live(&self) -> bool {
        !self.queue.is_closed()
            && !self.stale.load(Ordering::Acquire)
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
    renewing: tokio::sync::Mutex<Option<std::time::Instant>>,
    prefix: String,
    timeout: Duration,
    /// The caller's clock, when configured; Redis `TIME` otherwise.
    clock: Option<Arc<dyn Clock>>,
    /// Switches the Sentinels announced, counted by a watcher started with
    /// the first lane.
    switches: Arc<AtomicU64>,
    watching: AtomicBool,
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
            renewing: tokio::sync::Mutex::new(None),
            prefix,
            timeout,
            clock,
            switches: Arc::new(AtomicU64::new(0)),
            watching: AtomicBool::new(false),
        }
    }

    /// A new connection manager to `client`; it connects on first use.
    fn new_connection(&self, client: &redis::Client) -> Result<ConnectionManager, Error> {
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
        let mut last_resolve = self.renewing.lock().await;
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
            if !self.watching.swap(true, Ordering::AcqRel) {
                runtime.spawn(watch_switches(
                    sentinels.clone(),
                    master.clone(),
                    Arc::downgrade(&self.switches),
                    self.timeout,
                ));
            }
        }
        // Read before asking: a switch announced meanwhile is seen again.
        let switches = self.switches.load(Ordering::Acquire);
        let client = self.endpoint.client(self.timeout).await?;
        let address = client.get_connection_info().addr().clone();
        if let Some(lane) = stale {
            if lane.address == address {
                // The master did not move: its connections reconnect by
                // themselves.
                lane.stale.store(false, Ordering::Release);
                lane.seen.store(switches, Ordering::Release);
                return Ok(lane);
            }
            tracing::warn!(master = %address, "the Redis master moved; deciding on the new one");
        }
        let connections = (0..BATCH_CONNECTIONS)
            .map(|_| self.new_connection(&client))
            .collect::<Result<Vec<_>, _>>()?;
        // Before the first decision on a server: it must be what this
        // limiter expects (not a cluster node, not a replica). The
        // connection is made here too, so a refused password or certificate
        // is this call's error rather than a timeout.
        let traits = hello(&mut connections[0].clone(), self.timeout).await?;
        check_server(
            &address.to_string(),
            traits,
            "standalone",
            self.endpoint.follows_failovers(),
        )?;
        let (queue, receiver) = mpsc::channel(MAX_QUEUED);
        let stale = Arc::new(AtomicBool::new(false));
        let functions = Arc::new(Functions::default());
        let lane = Arc::new(Lane {
            queue,
            connection: connections[0].clone(),
            address,
            stale: stale.clone(),
            functions: functions.clone(),
            switches: self.switches.clone(),
            seen: AtomicU64::new(switches),
        });
        let on_failure = self.endpoint.follows_failovers().then_some(stale);
        runtime.spawn(run_batches(
            receiver,
            connections,
            on_failure,
            MAX_IN_FLIGHT,
            move |connection, batch| send_batch(connection, functions.clone(), batch),
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
        let mut full = String::with_capacity(self.prefix.len() + key.len());
        full.push_str(&self.prefix);
        full.push_str(key);
        full
    }

    fn now(&self) -> Option<u64> {
        self.clock.as_ref().map(|clock| clock.now_micros())
    }

    pub(crate) async fn decide(
        &self,
        quota: &Quota,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            key: self.full_key(key),
            quota: *quota,
            request: Request::new(quota, cost, self.now()),
            reply,
        };
        self.enqueue(Work::One(job)).await?;
        await_answer(self.timeout, answer).await
    }

    /// Decides for every key at once, admitting all or none, in the next
    /// batch's script call. The keys must be distinct.
    pub(crate) async fn decide_all(
        &self,
        requests: &[(&Quota, &str, u64)],
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
        await_answer(self.timeout, answer).await
    }

    /// Runs one script call on `lane`'s connection, within the timeout; a
    /// failure may mean the master moved.
    async fn call(
        &self,
        lane: &Lane,
        invocation: &ScriptCall,
        connection: &mut ConnectionManager,
    ) -> Result<Vec<i64>, Error> {
        let reply = tokio::time::timeout(
            self.timeout,
            invoke(invocation, connection, &lane.functions),
        )
        .await
        .map_err(|_| Error::Timeout(self.timeout))
        .and_then(|reply| reply.map_err(Error::from));
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
    ) -> Result<Decision, Error> {
        let lane = self.lane().await?;
        let mut connection = lane.connection.clone();
        let key = self.full_key(key);
        let invocation = invocation("peek", [(&key, Request::new(quota, cost, self.now()))]);
        let reply = self.call(&lane, &invocation, &mut connection).await?;
        decode_one(&reply, quota, cost, &key)
    }

    /// Verifies that this limiter can decide on the server now: connected,
    /// authenticated, over TLS where asked, the right kind of server, the
    /// script loaded, and the keys under the prefix (and `TIME`) permitted.
    pub(crate) async fn ping(&self) -> Result<(), Error> {
        let lane = self.lane().await?;
        let mut connection = lane.connection.clone();
        let traits = hello(&mut connection, self.timeout).await?;
        check_server(
            &lane.address.to_string(),
            traits,
            "standalone",
            self.endpoint.follows_failovers(),
        )?;
        let key = self.full_key(PING_KEY);
        let invocation = invocation("peek", [(&key, Request::new(&PING_QUOTA, 0, self.now()))]);
        let reply = self.call(&lane, &invocation, &mut connection).await?;
        decode_one(&reply, &PING_QUOTA, 0, &key).map(|_| ())
    }

    /// Deletes `key`'s state: its quota is whole again.
    pub(crate) async fn reset(&self, key: &str) -> Result<(), Error> {
        let lane = self.lane().await?;
        let mut connection = lane.connection.clone();
        let mut del = redis::cmd("DEL");
        del.arg(self.full_key(key));
        tokio::time::timeout(self.timeout, del.query_async::<i64>(&mut connection))
            .await
            .map_err(|_| Error::Timeout(self.timeout))??;
        Ok(())
    }
}

/// Waits for the batcher's answer, within `timeout`. Dropping `answer` (a
/// timeout here, or the caller's future dropped) tells the batcher not to
/// send the work if it has not yet.
pub(crate) async fn await_answer<T>(
    timeout: Duration,
    answer: oneshot::Receiver<Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(result)) => result,
        // The batching task is gone without an answer: its runtime shut down.
        Ok(Err(_)) => Err(NO_RUNTIME),
        Err(_) => Err(Error::Timeout(timeout)),
    }
}

/// Takes decisions off the queue and sends them in batches, with at most
/// `max_in_flight` script calls outstanding (one while Redis is not known
/// to answer), taking turns on `connections`; `send` sends one batch and
/// says whether Redis answered. Ends when the backend is dropped (the queue
/// closes) or its runtime shuts down.
pub(crate) async fn run_batches<T, C, S, F>(
    mut queue: mpsc::Receiver<T>,
    connections: Vec<C>,
    stale_on_failure: Option<Arc<AtomicBool>>,
    max_in_flight: usize,
    send: S,
) where
    T: Waiting,
    C: Clone + Send + 'static,
    S: Fn(C, Vec<T>) -> F,
    F: std::future::Future<Output = bool> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max_in_flight));
    let answering = Arc::new(AtomicBool::new(false));
    for connection in connections.iter().cycle() {
        // Wait for a free slot first: meanwhile, arriving decisions queue up
        // and go together. A call that must go alone takes every slot.
        let wanted = if answering.load(Ordering::Acquire) {
            1
        } else {
            max_in_flight as u32
        };
        let Ok(slot) = slots.clone().acquire_many_owned(wanted).await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        // Let the callers that are ready run first, so their decisions join
        // this batch.
        tokio::task::yield_now().await;
        // A decision whose caller has gone (timed out, or its future was
        // dropped) is not sent: it would consume tokens nobody was answered
        // with.
        let mut jobs: Vec<T> = Some(first).into_iter().filter(T::wanted).collect();
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) if job.wanted() => jobs.push(job),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if jobs.is_empty() {
            continue;
        }
        let batch = send(connection.clone(), jobs);
        let answering = answering.clone();
        let stale = stale_on_failure.clone();
        tokio::spawn(async move {
            let answered = batch.await;
            answering.store(answered, Ordering::Release);
            if let (false, Some(stale)) = (answered, stale) {
                stale.store(true, Ordering::Release);
            }
            drop(slot);
        });
    }
}

impl Job {
    pub(crate) fn wanted(&self) -> bool {
        !self.reply.is_closed()
    }
}

/// Sends one batch and hands each caller its answer; whether Redis answered.
async fn send_batch(
    mut connection: ConnectionManager,
    functions: Arc<Functions>,
    batch: Vec<Work>,
) -> bool {
    let invocation = runs_invocation(&batch);
    let reply = invoke(&invocation, &mut connection, &functions).await;
    let answered = reply.is_ok();
    let decoded = reply
        .map_err(Error::from)
        .and_then(|reply| decode_reply(&reply, batch.iter().flat_map(Work::keys)));
    // A failed call, or a reply of the wrong length: every decision fails.
    let mut results = match decoded {
        Ok(results) => results.into_iter(),
        Err(error) => {
            fail_all(batch, &error);
            return answered;
        }
    };
    // `decode_reply` answered for every key, in order. The caller may have
    // timed out and gone: nothing to do then.
    for work in batch {
        match work {
            Work::One(job) => {
                if let Some(result) = results.next() {
                    let _ = job.reply.send(result);
                }
            }
            Work::All(check) => {
                // Taken whole before the first error is looked for, so that
                // the next caller's answers start where this check's end.
                let answers: Vec<_> = results.by_ref().take(check.keys.len()).collect();
                let _ = check.reply.send(answers.into_iter().collect());
            }
        }
    }
    answered
}

/// Hands `error` to every caller of `batch`.
fn fail_all(batch: Vec<Work>, error: &Error) {
    for work in batch {
        match work {
            Work::One(job) => drop(job.reply.send(Err(error.clone()))),
            Work::All(check) => drop(check.reply.send(Err(error.clone()))),
        }
    }
}

/// One script call for `batch`: 'each' when it holds single decisions
/// only; otherwise 'runs', consecutive single decisions making one run
/// decided as 'each', and each check a run of its own decided as 'all'.
fn runs_invocation(batch: &[Work]) -> ScriptCall {
    if batch.iter().all(|work| matches!(work, Work::One(_))) {
        let jobs = batch.iter().filter_map(|work| match work {
            Work::One(job) => Some((&job.key, job.request)),
            Work::All(_) => None,
        });
        return invocation("each", jobs);
    }
    let mut runs: Vec<(bool, Vec<(&String, Request)>)> = Vec::new();
    for work in batch {
        match (work, runs.last_mut()) {
            (Work::One(job), Some((false, run))) => run.push((&job.key, job.request)),
            (Work::One(job), _) => runs.push((false, vec![(&job.key, job.request)])),
            (Work::All(check), _) => runs.push((
                true,
                check
                    .keys
                    .iter()
                    .zip(check.requests.iter().copied())
                    .collect(),
            )),
        }
    }
    let mut invocation = ScriptCall::new(&SCRIPT);
    invocation.arg("runs").arg(runs.len());
    for (all, run) in &runs {
        let keys = run.len() as i64;
        invocation.arg(if *all { -keys } else { keys });
    }
    // Grouped run by run: a group never spans two runs.
    let mut groups = Vec::new();
    for (_, run) in runs {
        let (keys, run_groups) = grouped(run);
        for key in keys {
            invocation.key(key);
        }
        groups.extend(run_groups);
    }
    for (count, request) in groups {
        request.push_group(count, &mut invocation);
    }
    invocation
}

#[cfg(test)]
mod url_tests {
    use super::redacted;

    #[test]
    fn passwords_never_appear_in_a_redacted_url() {
        for (url, shown) in [
            (
                "rediss://svc:s3cret@127.0.0.1:7411",
                "rediss://svc:***@127.0.0.1:7411",
            ),
            ("redis://:s3cret@host/0", "redis://:***@host/0"),
            ("redis://token@host", "redis://***@host"),
            ("redis://host:6379/2", "redis://host:6379/2"),
            ("redis+unix:///tmp/r.sock", "redis+unix:///tmp/r.sock"),
            ("redis://u:p@ss@host", "redis://u:***@host"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }
}
