//! The script: the Lua files as one EVALSHA script and as one function
//! library, and how a call is sent (FCALL while the server runs the library,
//! else EVALSHA).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use once_cell::sync::Lazy;

use crate::clock::Clock as _;

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
/// EVALSHA.
#[derive(Debug, Default)]
pub(crate) struct Functions {
    refused: AtomicBool,
    /// Whether calls may go to the native module (see [`Native`]): on one
    /// server, not on a cluster, whose client routes a command it does not
    /// know by its first argument.
    native: Option<Native>,
}

/// Whether a server runs the native module (`ratelimit-module`) of this
/// wire version: found by calling it. A server that refuses it (no module,
/// another version, an ACL user without the command) is asked again a minute
/// later, so a limiter finds the module on a server it fails over to, or
/// once it is loaded.
#[derive(Debug, Default)]
struct Native {
    /// When to ask again, in seconds since the Unix epoch; 0 while the
    /// module answers (or before it was first asked).
    retry_at: AtomicU64,
    /// Whether the refusal was logged since the module last answered.
    logged: AtomicBool,
}

/// How long a server that refused the module is not asked again.
const NATIVE_RETRY_SECS: u64 = 60;

fn unix_secs() -> u64 {
    crate::clock::SystemClock.now_micros() / 1_000_000
}

impl Native {
    /// Whether to send this call to the module: while it answers, and once
    /// a refusal is a minute old, for one call only (which asks again).
    fn worth_asking(&self) -> bool {
        let retry_at = self.retry_at.load(Ordering::Relaxed);
        if retry_at == 0 {
            return true;
        }
        let now = unix_secs();
        now >= retry_at
            && self
                .retry_at
                .compare_exchange(
                    retry_at,
                    now + NATIVE_RETRY_SECS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    fn answered(&self) {
        if self.retry_at.load(Ordering::Relaxed) != 0 {
            self.retry_at.store(0, Ordering::Relaxed);
            self.logged.store(false, Ordering::Relaxed);
            tracing::info!("this Redis runs the native module: deciding with it");
        }
    }

    /// The module is not there, or not for this call's user or version. The
    /// log names the error's code alone (the reply to an unknown command
    /// quotes its arguments, which hold keys).
    fn refused(&self, error: &redis::RedisError) {
        self.retry_at
            .store(unix_secs() + NATIVE_RETRY_SECS, Ordering::Relaxed);
        if !self.logged.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                code = error.code().unwrap_or("none"),
                "this Redis does not run the native module of this version; deciding with the \
                 Lua function (asked again in a minute)"
            );
        }
    }
}

impl Functions {
    /// A server's: calls go to the native module where it runs.
    pub(crate) fn with_native() -> Self {
        Self {
            native: Some(Native::default()),
            ..Self::default()
        }
    }

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

    /// The call as the native module's command: the same keys and
    /// arguments after the wire version and the keys' count.
    fn native(&self) -> redis::Cmd {
        let mut native = redis::cmd("RATELIMIT.DECIDE");
        native
            .arg(crate::native::WIRE_VERSION)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        native
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

pub(super) async fn invoke_once<C: redis::aio::ConnectionLike>(
    call: &ScriptCall,
    connection: &mut C,
    functions: &Functions,
) -> Result<Vec<i64>, redis::RedisError> {
    // Cluster batches ('batch' mode) are the function's alone.
    if let Some(native) = &functions.native {
        if native.worth_asking() && call.args.first().map(Vec::as_slice) != Some(b"batch") {
            match call.native().query_async(connection).await {
                Ok(reply) => {
                    native.answered();
                    return Ok(reply);
                }
                // Unknown here (an `ERR` before anything ran), another
                // version, or not allowed: the function decides instead.
                // Nothing else falls back: a call the module failed may have
                // written, and must not be applied twice.
                Err(error)
                    if matches!(error.code(), Some("ERR" | "RLWIRE"))
                        || error.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
                {
                    native.refused(&error)
                }
                // Arguments the module refused before deciding anything: this
                // call goes to the function, which says what it makes of them.
                Err(error) if error.code() == Some("RLARGS") => {}
                // Over `maxmemory`, refused before it ran, as the function
                // is: the script decides, as it does for a function.
                Err(error) if error.code() == Some("OOM") => {
                    return evalsha(call, connection).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
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
    evalsha(call, connection).await
}

/// Runs `call` by EVALSHA, loading the script when the server has not got it.
async fn evalsha<C: redis::aio::ConnectionLike>(
    call: &ScriptCall,
    connection: &mut C,
) -> Result<Vec<i64>, redis::RedisError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The native module decides in the format of these scripts, and a
    /// module of another format refuses the call: a change of the scripts
    /// names the format anew (`native::WIRE_VERSION`, and this hash).
    #[test]
    fn the_native_wire_version_names_these_scripts() {
        assert_eq!(
            SCRIPT.get_hash(),
            crate::native::WIRE_SCRIPTS_SHA1,
            "the scripts changed: give native::WIRE_VERSION a new number and \
             WIRE_SCRIPTS_SHA1 this hash"
        );
    }
}
