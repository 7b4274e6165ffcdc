-- Token bucket (0): a level and the time of the last refill. The twin of
-- src/algorithm/token_bucket.rs.
--
-- p1 rate tokens, p2 rate period in µs, p3 capacity. State:
-- "<level>:<updated>", the level in units of 1/tokens µs (one token is
-- `period` units), so refill is exact for any rate. The default algorithm:
-- its divisions are written inline.

ALGORITHMS[0] = function(key, stored, now, cost, commit, tokens, period, capacity)
  local depth = capacity * period
  local inc = cost * period

  local level, updated = depth, now
  if stored then
    local s_level, s_updated = match(stored, '^(%d+):(%d+)$')
    if not s_level then return corrupt() end
    level, updated = tonumber(s_level), tonumber(s_updated)
  end
  if now > updated then
    -- Compared in time rather than multiplied, so a long idle gap cannot overflow.
    local elapsed = now - updated
    local gap = depth - level
    local to_full = floor(gap / tokens)
    if to_full * tokens < gap then to_full = to_full + 1 end
    if elapsed >= to_full then
      level = depth
    else
      level = level + elapsed * tokens
    end
    updated = now
  end
  -- How long until refill resumes: non-zero only after the clock went back.
  local lag = updated - now

  if inc > level then
    return 0, floor(level / period), lag + div_ceil(inc - level, tokens), lag + div_ceil(depth - level, tokens), 0
  end
  level = level - inc
  local gap = depth - level
  local reset = floor(gap / tokens)
  if reset * tokens < gap then reset = reset + 1 end
  reset = lag + reset
  local remaining = floor(level / period)
  if inc == 0 then return 1, remaining, 0, reset, 0 end
  local value = format('%d:%d', level, updated)
  local ttl_ms = floor(reset / 1000)
  if ttl_ms * 1000 < reset then ttl_ms = ttl_ms + 1 end
  local px = format('%d', ttl_ms + grace_ms)
  if commit then
    call('SET', key, value, 'PX', px)
    return 1, remaining, 0, reset, 0
  end
  return 1, remaining, 0, reset, 0, function() call('SET', key, value, 'PX', px) end
end
