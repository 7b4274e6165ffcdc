//! A Redis (7.0 and later) and Valkey module deciding the checks of
//! [distributed-ratelimit](https://docs.rs/distributed-ratelimit)'s limiter
//! in Rust: the command `RATELIMIT.DECIDE` takes what the limiter's Lua
//! function takes and answers what it answers, reading and writing the same
//! keys and values, so clients on either path share the same limits. The
//! arithmetic is `ratelimit-core`'s own, the code its memory backend runs.
//!
//! ```text
//! RATELIMIT.DECIDE <wire version> <numkeys> <key>... <mode> [<fields>...]
//! ```
//!
//! The arguments after the keys and the reply are those of the function
//! (`ratelimit-core/scripts/entry.lua`), in the modes `each`, `all`, `peek`,
//! `runs`, `refund` and Redis Cluster's `batch` (keys of several slots of
//! one node). A call of another wire version is refused with an error
//! starting `RLWIRE`, and the limiter calls the function instead.
//!
//! Load it with `redis-server --loadmodule /path/to/libratelimit_module.so`
//! (see the guide's chapter on the native module). Writes reach replicas and
//! the AOF as commands any Redis runs: a call's writes of string values as
//! one `SET ... PXAT` or `DEL`, or one `EVAL` of them all, and the sliding
//! log's sorted-set commands.

#![deny(missing_docs)]

mod args;
mod key;
mod log;
mod replicate;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use args::{number, plan, Mode, Plan};
use key::Key;
use ratelimit_core::native::{Group, Refunded, Value, WIRE_VERSION};
use ratelimit_core::{Clock as _, SystemClock};
use redis_module::{
    raw, Context, ContextFlags, KeyType, RedisError, RedisResult, RedisString, RedisValue,
};

/// The command: see the crate's documentation. A panic is the call's error,
/// never the server's end.
fn decide(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    catch_unwind(AssertUnwindSafe(|| decide_call(ctx, args))).unwrap_or_else(|_| {
        Err(RedisError::Str(
            "RLFAIL the module failed on this call; please report it",
        ))
    })
}

fn decide_call(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    // Where the keys are, for ACLs and Redis Cluster: after the version and
    // their count.
    if ctx.is_keys_position_request() {
        if let Some(count) = args.get(2).and_then(|a| number(a).ok()) {
            let last = usize::try_from(count)
                .ok()
                .and_then(|n| n.checked_add(3))
                .map_or(args.len(), |n| n.min(args.len()));
            for position in 3..last {
                ctx.key_at_pos(position as i32);
            }
        }
        return Ok(RedisValue::NoReply);
    }
    if args.len() < 4 {
        return Err(RedisError::WrongArity);
    }
    let version = number(&args[1])?;
    if version != WIRE_VERSION {
        return Err(RedisError::String(format!(
            "RLWIRE this module decides wire version {WIRE_VERSION}, not {version}"
        )));
    }
    let count = usize::try_from(number(&args[2])?)
        .ok()
        .filter(|&n| n <= args.len() - 4)
        .ok_or(RedisError::WrongArity)?;
    let mut args = args.into_iter().skip(3);
    let mut keys: Vec<RedisString> = args.by_ref().take(count).collect();
    let mut argv: Vec<RedisString> = args.collect();
    let plan = plan(&argv, keys.len())?;
    let mut out = Vec::new();
    if let Some(count) = plan.batch {
        // The batch's keys: the call names none.
        keys = argv.drain(2..2 + count).collect();
        let elsewhere = elsewhere(ctx, &keys)?;
        if !elsewhere.is_empty() {
            out.push(elsewhere.len() as i64);
            out.extend(elsewhere);
            return Ok(RedisValue::Array(
                out.into_iter().map(RedisValue::Integer).collect(),
            ));
        }
        out.push(0);
    }
    // An inspection writes nothing; the sliding log reads its sorted sets
    // itself, so every write must have landed before it reads.
    let coalesced =
        !(plan.mode == Mode::Peek || plan.groups.iter().any(|p| p.group.is_sliding_log()));
    let repeats = if coalesced {
        repeats(&keys)
    } else {
        vec![None; keys.len()]
    };
    // Five numbers a key's answer; a write of each key at most.
    out.reserve(5 * keys.len());
    let writes = replicate::Writes::with_capacity(keys.len());
    let mut call = Call {
        ctx,
        keys,
        out,
        batch: plan.batch.is_some(),
        denied: false,
        held: Vec::new(),
        repeats,
        coalesced,
        pending: Vec::new(),
        grace: false,
        // The clock Redis's TIME reads.
        time: SystemClock.now_micros(),
        writes,
    };
    call.held.resize_with(call.keys.len(), || None);
    call.pending.resize_with(call.keys.len(), || None);
    let decided = call.run(plan);
    // Even after an error: what was decided stays decided, as a script's
    // writes before its error do.
    let stored = call.store_pending();
    decided.and(stored)?;
    Ok(RedisValue::Array(
        std::mem::take(&mut call.out)
            .into_iter()
            .map(RedisValue::Integer)
            .collect(),
    ))
}

/// For each key the call names more than once, the index where it first
/// appears; `None` for the others. A hot key (a global limit every check of
/// a batch names) is then read and written once a call, not once a check.
fn repeats(keys: &[RedisString]) -> Vec<Option<usize>> {
    let mut repeats = vec![None; keys.len()];
    if keys.len() < 2 {
        return repeats;
    }
    // foldhash, seeded for each process: cheap for a short key, and no
    // caller can choose keys that collide.
    let mut first = hashbrown::HashMap::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let at = *first.entry(key.as_slice()).or_insert(i);
        if at != i {
            repeats[at] = Some(at);
            repeats[i] = Some(at);
        }
    }
    repeats
}

/// The keys of a batch (from 1) that this node must not decide: those the
/// calling user may not read and write, and on Redis Cluster those it may
/// not write now (a slot moved, migrating, importing, or the cluster down),
/// which a command's own keys are checked for before it runs. Asked of every
/// key before anything is written, so a batch is refused whole: the client
/// sends those keys on their own, and the rest again.
fn elsewhere(ctx: &Context, keys: &[RedisString]) -> Result<Vec<i64>, RedisError> {
    let user = User::current(ctx)?;
    let cluster = ctx.get_flags().contains(ContextFlags::CLUSTER);
    Ok(keys
        .iter()
        .enumerate()
        .filter(|(_, key)| !user.may_write(key) || (cluster && !served_here(ctx, key)))
        .map(|(i, _)| i as i64 + 1)
        .collect())
}

/// Whether this cluster node may write `key` now, asked as Redis asks for a
/// script's write: a module's call of a write command on a key of a slot the
/// node does not serve (or only with an `ASK` for another key), or while the
/// cluster is down, is refused before it runs, with no reply. (The crate's
/// `call` reads no reply as a success.) `SETRANGE key 0 ""` is a write that
/// changes nothing: it neither creates the key nor touches a value.
fn served_here(ctx: &Context, key: &RedisString) -> bool {
    // SAFETY: a command's context and a string of this call; the reply is
    // freed once.
    unsafe {
        let reply = raw::RedisModule_Call.unwrap()(
            ctx.ctx,
            c"SETRANGE".as_ptr(),
            c"scc".as_ptr(),
            key.inner,
            c"0".as_ptr(),
            c"".as_ptr(),
        );
        if reply.is_null() {
            return false;
        }
        // An error reply (a key of another type) is this node's key all the
        // same: the decision finds it foreign.
        raw::RedisModule_FreeCallReply.unwrap()(reply);
        true
    }
}

/// The user a call runs as, for its keys' ACL checks.
struct User(NonNull<raw::RedisModuleUser>);

impl User {
    fn current(ctx: &Context) -> Result<Self, RedisError> {
        let name = ctx.get_current_user();
        // SAFETY: a string of this call; the user is freed on drop.
        let user = unsafe { raw::RedisModule_GetModuleUserFromUserName.unwrap()(name.inner) };
        NonNull::new(user)
            .map(Self)
            .ok_or(RedisError::Str("RLFAIL the calling user is gone"))
    }

    /// Whether the user may read and write `key`, as the command's own keys
    /// are checked.
    fn may_write(&self, key: &RedisString) -> bool {
        let all = raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_INSERT
            | raw::REDISMODULE_CMD_KEY_DELETE
            | raw::REDISMODULE_CMD_KEY_UPDATE;
        // SAFETY: a live user and string.
        let status = unsafe {
            raw::RedisModule_ACLCheckKeyPermissions.unwrap()(self.0.as_ptr(), key.inner, all as _)
        };
        status == raw::REDISMODULE_OK as i32
    }
}

impl Drop for User {
    fn drop(&mut self) {
        // SAFETY: got from GetModuleUserFromUserName, freed once.
        unsafe { raw::RedisModule_FreeModuleUser.unwrap()(self.0.as_ptr()) };
    }
}

impl Drop for Call<'_> {
    /// Whatever the call's end (a reply, an error, a panic caught in
    /// [`decide`]), replicas and the AOF get every write it made.
    fn drop(&mut self) {
        self.send_writes();
    }
}

/// A write an all-or-nothing run holds until every key admits.
enum Held {
    /// A string value and its `PX`, with the key still open when the call
    /// names it once (no other handle can change it meanwhile), so that it
    /// is not looked up again.
    Value(Option<Key>, Value, u64),
    /// The sliding log's admission (see `log.rs`).
    Log(log::Admission),
}

/// The latest write of a key the call names more than once, stored when the
/// call ends: Redis, its replicas and its AOF see the key's final value once,
/// and the call's later decisions read it here.
enum Pending {
    /// A string value and its `PX`.
    Value(Value, u64),
    /// Deleted by a refund.
    Deleted,
}

impl Pending {
    fn value(&self) -> Option<&[u8]> {
        match self {
            Pending::Value(value, _) => Some(value.as_bytes()),
            Pending::Deleted => None,
        }
    }
}

/// The state of one call, as entry.lua keeps it.
struct Call<'c> {
    ctx: &'c Context,
    keys: Vec<RedisString>,
    /// The reply.
    out: Vec<i64>,
    /// Whether this is a cluster batch, whose script reads every key with
    /// `GET` first: a key of another type is foreign whatever the decision.
    batch: bool,
    /// Whether some key of the current run did not admit.
    denied: bool,
    /// Writes held for an all-or-nothing run, by key.
    held: Vec<Option<Held>>,
    /// See [`repeats`].
    repeats: Vec<Option<usize>>,
    /// Whether `repeats` was found: only then is a key it does not name
    /// known to be named once, and its handle kept from its decision to its
    /// write (two handles on one key could see each other's writes free the
    /// value they point to).
    coalesced: bool,
    /// The pending write of each repeated key, at its first index.
    pending: Vec<Option<Pending>>,
    /// Whether the caller's clock decides (then expiries get a second more:
    /// Redis expires keys on its own clock).
    grace: bool,
    /// This server's time in µs, read once a call: the clock of the groups
    /// that send none, and the start of the absolute expiries sent to
    /// replicas.
    time: u64,
    /// The writes of string keys not yet sent to replicas and the AOF.
    writes: replicate::Writes,
}

impl Call<'_> {
    fn run(&mut self, plan: Plan) -> Result<(), RedisError> {
        let Plan {
            mode, runs, groups, ..
        } = plan;
        let mut commit = matches!(mode, Mode::Each | Mode::Runs | Mode::Batch);
        let (mut run, mut run_first) = (0, 0);
        let mut last = 0;
        for planned in groups {
            let first = planned.first;
            last = planned.last;
            if let Some(runs) = &runs {
                // `plan` found every group within a run.
                let all = runs.get(run).is_some_and(|(_, all)| *all);
                commit = !all;
                // An all-or-nothing run is denied by its own keys alone.
                if first == run_first {
                    self.denied = false;
                }
            }
            let now = self.now(planned.now);
            let (group, cost) = (&planned.group, planned.cost);
            for i in first..last {
                if mode == Mode::Refund {
                    self.refund(group, i, now, cost)?;
                } else if group.is_sliding_log() {
                    self.decide_log(group, i, now, cost, commit)?;
                } else {
                    self.decide_value(group, i, now, cost, commit)?;
                }
            }
            if let Some(&(run_last, all)) = runs.as_ref().and_then(|runs| runs.get(run)) {
                if last == run_last {
                    if all && !self.denied {
                        self.release(run_first, last)?;
                    }
                    run += 1;
                    run_first = last;
                }
            }
        }
        if mode == Mode::All && !self.denied {
            self.release(0, last)?;
        }
        Ok(())
    }

    /// The group's clock: the caller's, or this server's time.
    fn now(&mut self, caller: Option<u64>) -> u64 {
        if let Some(now) = caller {
            self.grace = true;
            return now;
        }
        self.time
    }

    /// This call's time in ms, for the absolute expiries written (and sent
    /// to replicas).
    fn unix_ms(&self) -> u64 {
        self.time / 1000
    }

    /// `PX` for state that matters for `ttl_us` more (see `expiry_ms` in
    /// prelude.lua).
    fn px(&self, ttl_us: u64) -> u64 {
        ttl_us.div_ceil(1000) + if self.grace { 1000 } else { 0 }
    }

    /// Decides key `i` of a string-valued algorithm.
    fn decide_value(
        &mut self,
        group: &Group,
        i: usize,
        now: u64,
        cost: u64,
        commit: bool,
    ) -> Result<(), RedisError> {
        let repeat = self.repeats[i];
        let (mut key, other_type, mut verdict) =
            match repeat.and_then(|at| self.pending[at].as_ref()) {
                // This call wrote the key already: a string, or nothing.
                Some(pending) => (None, false, group.decide(pending.value(), now, cost)),
                None => {
                    let key = Key::open(self.ctx, &self.keys[i])?;
                    let other_type = !matches!(key.kind(), KeyType::Empty | KeyType::String);
                    let verdict = if other_type && (!commit || self.batch) {
                        // All or nothing, and a batch, find a key of another
                        // type before they decide.
                        group.foreign()
                    } else {
                        // The 'each' script reads a key of another type as
                        // absent (MGET), and fails to write it (SET NX): below.
                        group.decide(key.value(), now, cost)
                    };
                    (Some(key), other_type, verdict)
                }
            };
        if let Some((value, ttl_us)) = verdict.write.take() {
            let px = self.px(ttl_us);
            if !commit {
                let key = if self.coalesced && repeat.is_none() {
                    key.take()
                } else {
                    None
                };
                self.held[i] = Some(Held::Value(key, value, px));
            } else if other_type {
                verdict = group.foreign();
            } else if let Some(at) = repeat {
                self.pending[at] = Some(Pending::Value(value, px));
            } else if let Some(key) = key.as_mut() {
                self.store(key, i, &value, px)?;
            }
        }
        self.out.extend_from_slice(verdict.reply());
        if !verdict.admitted {
            self.denied = true;
        }
        Ok(())
    }

    /// Sets key `i` (open as `key`) to `value` for `px` ms, and keeps the
    /// write for replicas and the AOF (sent when the call ends, or before a
    /// sorted set's write).
    fn store(&mut self, key: &mut Key, i: usize, value: &Value, px: u64) -> Result<(), RedisError> {
        let at = self.unix_ms().saturating_add(px);
        key.set(value.as_bytes(), at)?;
        self.writes.set(self.keys[i].inner, value, at);
        Ok(())
    }

    /// Deletes key `i` (open as `key`), and keeps the deletion for replicas
    /// and the AOF.
    fn delete(&mut self, key: &mut Key, i: usize) {
        key.delete();
        self.writes.delete(self.keys[i].inner);
    }

    /// Sends replicas and the AOF the writes of string keys made so far.
    fn send_writes(&mut self) {
        // SAFETY: this call's context, whose strings the keys are.
        unsafe { self.writes.send(self.ctx.ctx) };
    }

    /// Stores what the decisions of keys `from..to` held.
    fn release(&mut self, from: usize, to: usize) -> Result<(), RedisError> {
        for i in from..to {
            match self.held[i].take() {
                Some(Held::Value(key, value, px)) => match self.repeats[i] {
                    Some(at) => self.pending[at] = Some(Pending::Value(value, px)),
                    None => {
                        let mut key = match key {
                            Some(key) => key,
                            None => Key::open(self.ctx, &self.keys[i])?,
                        };
                        self.store(&mut key, i, &value, px)?;
                    }
                },
                Some(Held::Log(admission)) => self.write_log(i, &admission)?,
                None => {}
            }
        }
        Ok(())
    }

    /// Gives `cost` back to key `i` (see refund.lua).
    fn refund(&mut self, group: &Group, i: usize, now: u64, cost: u64) -> Result<(), RedisError> {
        if group.is_sliding_log() {
            return self.refund_log(group, i, cost);
        }
        if let Some(at) = self.repeats[i] {
            let refunded = match &self.pending[at] {
                Some(pending) => group.refund(pending.value(), now, cost),
                None => group.refund(Key::open(self.ctx, &self.keys[i])?.value(), now, cost),
            };
            match refunded {
                Refunded::Unchanged => {}
                Refunded::Delete => self.pending[at] = Some(Pending::Deleted),
                Refunded::Store(value, ttl_us) => {
                    self.pending[at] = Some(Pending::Value(value, self.px(ttl_us)));
                }
            }
            return Ok(());
        }
        let mut key = Key::open(self.ctx, &self.keys[i])?;
        match group.refund(key.value(), now, cost) {
            Refunded::Unchanged => Ok(()),
            Refunded::Delete => {
                self.delete(&mut key, i);
                Ok(())
            }
            Refunded::Store(value, ttl_us) => {
                let px = self.px(ttl_us);
                self.store(&mut key, i, &value, px)?;
                Ok(())
            }
        }
    }

    /// Stores the final write of each key the call named more than once.
    fn store_pending(&mut self) -> Result<(), RedisError> {
        for at in 0..self.pending.len() {
            let Some(pending) = self.pending[at].take() else {
                continue;
            };
            let mut key = Key::open(self.ctx, &self.keys[at])?;
            match pending {
                Pending::Value(value, px) => {
                    self.store(&mut key, at, &value, px)?;
                }
                Pending::Deleted => {
                    self.delete(&mut key, at);
                }
            }
        }
        Ok(())
    }
}

/// The module's entry points (`RedisModule_OnLoad`), which Redis finds by
/// name whatever module they are in.
#[allow(missing_docs)]
mod entry {
    use super::decide;
    use redis_module::{redis_module, Context, RedisString, Status};

    fn init(ctx: &Context, _args: &[RedisString]) -> Status {
        super::key::signal_writes_only(ctx);
        super::replicate::init();
        Status::Ok
    }

    redis_module! {
        name: "ratelimit",
        version: 1,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [],
        init: init,
        commands: [
            ["ratelimit.decide", decide, "write deny-oom getkeys-api", 0, 0, 0, ""],
        ],
    }
}
