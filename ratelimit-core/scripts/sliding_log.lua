-- Sliding log: exactly `limit` in any window of length `window`. The twin of
-- src/algorithm/sliding_log.rs. Uses from prelude.lua: ALGORITHMS and the
-- ids, each_key, answer, call and the per-call state. A sorted set scored by the admitted
-- instant, one unique member per admission; an instant t is inside the window
-- while now < t + window. Deciding only reads; the write trims the log.
--
-- p1 limit, p2 window in µs, p3 a tag naming this request's admissions (0:
-- none), so that a refund removes exactly them (see refund.lua).

-- ZADD arguments per command at most: Lua's unpack is bounded by its stack.
local ZADD_CHUNK = 2000

-- Adds `cost` members scored `score` to the log at `key`, in one ZADD for
-- costs up to ZADD_CHUNK. Members are unique per admission, from any
-- instance: `t<tag>:<i>` for a tagged request, else `<score>:<seq>` numbered
-- past the count, where a clock that went back and forth can find one
-- taken; ZADD says how many it added, and the rest are numbered further.
local function add_members(key, score, cost, count, tag)
  local added, seq = 0, 0
  while added < cost do
    local args, want = {}, math.min(cost - added, ZADD_CHUNK)
    for k = 1, want do
      seq = seq + 1
      args[2 * k - 1] = score
      if tag ~= 0 then
        args[2 * k] = 't' .. int(tag) .. ':' .. int(seq)
      else
        args[2 * k] = score .. ':' .. int(count + seq)
      end
    end
    local new = call('ZADD', key, 'NX', unpack(args))
    -- A tag's members exist already only when this very request was
    -- applied before: adding nothing more is right.
    if tag ~= 0 then new = want end
    added = added + new
  end
end

ALGORITHMS[SLIDING_LOG] = each_key(function(key, _, now, cost, commit, limit, window, tag)
  local cutoff = now - window
  if cutoff < 0 then cutoff = 0 end
  local after_cutoff = '(' .. int(cutoff)

  -- Instants after the cutoff count, including any ahead of a clock that
  -- went back. A key of another type is this key's error, not the call's.
  local count = try_call('ZCOUNT', key, after_cutoff, '+inf')
  if type(count) ~= 'number' then return corrupt() end
  local newest = nil
  if count > 0 then
    newest = tonumber(call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  end

  if count + cost > limit then
    -- The request fits once the oldest `excess` admissions have left.
    local excess = count + cost - limit
    local oldest = call('ZRANGEBYSCORE', key, after_cutoff, '+inf', 'WITHSCORES', 'LIMIT', excess - 1, 1)
    local reset = 0
    if newest then reset = newest + window - now end
    -- A lowered limit can find more admissions than it allows: none remain.
    local remaining = limit - count
    if remaining < 0 then remaining = 0 end
    return 0, remaining, tonumber(oldest[2]) + window - now, reset, 0
  end

  local latest = now
  if newest and newest > now then latest = newest end
  local reset = latest + window - now
  local remaining = limit - count - cost
  if cost == 0 then return 1, remaining, 0, reset, 0 end
  local function write()
    call('ZREMRANGEBYSCORE', key, '-inf', int(cutoff))
    add_members(key, int(now), cost, count, tag)
    call('PEXPIRE', key, expiry_ms(reset))
  end
  if commit then
    write()
    return 1, remaining, 0, reset, 0
  end
  return 1, remaining, 0, reset, 0, write
end)
