//! The script: the Lua files as one EVALSHA script and as one function
//! library, and how a call is sent (FCALL while the server runs the library,
//! else EVALSHA).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use once_cell::sync::Lazy;

use crate::error::refuses_writes;

/// The script for EVALSHA, built once per process: its definitions, then the
/// call. Loaded on NOSCRIPT (after a restart or `SCRIPT FLUSH`; see
/// [`evalsha`]). Used where Redis functions are not (see [`LIBRARY`]).
pub(crate) static SCRIPT: Lazy<redis::Script> =
    Lazy::new(|| redis::Script::new(concat!(script_body!(), eval_call!())));

/// For `Limiter::ping`: whether the user may run, on a key of the limiter's,
/// each command the scripts run (`redis.acl_check_cmd`, Redis 7.0 and
/// later), as the peek that pings runs only the reads. Refused, it answers
/// `NOPERM` with the commands it lacks.
static ACL_CHECK: Lazy<redis::Script> = Lazy::new(|| redis::Script::new(&ACL_CHECK_TEXT));

/// [`ACL_CHECK`]'s text.
static ACL_CHECK_TEXT: Lazy<String> = Lazy::new(|| {
    format!(
        r#"local k = KEYS[1]
local checks = {{ {{'GET', k}}, {{'MGET', k}}, {{'EXISTS', k}}, {{'SET', k, '0'}},
  {{'PSETEX', k, '1', '0'}}, {{'PEXPIRE', k, '1'}}, {{'DEL', k}}, {{'ZADD', k, '0', '0'}},
  {{'ZCOUNT', k, '0', '0'}}, {{'ZRANGE', k, '0', '0'}}, {{'ZRANGEBYSCORE', k, '0', '0'}},
  {{'ZREM', k, '0'}}, {{'ZREMRANGEBYSCORE', k, '0', '0'}}, {{'TIME'}} }}
local missing = {{}}
for _, check in ipairs(checks) do
  if not redis.acl_check_cmd(unpack(check)) then missing[#missing + 1] = check[1] end
end
if #missing > 0 then
  return redis.error_reply("NOPERM {ACL_REFUSED}" .. table.concat(missing, ", ") ..
    " on " .. k .. " (the limiter's script runs them)")
end
return 0"#
    )
});

/// How [`ACL_CHECK`]'s refusal begins, after its code.
const ACL_REFUSED: &str = "this user may not run ";

/// Whether the user may run each command the scripts run on `key` (a full
/// key): a `Permission` error naming those it may not. Where the check
/// cannot run (Redis before 7.0, a user who may not run `EVALSHA` or
/// `SCRIPT LOAD`, a Cluster replica that does not take the script's load,
/// a server that does not answer it, which the ping's own call has found
/// answering), nothing is known, and nothing is said.
pub(crate) async fn check_commands(
    connection: &mut impl redis::aio::ConnectionLike,
    key: &str,
) -> Result<(), crate::error::Error> {
    match ACL_CHECK
        .key(key)
        .invoke_async::<redis::Value>(connection)
        .await
    {
        Err(error)
            if is_no_perm(&error)
                && error
                    .detail()
                    .is_some_and(|detail| detail.starts_with(ACL_REFUSED)) =>
        {
            Err(error.into())
        }
        _ => Ok(()),
    }
}

/// The script's text, file by file: one list for the standalone script, the
/// cluster's flagged one and the function library (a macro, as `concat!`
/// takes only literals).
macro_rules! script_body {
    () => {
        concat!(
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/prelude.lua")),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gcra.lua")),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/fixed_window.lua"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/sliding_log.lua"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/sliding_window.lua"
            )),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/refund.lua")),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/entry.lua")),
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
/// EVALSHA, but for one call a minute, which tries FCALL again (the user
/// granted the command, a load refused by a failed save that has passed).
#[derive(Debug, Default)]
pub(crate) struct Functions {
    refused: Refusal,
    /// Whether calls go to the native module (see [`Native`]).
    native: Native,
    /// One `FUNCTION LOAD` at a time, and how many were made: a call that
    /// met the missing function while another loaded it calls again rather
    /// than loading it once more (after a `FUNCTION FLUSH`, every call in
    /// flight meets it, and each load compiles the library anew, on every
    /// master of a cluster, and is sent to every replica).
    loading: tokio::sync::Mutex<()>,
    loads: AtomicU64,
    /// While the server takes no writes (see [`refuses_writes`] and
    /// [`refused_for_now`]), it refuses the module's command, FCALL and
    /// `FUNCTION LOAD` before they run, while the plain script still answers
    /// denials: sent with every call, they would cost a round trip each, and
    /// the load the whole library. (On Redis Cluster, one master refusing
    /// pauses them on all: the script decides there as well.)
    writes_refused: Pause,
}

/// A short while in which calls go by EVALSHA alone, set when the server
/// refuses writes for now.
#[derive(Debug, Default)]
struct Pause {
    /// Until when, in milliseconds since [`EPOCH`]; 0 when not paused.
    until: AtomicU64,
}

/// How long calls go by EVALSHA alone after the server refused a write.
const PAUSE_MILLIS: u64 = 1_000;

impl Pause {
    fn is_on(&self) -> bool {
        let until = self.until.load(Ordering::Relaxed);
        until != 0 && monotonic_millis() < until
    }

    fn start(&self) {
        self.until
            .store(monotonic_millis() + PAUSE_MILLIS, Ordering::Relaxed);
    }
}

fn monotonic_millis() -> u64 {
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Whether a server refused a way of calling (the native module, the
/// function), and when to try it again: a minute after the refusal, for one
/// call, on the monotonic clock (a wall clock stepped back would put the
/// next try off by as much).
#[derive(Debug, Default)]
struct Refusal {
    /// When to try again, in seconds since [`EPOCH`] plus one; 0 while
    /// the way answers (or before it was first tried).
    retry_at: AtomicU64,
    /// Whether the refusal was logged since the way last answered.
    logged: AtomicBool,
}

/// How long a server that refused a way of calling is not asked again.
const RETRY_SECS: u64 = 60;

/// The start of [`Refusal`]'s clock.
static EPOCH: Lazy<std::time::Instant> = Lazy::new(std::time::Instant::now);

fn monotonic_secs() -> u64 {
    // Plus one: 0 stands for "not refused".
    EPOCH.elapsed().as_secs() + 1
}

impl Refusal {
    /// Whether to call this way: while it answers, and once a refusal is
    /// [`RETRY_SECS`] old, for one call only (which tries again).
    fn worth_trying(&self) -> bool {
        self.worth_trying_at(monotonic_secs())
    }

    fn worth_trying_at(&self, now: u64) -> bool {
        let retry_at = self.retry_at.load(Ordering::Relaxed);
        retry_at == 0
            || (now >= retry_at
                && self
                    .retry_at
                    .compare_exchange(
                        retry_at,
                        now + RETRY_SECS,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    )
                    .is_ok())
    }

    /// The way answered: whether it had been refused.
    fn answered(&self) -> bool {
        if self.retry_at.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.retry_at.store(0, Ordering::Relaxed);
        self.logged.store(false, Ordering::Relaxed);
        true
    }

    /// The way was refused: whether this is the first refusal since it last
    /// answered (to be logged).
    fn refused(&self) -> bool {
        self.refused_at(monotonic_secs())
    }

    fn refused_at(&self, now: u64) -> bool {
        self.retry_at.store(now + RETRY_SECS, Ordering::Relaxed);
        !self.logged.swap(true, Ordering::Relaxed)
    }
}

/// Whether a server runs the native module (`ratelimit-module`) of this
/// wire version: found by calling it. A server that refuses it (no module,
/// another version, an ACL user without the command) is asked again a minute
/// later, so a limiter finds the module once it is loaded. Each server the
/// limiter connects to (a master it fails over to) starts with its own.
#[derive(Debug, Default)]
struct Native(Refusal);

impl Native {
    fn worth_asking(&self) -> bool {
        self.0.worth_trying()
    }

    fn answered(&self) {
        if self.0.answered() {
            tracing::info!("this Redis runs the native module: deciding with it");
        }
    }

    /// The module is not there, or not for this call's user or version. The
    /// log names the error's code alone (the reply to an unknown command
    /// quotes its arguments, which hold keys).
    fn refused(&self, error: &redis::RedisError) {
        if self.0.refused() {
            tracing::debug!(
                code = error.code().unwrap_or("none"),
                "this Redis does not run the native module of this version; deciding with the \
                 Lua function (asked again in a minute)"
            );
        }
    }
}

impl Functions {
    /// EVALSHA, but for one call a minute. The log names the error's code
    /// alone: a reply to an unknown command quotes the call's arguments,
    /// which hold keys.
    fn refuse(&self, error: &redis::RedisError) {
        if self.refused.refused() {
            tracing::info!(
                code = error.code().unwrap_or("none"),
                "this Redis does not run the limiter as a function (FCALL or FUNCTION LOAD \
                 refused); calling it by EVALSHA (FCALL tried again in a minute)"
            );
        }
    }

    fn answered(&self) {
        if self.refused.answered() {
            tracing::info!("this Redis runs the limiter as a function again: calling it by FCALL");
        }
    }
}

/// One call of the script: its keys and arguments, sent to the native
/// module, as FCALL of the library or as EVALSHA of `script`.
pub(crate) struct ScriptCall {
    script: &'static redis::Script,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    /// On Redis Cluster, the slot whose master a call without keys goes to
    /// (a batch); a call with keys goes to its first key's.
    #[cfg(feature = "cluster")]
    slot: Option<u16>,
    /// On Redis Cluster, the master (host and port) the limiter's own slot
    /// map gives the call's keys: sent there, rather than where the cluster
    /// client's map says, which only a redirect corrects, and which a
    /// master frozen or cut off never sends.
    #[cfg(feature = "cluster")]
    node: Option<(String, u16)>,
}

impl ScriptCall {
    pub(crate) fn new(script: &'static redis::Script) -> Self {
        Self {
            script,
            keys: Vec::new(),
            args: Vec::new(),
            #[cfg(feature = "cluster")]
            slot: None,
            #[cfg(feature = "cluster")]
            node: None,
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

    /// The call's arguments after its keys, as sent.
    #[cfg(test)]
    pub(super) fn args(&self) -> &[Vec<u8>] {
        &self.args
    }

    /// Sends the call to `slot`'s master on Redis Cluster.
    #[cfg(feature = "cluster")]
    pub(super) fn sent_to_slot(&mut self, slot: u16) -> &mut Self {
        self.slot = Some(slot);
        self
    }

    /// Sends the call to the master at `address` (`host:port`) on Redis
    /// Cluster, where the limiter's slot map puts its keys.
    #[cfg(feature = "cluster")]
    pub(crate) fn sent_to_node(&mut self, address: &str) -> &mut Self {
        self.node = address
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)));
        self
    }

    /// The call as routed by the cluster client's slot map, after the node
    /// the limiter's map named refused it (the slot moved since); `None`
    /// when it was so routed already.
    #[cfg(feature = "cluster")]
    pub(crate) fn by_slot_map(&self) -> Option<Self> {
        self.node.as_ref()?;
        Some(Self {
            script: self.script,
            keys: self.keys.clone(),
            args: self.args.clone(),
            slot: self.slot,
            node: None,
        })
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

    /// The call as the native module's command: the same keys and
    /// arguments after the wire version and the keys' count.
    fn native(&self) -> redis::Cmd {
        let mut native = redis::cmd("RATELIMIT.DECIDE");
        native
            .arg(crate::wire_version::WIRE_VERSION)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        native
    }

    fn evalsha(&self) -> redis::Cmd {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha
            .arg(self.script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        evalsha
    }
}

/// A connection the calls go out on.
pub(crate) trait Connection: redis::aio::ConnectionLike + Send {
    /// Sends `command` to the server `call` goes to, and returns its reply
    /// as it came: `call` itself in one of its forms, or the library's load,
    /// which on Redis Cluster goes to that master alone, not to every
    /// master, one of which may not answer.
    fn send_where(
        &mut self,
        command: redis::Cmd,
        call: &ScriptCall,
    ) -> impl std::future::Future<Output = redis::RedisResult<redis::Value>> + Send;

    /// Sends `command`, which is `call` in one of its forms, where `call`
    /// is decided.
    fn send(
        &mut self,
        command: redis::Cmd,
        call: &ScriptCall,
    ) -> impl std::future::Future<Output = redis::RedisResult<Vec<i64>>> + Send {
        async move {
            Ok(redis::from_redis_value(
                self.send_where(command, call).await?,
            )?)
        }
    }
}

impl Connection for redis::aio::ConnectionManager {
    async fn send_where(
        &mut self,
        command: redis::Cmd,
        _call: &ScriptCall,
    ) -> redis::RedisResult<redis::Value> {
        command.query_async(self).await
    }
}

#[cfg(feature = "cluster")]
impl Connection for redis::cluster_async::ClusterConnection {
    /// Sent to the master the limiter's slot map names, else to the master
    /// of the call's slot, or of its first key's: the cluster client would
    /// route the native command by its first argument (the wire version),
    /// and a call without keys to any node. A master the client keeps no
    /// connection to fails the call unrun (`ClusterConnectionNotFound`),
    /// which goes again by the client's map (see `by_slot_map`).
    async fn send_where(
        &mut self,
        command: redis::Cmd,
        call: &ScriptCall,
    ) -> redis::RedisResult<redis::Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let routing = match (&call.node, call.slot) {
            (Some((host, port)), _) => SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            },
            (None, Some(slot)) => {
                SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
            }
            (None, None) => SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                call.keys.first().map_or(&[][..], Vec::as_slice),
                SlotAddr::Master,
            )),
        };
        // A server's error reply comes back as a value here.
        self.route_command(command, RoutingInfo::SingleNode(routing))
            .await?
            .extract_error()
    }
}

/// Runs `call`, as FCALL while `functions` allows, loading the library when
/// the server has not got it (first use, a restart, `FUNCTION FLUSH`), and
/// otherwise, or when Redis is out of memory, as EVALSHA. Errors are told
/// apart by redis-rs's kinds and Redis's codes, never by their text. A flush
/// landing between a load and the call it serves makes the call fail as
/// before the load, so each is tried a couple more times rather than
/// reported as a backend failure.
pub(crate) async fn invoke<C: Connection>(
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

pub(super) async fn invoke_once<C: Connection>(
    call: &ScriptCall,
    connection: &mut C,
    functions: &Functions,
) -> Result<Vec<i64>, redis::RedisError> {
    if functions.writes_refused.is_on() {
        return evalsha(call, connection).await;
    }
    let native = &functions.native;
    if native.worth_asking() {
        match connection.send(call.native(), call).await {
            Ok(reply) => {
                native.answered();
                return Ok(reply);
            }
            // Unknown here (an `ERR` before anything ran), or another
            // version: the function decides instead.
            // Nothing else falls back: a call the module failed may have
            // written, and must not be applied twice.
            Err(error) if matches!(error.code(), Some("ERR" | "RLWIRE")) => native.refused(&error),
            // Not allowed the command, or the keys: the function either
            // decides, and does until the module is asked again, or is
            // refused the keys too, and says so (the module stays).
            Err(error) if is_no_perm(&error) => {
                let result = invoke_function(call, connection, functions).await;
                if !result.as_ref().is_err_and(is_no_perm) {
                    native.refused(&error);
                }
                return result;
            }
            // Arguments the module refused before deciding anything: this
            // call goes to the function, which says what it makes of them.
            Err(error) if error.code() == Some("RLARGS") => {}
            // Refused before it ran, as the function is, while Redis takes
            // no writes (see `refuses_writes`): the script decides, as it
            // does for a function.
            Err(error) if refuses_writes(&error) => {
                functions.writes_refused.start();
                return evalsha(call, connection).await;
            }
            Err(error) => return Err(error),
        }
    }
    invoke_function(call, connection, functions).await
}

/// Whether FCALL's `error` says the function was not called: no such
/// function, or no FCALL command. Not a command the function called that
/// the server does not know (renamed away), which Valkey reports as
/// "Unknown command called from script": the function ran, and may have
/// written before it.
fn not_called(error: &redis::RedisError) -> bool {
    error.code() == Some("ERR")
        && error.detail().is_some_and(|detail| {
            let detail = detail.trim_start().to_ascii_lowercase();
            // Redis 7 quotes the command with `'`, Redis before 7 (which
            // has no FCALL) with a backtick.
            detail.starts_with("function not found")
                || detail.starts_with("unknown command 'fcall'")
                || detail.starts_with("unknown command `fcall`")
        })
}

/// Whether `error` refuses a write for a while only: the server takes no
/// writes for now (out of memory, short of replicas, a failed save), or is
/// running a script, a replica, or loading.
fn refused_for_now(error: &redis::RedisError) -> bool {
    refuses_writes(error)
        || matches!(
            error.code(),
            Some("BUSY" | "READONLY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN")
        )
}

fn is_no_perm(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
}

/// Runs `call` as FCALL, or by EVALSHA (see [`invoke`]).
async fn invoke_function<C: Connection>(
    call: &ScriptCall,
    connection: &mut C,
    functions: &Functions,
) -> Result<Vec<i64>, redis::RedisError> {
    if !functions.refused.worth_trying() {
        return evalsha(call, connection).await;
    }
    let mut loads = 0;
    loop {
        // The loads made before this call: one made since it met the
        // missing function put it there.
        let loaded = functions.loads.load(Ordering::Acquire);
        match connection.send(call.fcall(), call).await {
            // The function is missing (never loaded here, flushed, a
            // restart), or FCALL cannot run (Redis before 7.0, the command
            // renamed away): the load fails where FUNCTION is unknown, and
            // FCALL failing so again after two loads (one may meet a flush
            // landing between the load and the call) cannot run here;
            // EVALSHA decides from then on. Any other error is the call's
            // own, from a function that ran and may have written before it
            // failed (a command the user may not run, say): it is the
            // answer, never a reason to run the call again.
            Err(error) if not_called(&error) => {
                if loads == 2 {
                    functions.refuse(&error);
                    break;
                }
                let _turn = functions.loading.lock().await;
                // Loaded since this call met the gap (on Redis Cluster,
                // perhaps on another master: then it meets the gap again,
                // and loads the library where it goes).
                if functions.loads.load(Ordering::Acquire) != loaded {
                    continue;
                }
                loads += 1;
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&LIBRARY.code);
                match connection.send_where(load, call).await {
                    Ok(_) => {
                        functions.loads.fetch_add(1, Ordering::AcqRel);
                    }
                    // Not sent, or lost on the way: the call's own error.
                    Err(error)
                        if error.is_io_error()
                            || error.is_timeout()
                            || error.kind() == redis::ErrorKind::ClusterConnectionNotFound =>
                    {
                        return Err(error)
                    }
                    // Refused for now (over `maxmemory`, too few
                    // replicas to write, a script running, a replica or a
                    // server still loading): this call, and those of the
                    // next second, go by EVALSHA, which needs no load.
                    Err(error) if refused_for_now(&error) => {
                        functions.writes_refused.start();
                        break;
                    }
                    // No FUNCTION command, not allowed, or a Lua that
                    // rejects the library.
                    Err(error) => {
                        functions.refuse(&error);
                        break;
                    }
                }
            }
            // Not allowed to call functions, or the keys: EVALSHA either
            // decides, and does from then on, or is refused the keys too,
            // and says so (the function stays: the keys were refused).
            Err(error) if is_no_perm(&error) => {
                let result = evalsha(call, connection).await;
                if !result.as_ref().is_err_and(is_no_perm) {
                    functions.refuse(&error);
                }
                return result;
            }
            // While Redis takes no writes, it refuses a function that may
            // write before it runs, while the plain script runs until it
            // writes: a call that only denies is still answered that way.
            Err(error) if refuses_writes(&error) => {
                functions.writes_refused.start();
                break;
            }
            result => {
                if result.is_ok() {
                    functions.answered();
                }
                return result;
            }
        }
    }
    evalsha(call, connection).await
}

/// Runs `call` by EVALSHA, loading the script when the server has not got
/// it (a cluster client loads it on every node).
async fn evalsha<C: Connection>(
    call: &ScriptCall,
    connection: &mut C,
) -> Result<Vec<i64>, redis::RedisError> {
    let mut loads = 0;
    loop {
        match connection.send(call.evalsha(), call).await {
            // A flush may land between a load and the call: a few tries.
            Err(error)
                if loads < 3
                    && error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                loads += 1;
                call.script.load_async(connection).await?;
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A way refused is tried again a minute on, by one call, and for good
    /// once it answers; its refusal is logged once until then.
    #[test]
    fn a_refused_way_is_tried_again_by_one_call_a_minute() {
        let way = Refusal::default();
        assert!(way.worth_trying_at(10), "tried until refused");
        assert!(way.refused_at(10), "the first refusal is logged");
        assert!(!way.worth_trying_at(10 + RETRY_SECS - 1));
        assert!(way.worth_trying_at(10 + RETRY_SECS), "a minute on");
        assert!(
            !way.worth_trying_at(10 + RETRY_SECS),
            "by one call: the others wait another minute"
        );
        assert!(!way.refused_at(10 + RETRY_SECS), "logged once");
        assert!(way.worth_trying_at(10 + 2 * RETRY_SECS));
        assert!(way.answered(), "answered after a refusal");
        assert!(way.worth_trying_at(10 + 2 * RETRY_SECS));
        assert!(way.worth_trying_at(10 + 2 * RETRY_SECS), "by every call");
        assert!(!way.answered(), "nothing refused since");
        assert!(way.refused_at(500), "a new refusal is logged again");
    }

    /// A server with no FCALL (Redis before 7.0, which quotes the command
    /// with backticks, or one that renamed it away) did not run the
    /// function: the call goes by `EVALSHA`. (Redis 6's wording was read as
    /// the call's own failure, and every decision failed.)
    #[test]
    fn a_server_without_fcall_did_not_call_the_function() {
        use crate::error::tests::server_error;
        for line in [
            "ERR unknown command 'FCALL', with args beginning with: 'ratelimit_x' '1' ",
            "ERR unknown command `FCALL`, with args beginning with: `ratelimit_x`, `1`, ",
            "ERR unknown command `fcall`, with args beginning with: ",
            "ERR Function not found",
        ] {
            assert!(not_called(&server_error(line)), "{line}");
        }
        for line in [
            "ERR Unknown command called from script script: ...",
            "ERR unknown command `SET`, with args beginning with: ",
            "NOPERM this user has no permissions to run the 'fcall' command",
        ] {
            assert!(!not_called(&server_error(line)), "{line}");
        }
    }

    /// `ping`'s ACL check asks about every command the scripts run: one
    /// the scripts come to run, missing from the check, would pass `ping`
    /// and fail the first decision that runs it.
    #[test]
    fn the_acl_check_names_every_command_the_scripts_run() {
        let scripts = script_body!();
        let check = ACL_CHECK_TEXT.as_str();
        let mut named = 0;
        for (at, _) in scripts.match_indices("call('") {
            let rest = &scripts[at + 6..];
            let command = &rest[..rest.find('\'').unwrap()];
            assert!(
                check.contains(&format!("{{'{command}'")),
                "{command} is not checked"
            );
            named += 1;
        }
        assert!(named > 10, "the scripts' commands were found: {named}");
    }

    /// The native module decides in the format of these scripts, and a
    /// module of another format refuses the call: a change of the scripts
    /// names the format anew (`wire_version::WIRE_VERSION`, and this hash).
    #[test]
    fn the_native_wire_version_names_these_scripts() {
        assert_eq!(
            SCRIPT.get_hash(),
            crate::wire_version::WIRE_SCRIPTS_SHA1,
            "the scripts changed: give wire_version::WIRE_VERSION a new number and \
             WIRE_SCRIPTS_SHA1 this hash"
        );
    }
}
