-- Token bucket: a level and the time of the last refill. The twin of
-- src/algorithm/token_bucket.rs.
--
-- ARGV[3] rate tokens, ARGV[4] rate period in µs, ARGV[5] capacity.
-- State: "<level>:<updated>", the level in units of 1/tokens µs (one token is
-- `period` units), so refill is exact for any rate.

local tokens = tonumber(ARGV[3])
local period = tonumber(ARGV[4])
local depth = tonumber(ARGV[5]) * period
local inc = cost * period

local level, updated = depth, now
local stored = load({2, 2})
if stored then
  if stored.err then return stored end
  level, updated = stored[1], stored[2]
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
if inc > 0 then
  store(int(level) .. ':' .. int(updated), reset)
end
return {1, divmod(level, period), 0, reset, 0}
