-- Sliding log (3): exactly `limit` in any window of length `window`. The twin
-- of src/algorithm/sliding_log.rs. A sorted set scored by the admitted
-- instant, one unique member per admission; an instant t is inside the window
-- while now < t + window. Deciding only reads; the write trims the log.
--
-- p1 limit, p2 window in µs.

local SLIDING_LOG = 3
ALGORITHMS[SLIDING_LOG] = each_key(function(key, _, now, cost, commit, limit, window)
  local cutoff = now - window
  if cutoff < 0 then cutoff = 0 end
  local after_cutoff = '(' .. int(cutoff)

  -- Instants after the cutoff count, including any ahead of a clock that went back.
  local count = call('ZCOUNT', key, after_cutoff, '+inf')
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
    return 0, limit - count, tonumber(oldest[2]) + window - now, reset, 0
  end

  local latest = now
  if newest and newest > now then latest = newest end
  local reset = latest + window - now
  local remaining = limit - count - cost
  if cost == 0 then return 1, remaining, 0, reset, 0 end
  local function write()
    call('ZREMRANGEBYSCORE', key, '-inf', int(cutoff))
    -- Members must be unique even for admissions in the same microsecond, from
    -- any instance: number them past the count, skipping any already taken.
    local seq = count
    local score = int(now)
    for _ = 1, cost do
      repeat
        seq = seq + 1
      until call('ZADD', key, 'NX', score, score .. ':' .. seq) == 1
    end
    call('PEXPIRE', key, expiry_ms(reset))
  end
  if commit then
    write()
    return 1, remaining, 0, reset, 0
  end
  return 1, remaining, 0, reset, 0, write
end)
