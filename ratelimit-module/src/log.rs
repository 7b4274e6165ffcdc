//! The sliding log, kept in a sorted set scored by the admitted instants: the
//! module runs the commands `scripts/sliding_log.lua` and `refund.lua` run,
//! one for one, and sends replicas the writes.

use ratelimit_core::native::Group;
use redis_module::{KeyType, RedisError, RedisResult, RedisValue};

use crate::key::Key;
use crate::{Call, Held};

/// Members a sorted-set command names at most, as the scripts' chunks.
const CHUNK: u64 = 2000;

/// An admission to add to a log: when it was decided, the instants it trims,
/// how many it adds, the count before it, its tag and its `PX`.
pub(crate) struct Admission {
    now: u64,
    cutoff: u64,
    cost: u64,
    count: u64,
    tag: u64,
    px: u64,
}

/// Past any instant an admission is scored with (2^53 µs, the limit of
/// `ratelimit-core`'s clocks).
const MAX_INSTANT: f64 = 9_007_199_254_740_992.0;

/// The score at `index` of a `WITHSCORES` reply, as a whole number; `None`
/// for a score no admission has (negative, infinite, or past 2^53 µs, which
/// only another writer leaves): read as an instant, `inf` made the log's
/// expiry wrap to some 500 years ahead.
fn score(reply: &RedisValue, index: usize) -> Option<u64> {
    let RedisValue::Array(items) = reply else {
        return None;
    };
    let text = match items.get(index)? {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.clone(),
        RedisValue::StringBuffer(b) => String::from_utf8_lossy(b).into_owned(),
        RedisValue::BulkRedisString(s) => String::from_utf8_lossy(s.as_slice()).into_owned(),
        RedisValue::Integer(n) => return u64::try_from(*n).ok(),
        _ => return None,
    };
    text.parse::<f64>()
        .ok()
        .filter(|f| (0.0..MAX_INSTANT).contains(f))
        .map(|f| f as u64)
}

impl Call<'_> {
    /// Runs a command, and sends it to replicas when it writes.
    fn command(&self, name: &str, args: &[&[u8]], writes: bool) -> RedisResult {
        let reply = self.ctx.call(name, args)?;
        if writes {
            self.ctx.replicate(name, args);
        }
        Ok(reply)
    }

    /// Decides key `i` of the sliding log (see sliding_log.lua).
    pub(crate) fn decide_log(
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
            Ok(RedisValue::Integer(count)) => u64::try_from(count).unwrap_or(0),
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
        // `plan` holds the cost within the limit; a lowered limit can still
        // find more admissions than it allows.
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
            let reset = newest.map_or(0, |newest| (newest + window).saturating_sub(now));
            self.out.extend_from_slice(&[
                0,
                limit.saturating_sub(count) as i64,
                (oldest + window).saturating_sub(now) as i64,
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
        let admission = Admission {
            now,
            cutoff,
            cost,
            count,
            tag,
            px: self.px(reset),
        };
        if commit {
            self.write_log(i, &admission)
        } else {
            self.held[i] = Some(Held::Log(admission));
            Ok(())
        }
    }

    /// Trims the log at key `i` and adds the admission (`add_members` in
    /// sliding_log.lua: unique members, `t<tag>:<i>` for a tagged request,
    /// else `<now>:<n>` numbered past the count).
    pub(crate) fn write_log(&mut self, i: usize, admission: &Admission) -> Result<(), RedisError> {
        // Replicas and the AOF get the call's writes in the order made.
        self.send_writes();
        let key = self.keys[i].as_slice();
        let cutoff = admission.cutoff.to_string();
        self.command("ZREMRANGEBYSCORE", &[key, b"-inf", cutoff.as_bytes()], true)?;
        let score = admission.now.to_string();
        let (tag, cost) = (admission.tag, admission.cost);
        let (mut added, mut seq) = (0, 0);
        while added < cost {
            let want = (cost - added).min(CHUNK);
            let mut members = Vec::with_capacity(want as usize);
            for _ in 0..want {
                seq += 1;
                members.push(if tag != 0 {
                    format!("t{tag}:{seq}")
                } else {
                    format!("{score}:{}", admission.count + seq)
                });
            }
            let mut args: Vec<&[u8]> = vec![key, b"NX"];
            for member in &members {
                args.push(score.as_bytes());
                args.push(member.as_bytes());
            }
            let new = match self.command("ZADD", &args, true)? {
                RedisValue::Integer(new) => u64::try_from(new).unwrap_or(0),
                _ => want,
            };
            // A tag's members exist already only when this very request
            // was applied before: adding nothing more is right.
            added += if tag != 0 { want } else { new };
        }
        // An instant, written here and sent to replicas alike (see
        // `Key::set`).
        let at = (self.unix_ms() + admission.px).to_string();
        self.ctx.call("PEXPIREAT", &[key, at.as_bytes()][..])?;
        self.ctx.replicate("PEXPIREAT", &[key, at.as_bytes()][..]);
        Ok(())
    }

    /// Removes, by name, the admissions a tagged decision added (refund.lua):
    /// nothing of another caller's, and nothing more when applied twice. An
    /// untagged request, or a key that holds no log, gives nothing back.
    pub(crate) fn refund_log(
        &mut self,
        group: &Group,
        i: usize,
        cost: u64,
    ) -> Result<(), RedisError> {
        self.send_writes();
        let tag = group.p3();
        if tag == 0 || Key::open(self.ctx, &self.keys[i])?.kind() != KeyType::ZSet {
            return Ok(());
        }
        let key = self.keys[i].as_slice();
        let mut from = 1;
        while from <= cost {
            let to = cost.min(from + CHUNK - 1);
            let members: Vec<String> = (from..=to).map(|n| format!("t{tag}:{n}")).collect();
            let mut args: Vec<&[u8]> = vec![key];
            args.extend(members.iter().map(|m| m.as_bytes()));
            self.command("ZREM", &args, true)?;
            from = to + 1;
        }
        Ok(())
    }
}
