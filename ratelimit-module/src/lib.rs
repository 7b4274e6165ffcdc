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
//! `runs` and `refund`. A call of another wire version is refused with an
//! error starting `RLWIRE`, and the limiter calls the function instead.
//! Redis Cluster's cross-slot `batch` mode is the function's alone.
//!
//! Load it with `redis-server --loadmodule /path/to/libratelimit_module.so`
//! (see the guide's chapter on the native module). Writes reach replicas and
//! the AOF as the commands the script would have run (`PSETEX`, `DEL`, and
//! the sliding log's sorted-set commands).

#![deny(missing_docs)]

use std::time::{SystemTime, UNIX_EPOCH};

mod key;

use key::Key;
use ratelimit_core::native::{Group, Refunded, Reply, Stored, WIRE_VERSION};
use redis_module::{Context, KeyType, RedisError, RedisResult, RedisString, RedisValue};

/// Fields per group, after the mode (see entry.lua).
const GROUP_FIELDS: usize = 7;

/// The command: see the crate's documentation.
fn decide(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    // Where the keys are, for ACLs and Redis Cluster: after the version and
    // their count.
    if ctx.is_keys_position_request() {
        if let Some(count) = args.get(2).and_then(|a| number(a).ok()) {
            let last = (3 + count as usize).min(args.len());
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
    let count = number(&args[2])? as usize;
    if args.len() < 4 + count {
        return Err(RedisError::WrongArity);
    }
    let mut args = args.into_iter().skip(3);
    let keys: Vec<RedisString> = args.by_ref().take(count).collect();
    let argv: Vec<RedisString> = args.collect();
    let mut call = Call {
        ctx,
        keys,
        out: Vec::new(),
        denied: false,
        held: Vec::new(),
        grace: false,
        time: None,
    };
    call.held.resize_with(call.keys.len(), || None);
    call.run(&argv)?;
    Ok(RedisValue::Array(
        call.out.into_iter().map(RedisValue::Integer).collect(),
    ))
}

/// An unsigned number argument.
fn number(arg: &RedisString) -> Result<u64, RedisError> {
    std::str::from_utf8(arg.as_slice())
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or(RedisError::Str("ERR a number was expected"))
}

/// A signed number argument (a refund's `until_end`).
fn signed(arg: &RedisString) -> Result<i64, RedisError> {
    std::str::from_utf8(arg.as_slice())
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or(RedisError::Str("ERR a number was expected"))
}

/// A write an all-or-nothing run holds until every key admits.
enum Held {
    /// A string value and its `PX`.
    Value(String, u64),
    /// The sliding log's admission: cost, count before it, tag, and `PX`.
    Log {
        now: u64,
        cutoff: u64,
        cost: u64,
        count: u64,
        tag: u64,
        px: u64,
    },
}

/// The state of one call, as entry.lua keeps it.
struct Call<'c> {
    ctx: &'c Context,
    keys: Vec<RedisString>,
    /// The reply.
    out: Vec<i64>,
    /// Whether some key of the current run did not admit.
    denied: bool,
    /// Writes held for an all-or-nothing run, by key.
    held: Vec<Option<Held>>,
    /// Whether the caller's clock decides (then expiries get a second more:
    /// Redis expires keys on its own clock).
    grace: bool,
    /// This server's time, read once a call.
    time: Option<u64>,
}

impl Call<'_> {
    fn run(&mut self, argv: &[RedisString]) -> Result<(), RedisError> {
        let mode = argv[0].as_slice();
        let mut first_group = 1;
        // In 'runs' mode, the last key of each run and whether it is all or
        // nothing.
        let mut runs: Option<Vec<(usize, bool)>> = None;
        match mode {
            b"each" | b"all" | b"peek" | b"refund" => {}
            b"runs" => {
                let count = number(arg(argv, 1)?)? as usize;
                let mut through = 0;
                let mut list = Vec::with_capacity(count);
                for r in 0..count {
                    let keys = signed(arg(argv, 2 + r)?)?;
                    through += keys.unsigned_abs() as usize;
                    list.push((through, keys < 0));
                }
                runs = Some(list);
                first_group = 2 + count;
            }
            _ => return Err(RedisError::Str("ERR unknown mode")),
        }
        let refund = mode == b"refund";
        let mut commit = mode == b"each" || runs.is_some();
        let (mut run, mut run_first) = (0, 0);
        let mut last = 0;
        let mut g = first_group;
        while g < argv.len() {
            if argv.len() < g + GROUP_FIELDS {
                return Err(RedisError::WrongArity);
            }
            let first = last;
            last += number(&argv[g])? as usize;
            if last > self.keys.len() {
                return Err(RedisError::Str("ERR more keys in the groups than given"));
            }
            if let Some(runs) = &runs {
                let Some(&(_, all)) = runs.get(run) else {
                    return Err(RedisError::Str("ERR more groups than runs"));
                };
                commit = !all;
                if first == run_first {
                    self.denied = false;
                }
            }
            let algorithm = number(&argv[g + 1])?;
            let cost = number(&argv[g + 2])?;
            let now = self.now(&argv[g + 3])?;
            let p3 = if refund {
                signed(&argv[g + 6])? as u64
            } else {
                number(&argv[g + 6])?
            };
            let params = [number(&argv[g + 4])?, number(&argv[g + 5])?, p3];
            let group = Group::new(algorithm, params, refund)
                .ok_or(RedisError::Str("ERR a group names no quota"))?;
            for i in first..last {
                if refund {
                    self.refund(&group, i, now, cost)?;
                } else if group.is_sliding_log() {
                    self.decide_log(&group, i, now, cost, commit)?;
                } else {
                    self.decide_value(&group, i, now, cost, commit)?;
                }
            }
            if let Some(runs) = &runs {
                let (run_last, all) = runs[run];
                if last == run_last {
                    if all && !self.denied {
                        self.release(run_first, last)?;
                    }
                    run += 1;
                    run_first = last;
                }
            }
            g += GROUP_FIELDS;
        }
        if runs.is_none() && !commit && !self.denied && mode == b"all" {
            self.release(0, last)?;
        }
        Ok(())
    }

    /// The group's clock: the caller's, or this server's time.
    fn now(&mut self, arg: &RedisString) -> Result<u64, RedisError> {
        if !arg.as_slice().is_empty() {
            self.grace = true;
            return number(arg);
        }
        Ok(*self.time.get_or_insert_with(|| {
            // The clock Redis's TIME reads.
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64)
        }))
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
        let key = Key::open(self.ctx, &self.keys[i])?;
        let kind = key.kind();
        let stored = match (key.value(), &kind) {
            (Some(value), _) => Stored::Value(value),
            (None, KeyType::Empty) => Stored::Absent,
            // Another type: the 'each' script reads it as absent (MGET) and
            // fails to write it (SET NX); all or nothing finds it first.
            (None, _) if commit => Stored::Absent,
            (None, _) => Stored::Value(b"\0"),
        };
        let verdict = group.decide(stored, now, cost);
        let mut reply = verdict.reply;
        let mut admitted = verdict.admitted;
        if let Some((value, ttl_us)) = verdict.write {
            let px = self.px(ttl_us);
            if !commit {
                self.held[i] = Some(Held::Value(value, px));
            } else if matches!(kind, KeyType::Empty | KeyType::String) {
                key.set(&value, px)?;
                self.replicate_set(i, &value, px);
            } else {
                reply = Reply::Foreign;
                admitted = false;
            }
        }
        match reply {
            Reply::Debt(debt) => self.out.push(debt as i64),
            Reply::Numbers(numbers) => self.out.extend_from_slice(&numbers),
            Reply::Foreign if group.answers_five() => self.out.extend_from_slice(&[-1, 0, 0, 0, 0]),
            Reply::Foreign => self.out.push(-1),
        }
        if !admitted {
            self.denied = true;
        }
        Ok(())
    }

    /// Writes key `i`'s value with its expiry, and sends replicas the same.
    fn store(&self, i: usize, value: &str, px: u64) -> Result<(), RedisError> {
        Key::open(self.ctx, &self.keys[i])?.set(value, px)?;
        self.replicate_set(i, value, px);
        Ok(())
    }

    /// Sends replicas and the AOF the `PSETEX` the script would have run.
    fn replicate_set(&self, i: usize, value: &str, px: u64) {
        let px = px.to_string();
        self.ctx.replicate(
            "PSETEX",
            &[self.keys[i].as_slice(), px.as_bytes(), value.as_bytes()][..],
        );
    }

    /// Stores what the decisions of keys `from..to` held.
    fn release(&mut self, from: usize, to: usize) -> Result<(), RedisError> {
        for i in from..to {
            match self.held[i].take() {
                Some(Held::Value(value, px)) => self.store(i, &value, px)?,
                Some(Held::Log {
                    now,
                    cutoff,
                    cost,
                    count,
                    tag,
                    px,
                }) => self.write_log(i, now, cutoff, cost, count, tag, px)?,
                None => {}
            }
        }
        Ok(())
    }

    /// Runs a command, and sends it to replicas when it writes.
    fn command(&self, name: &str, args: &[&[u8]], writes: bool) -> RedisResult {
        let reply = self.ctx.call(name, args)?;
        if writes {
            self.ctx.replicate(name, args);
        }
        Ok(reply)
    }

    /// Decides key `i` of the sliding log, kept in a sorted set (see
    /// sliding_log.lua, which this follows command for command).
    fn decide_log(
        &mut self,
        group: &Group,
        i: usize,
        now: u64,
        cost: u64,
        commit: bool,
    ) -> Result<(), RedisError> {
        let (limit, window, tag) = (group.limit(), group.window_us(), group.p3());
        let cutoff = now.saturating_sub(window);
        let after_cutoff = format!("({cutoff}");
        let key = self.keys[i].as_slice().to_vec();
        let count = match self
            .ctx
            .call("ZCOUNT", &[&key[..], after_cutoff.as_bytes(), b"+inf"][..])
        {
            Ok(RedisValue::Integer(count)) => count as u64,
            // A key of another type is this key's error, not the call's.
            _ => {
                self.out.extend_from_slice(&[-1, 0, 0, 0, 0]);
                self.denied = true;
                return Ok(());
            }
        };
        let newest = if count > 0 {
            let reply = self.command("ZRANGE", &[&key[..], b"-1", b"-1", b"WITHSCORES"], false)?;
            score(&reply, 1)
        } else {
            None
        };
        if count + cost > limit {
            // The request fits once the oldest `excess` admissions have left.
            let offset = (count + cost - limit - 1).to_string();
            let reply = self.command(
                "ZRANGEBYSCORE",
                &[
                    &key[..],
                    after_cutoff.as_bytes(),
                    b"+inf",
                    b"WITHSCORES",
                    b"LIMIT",
                    offset.as_bytes(),
                    b"1",
                ],
                false,
            )?;
            let oldest = score(&reply, 1).unwrap_or(now);
            let reset = newest.map_or(0, |newest| newest + window - now);
            self.out.extend_from_slice(&[
                0,
                limit.saturating_sub(count) as i64,
                (oldest + window - now) as i64,
                reset as i64,
                0,
            ]);
            self.denied = true;
            return Ok(());
        }
        let latest = newest.map_or(now, |newest| newest.max(now));
        let reset = latest + window - now;
        let remaining = (limit - count - cost) as i64;
        self.out
            .extend_from_slice(&[1, remaining, 0, reset as i64, 0]);
        if cost == 0 {
            return Ok(());
        }
        let px = self.px(reset);
        if commit {
            self.write_log(i, now, cutoff, cost, count, tag, px)
        } else {
            self.held[i] = Some(Held::Log {
                now,
                cutoff,
                cost,
                count,
                tag,
                px,
            });
            Ok(())
        }
    }

    /// Trims the log at key `i` and adds `cost` admissions at `now`
    /// (`add_members` in sliding_log.lua: unique members, `t<tag>:<i>` for a
    /// tagged request, else `<now>:<n>` numbered past the count).
    #[allow(clippy::too_many_arguments)]
    fn write_log(
        &self,
        i: usize,
        now: u64,
        cutoff: u64,
        cost: u64,
        count: u64,
        tag: u64,
        px: u64,
    ) -> Result<(), RedisError> {
        let key = self.keys[i].as_slice();
        let cutoff = cutoff.to_string();
        self.command("ZREMRANGEBYSCORE", &[key, b"-inf", cutoff.as_bytes()], true)?;
        let score = now.to_string();
        let (mut added, mut seq) = (0, 0);
        while added < cost {
            let want = (cost - added).min(ZADD_CHUNK);
            let mut members = Vec::with_capacity(want as usize);
            for _ in 0..want {
                seq += 1;
                members.push(if tag != 0 {
                    format!("t{tag}:{seq}")
                } else {
                    format!("{score}:{}", count + seq)
                });
            }
            let mut args: Vec<&[u8]> = vec![key, b"NX"];
            for member in &members {
                args.push(score.as_bytes());
                args.push(member.as_bytes());
            }
            let new = match self.command("ZADD", &args, true)? {
                RedisValue::Integer(new) => new as u64,
                _ => want,
            };
            // A tag's members exist already only when this very request
            // was applied before: adding nothing more is right.
            added += if tag != 0 { want } else { new };
        }
        let px = px.to_string();
        self.command("PEXPIRE", &[key, px.as_bytes()], true)?;
        Ok(())
    }

    /// Gives `cost` back to key `i` (see refund.lua).
    fn refund(&mut self, group: &Group, i: usize, now: u64, cost: u64) -> Result<(), RedisError> {
        if group.is_sliding_log() {
            let tag = group.p3();
            if tag == 0 {
                return Ok(());
            }
            let key = self.keys[i].as_slice().to_vec();
            let members: Vec<String> = (1..=cost).map(|n| format!("t{tag}:{n}")).collect();
            for chunk in members.chunks(ZADD_CHUNK as usize) {
                let mut args: Vec<&[u8]> = vec![&key];
                args.extend(chunk.iter().map(|m| m.as_bytes()));
                self.command("ZREM", &args, true)?;
            }
            return Ok(());
        }
        let key = Key::open(self.ctx, &self.keys[i])?;
        match group.refund(key.value(), now, cost) {
            Refunded::Unchanged => Ok(()),
            Refunded::Delete => {
                key.delete();
                self.ctx.replicate("DEL", &[self.keys[i].as_slice()][..]);
                Ok(())
            }
            Refunded::Store(value, ttl_us) => {
                let px = self.px(ttl_us);
                key.set(&value, px)?;
                self.replicate_set(i, &value, px);
                Ok(())
            }
        }
    }
}

/// Members a sorted-set command names at most, as the script's chunks.
const ZADD_CHUNK: u64 = 2000;

/// The score at `index` of a `WITHSCORES` reply, as a whole number.
fn score(reply: &RedisValue, index: usize) -> Option<u64> {
    let RedisValue::Array(items) = reply else {
        return None;
    };
    let text = match items.get(index)? {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.clone(),
        RedisValue::StringBuffer(b) => String::from_utf8_lossy(b).into_owned(),
        RedisValue::BulkRedisString(s) => String::from_utf8_lossy(s.as_slice()).into_owned(),
        RedisValue::Integer(n) => return u64::try_from(*n).ok(),
        RedisValue::Float(f) => return Some(*f as u64),
        _ => return None,
    };
    text.parse::<f64>().ok().map(|f| f as u64)
}

/// The element at `index` of `argv`, or an arity error.
fn arg(argv: &[RedisString], index: usize) -> Result<&RedisString, RedisError> {
    argv.get(index).ok_or(RedisError::WrongArity)
}

/// The module's entry points (`RedisModule_OnLoad`), which Redis finds by
/// name whatever module they are in.
#[allow(missing_docs)]
mod entry {
    use super::decide;
    use redis_module::{redis_module, Context, RedisString, Status};

    fn init(ctx: &Context, _args: &[RedisString]) -> Status {
        super::key::signal_writes_only(ctx);
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
