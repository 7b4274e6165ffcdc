-- Token bucket (0): a level and the time of the last refill. The twin of
-- src/algorithm/token_bucket.rs.
--
-- p1 rate tokens, p2 rate period in µs, p3 capacity. State:
-- "<level>:<updated>", the level in units of 1/tokens µs (one token is
-- `period` units), so refill is exact for any rate.

ALGORITHMS[0] = function(key, now, cost, commit, tokens, period, capacity)
  local depth = capacity * period
  local inc = cost * period

  local level, updated = depth, now
  local s_level, s_updated = load(key, '^(%d+):(%d+)$')
  if s_level == false then return CORRUPT end
  if s_level then
    level, updated = s_level, s_updated
  end
  if now > updated then
    -- Compared in time rather than multiplied, so a long idle gap cannot overflow.
    local elapsed = now - updated
    if elapsed >= div_ceil(depth - level, tokens) then
      level = depth
    else
      level = level + elapsed * tokens
    end
    updated = now
  end
  -- How long until refill resumes: non-zero only after the clock went back.
  local lag = updated - now

  if inc > level then
    return {0, divmod(level, period), lag + div_ceil(inc - level, tokens), lag + div_ceil(depth - level, tokens), 0}
  end
  level = level - inc
  local reset = lag + div_ceil(depth - level, tokens)
  local reply = {1, divmod(level, period), 0, reset, 0}
  if inc == 0 then return reply end
  local value = int(level) .. ':' .. int(updated)
  if commit then
    store(key, value, reset)
    return reply
  end
  return reply, function() store(key, value, reset) end
end
