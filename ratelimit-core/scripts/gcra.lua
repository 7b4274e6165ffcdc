-- GCRA, and the leaky bucket as a queue on the same arithmetic. The twin of
-- src/algorithm/gcra.rs.
--
-- ARGV[3] rate tokens (reduced numerator), ARGV[4] rate period in µs (reduced
-- denominator), ARGV[5] capacity, ARGV[6] '1' for the leaky bucket.
--
-- State: "<full_at>" or "<full_at>:<rem>": the bucket is full again (the queue
-- drained) at full_at + rem / tokens µs. Time is counted in units of 1/tokens
-- µs, so one token is exactly `period` units and refill is exact for any rate.

local tokens = tonumber(ARGV[3])
local period = tonumber(ARGV[4])
local depth = tonumber(ARGV[5]) * period
local leaky = ARGV[6] == '1'
local inc = cost * period

-- A full_at in the past means a full bucket. A clock that went backwards
-- finds full_at further away, so it sees fewer tokens, never more.
local full_at, rem = now, 0
local stored = load({1, 2})
if stored then
  if stored.err then return stored end
  if stored[1] >= now then
    full_at, rem = stored[1], stored[2] or 0
  end
end

local debt = (full_at - now) * tokens + rem
local new_debt = debt + inc

if new_debt > depth then
  local left = depth - debt
  if left < 0 then left = 0 end
  return {0, divmod(left, period), div_ceil(new_debt - depth, tokens), div_ceil(debt, tokens), 0}
end

local delay = 0
if leaky then delay = div_ceil(debt, tokens) end
local reset = div_ceil(new_debt, tokens)
if inc > 0 then
  local carry, new_rem = divmod(rem + inc, tokens)
  local value = int(full_at + carry)
  if new_rem > 0 then value = value .. ':' .. int(new_rem) end
  store(value, reset)
end
return {1, divmod(depth - new_debt, period), 0, reset, delay}
