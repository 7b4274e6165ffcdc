//! The writes a call sends replicas and the AOF: what the script's `PSETEX`
//! and `DEL` did, with each expiry as an instant (as Redis propagates a
//! relative one), so a replica and a reloaded AOF expire a key when the
//! master does.
//!
//! A call's writes of string values go out together when it ends: one write
//! as `SET key value PXAT <ms>` (or `DEL key`), several as one `EVAL` of
//! [`SCRIPT`] over all of them. `RedisModule_Replicate` finds its command by
//! name and builds an object of each argument, each time: under callgrind,
//! a `SET` sent for each of a call's 20 decisions was almost half of what the
//! module's command cost Redis. One `EVAL` finds its command once a call,
//! and takes the keys as the call's own strings. A replica runs the script
//! with no module: it needs only what the limiter's function path needs.

use std::os::raw::{c_char, c_longlong};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use ratelimit_core::native::Value;
use redis_module::raw;

/// Sets each key to its value, expiring at its instant in ms, or deletes it
/// where the value is `-`: `KEYS`, then one argument holding a value and an
/// instant for each key, all separated by spaces. (Values are digits and
/// colons; one argument, not two a key, is one string to make, not dozens.)
const SCRIPT: &str = "local i = 0 \
for value, at in string.gmatch(ARGV[1], '(%S+) (%S+)') do \
i = i + 1 \
if value == '-' then redis.call('DEL', KEYS[i]) \
else redis.call('SET', KEYS[i], value, 'PXAT', at) end end";

/// [`SCRIPT`] as a string Redis keeps (made once, when the module loads):
/// sent with each `EVAL` by reference, not copied.
static SCRIPT_STRING: AtomicPtr<raw::RedisModuleString> = AtomicPtr::new(ptr::null_mut());

/// Makes the script's string; called when the module loads.
pub(crate) fn init() {
    // SAFETY: a string made with no context, kept for the server's life.
    let string = unsafe {
        raw::RedisModule_CreateString.unwrap()(
            ptr::null_mut(),
            SCRIPT.as_ptr().cast::<c_char>(),
            SCRIPT.len(),
        )
    };
    SCRIPT_STRING.store(string, Ordering::Release);
}

/// One call's writes of string keys, in the order made.
pub(crate) struct Writes {
    /// Each write's key (its string in the call), where its value is in
    /// `pairs` (start and length), and its expiry instant in ms; `None`
    /// deletes the key.
    writes: Vec<(
        *mut raw::RedisModuleString,
        usize,
        usize,
        Option<c_longlong>,
    )>,
    /// The script's argument: `<value> <instant> ` for each write.
    pairs: Vec<u8>,
}

impl Writes {
    /// Room for a write of each of `keys` keys: nothing grows in a call
    /// whose values are of usual lengths.
    pub(crate) fn with_capacity(keys: usize) -> Self {
        Self {
            writes: Vec::with_capacity(keys),
            pairs: Vec::with_capacity(keys * 48),
        }
    }

    /// Key `key` set to `value`, expiring at `at` ms. A `Value` is digits
    /// and colons: never empty, never `-`, and no space in it.
    pub(crate) fn set(&mut self, key: *mut raw::RedisModuleString, value: &Value, at: u64) {
        let at = c_longlong::try_from(at).unwrap_or(c_longlong::MAX);
        let value = value.as_bytes();
        let start = self.pairs.len();
        self.pairs.extend_from_slice(value);
        self.pairs.push(b' ');
        self.pairs
            .extend_from_slice(itoa::Buffer::new().format(at).as_bytes());
        self.pairs.push(b' ');
        self.writes.push((key, start, value.len(), Some(at)));
    }

    /// Key `key` deleted.
    pub(crate) fn delete(&mut self, key: *mut raw::RedisModuleString) {
        let start = self.pairs.len();
        self.pairs.extend_from_slice(b"- 0 ");
        self.writes.push((key, start, 0, None));
    }

    /// Sends the writes made so far, and forgets them.
    ///
    /// # Safety
    ///
    /// `ctx` is the context of the command whose strings the keys are.
    pub(crate) unsafe fn send(&mut self, ctx: *mut raw::RedisModuleCtx) {
        let script = SCRIPT_STRING.load(Ordering::Acquire);
        let sent = match self.writes.len() {
            0 => true,
            1 => false,
            _ if script.is_null() => false,
            // SAFETY: as this function's.
            _ => unsafe { self.send_script(ctx, script) },
        };
        if !sent {
            // One write, or a server whose `EVAL` is renamed away: a command
            // each.
            for index in 0..self.writes.len() {
                // SAFETY: as this function's.
                unsafe { self.send_one(ctx, index) };
            }
        }
        self.writes.clear();
        self.pairs.clear();
    }

    /// Sends write `index` as `SET` or `DEL`.
    unsafe fn send_one(&self, ctx: *mut raw::RedisModuleCtx, index: usize) {
        let (key, start, len, at) = self.writes[index];
        let value = &self.pairs[start..start + len];
        // SAFETY: a command's context and one of its strings; the formats
        // match the arguments (a buffer and its length, a C string, a
        // number).
        unsafe {
            match at {
                Some(at) => raw::RedisModule_Replicate.unwrap()(
                    ctx,
                    c"SET".as_ptr(),
                    c"sbcl".as_ptr(),
                    key,
                    value.as_ptr().cast::<c_char>(),
                    value.len(),
                    c"PXAT".as_ptr(),
                    at,
                ),
                None => {
                    raw::RedisModule_Replicate.unwrap()(ctx, c"DEL".as_ptr(), c"s".as_ptr(), key)
                }
            };
        }
    }

    /// Sends every write as one `EVAL`; `false` if Redis knows no `EVAL`
    /// (then nothing was sent).
    unsafe fn send_script(
        &self,
        ctx: *mut raw::RedisModuleCtx,
        script: *mut raw::RedisModuleString,
    ) -> bool {
        let mut keys: Vec<*mut raw::RedisModuleString> =
            self.writes.iter().map(|&(key, ..)| key).collect();
        let pairs = self.pairs.strip_suffix(b" ").unwrap_or(&self.pairs);
        // SAFETY: a command's context; the script's string, a number, an
        // array of strings and its length, and a buffer and its length, as
        // the formats say.
        let status = unsafe {
            raw::RedisModule_Replicate.unwrap()(
                ctx,
                c"EVAL".as_ptr(),
                c"slvb".as_ptr(),
                script,
                keys.len() as c_longlong,
                keys.as_mut_ptr(),
                keys.len(),
                pairs.as_ptr().cast::<c_char>(),
                pairs.len(),
            )
        };
        status == raw::REDISMODULE_OK as i32
    }
}
