-- Token bucket (0): a level and the time of the last refill. The twin of
-- src/algorithm/token_bucket.rs.
--
-- Reply: two numbers a key, the level after refill and the lag (-1 and 0
-- for a foreign value); the decision follows from them, the quota and the
-- cost (token_bucket::decide_level on the caller's side).
--
-- p1 rate tokens, p2 rate period in µs, p3 capacity. State:
-- "<level>:<updated>", the level in units of 1/tokens µs (one token is
-- `period` units), so refill is exact for any rate. The default algorithm: it
-- loops over its group itself.

ALGORITHMS[0] = function(first, last, values, now, cost, commit, tokens, period, capacity)
  local depth = capacity * period
  local inc = cost * period
  for i = first, last do
    local level, updated = depth, now
    local s_level, s_updated = parse(values[i - first + 1], '^(%d+):(%d+)$')
    if s_level then
      level, updated = s_level, s_updated
    end
    if now > updated then
      -- Compared in time rather than multiplied, so a long idle gap cannot overflow.
      local gap = depth - level
      local to_full = floor(gap / tokens)
      if to_full * tokens < gap then to_full = to_full + 1 end
      if now - updated >= to_full then
        level = depth
      else
        level = level + (now - updated) * tokens
      end
      updated = now
    end
    -- How long until refill resumes: non-zero only after the clock went back.
    local lag = updated - now

    n = n + 2
    if s_level == false then
      out[n - 1], out[n] = -1, 0
      denied = true
    else
      -- The level and lag alone answer: the caller derives the rest of the
      -- decision.
      out[n - 1], out[n] = level, lag
      if inc > level then
        denied = true
      elseif inc > 0 then
        level = level - inc
        local gap = depth - level
        local reset = floor(gap / tokens)
        if reset * tokens < gap then reset = reset + 1 end
        keep(i, format('%d:%d', level, updated), lag + reset, commit)
      end
    end
  end
end
