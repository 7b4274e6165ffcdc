-- Token bucket, one key, one atomic decision. The twin of src/algorithm.rs:
-- both must decide the same on the same (state, time, cost).
--
-- KEYS[1]  the bucket
-- ARGV[1]  rate tokens (reduced numerator)
-- ARGV[2]  rate period in microseconds (reduced denominator)
-- ARGV[3]  capacity
-- ARGV[4]  cost (0 <= cost <= capacity, checked by the caller)
-- ARGV[5]  now in microseconds, or '' to read Redis TIME (no skew between instances)
--
-- State: one string, "<full_at_us>" or "<full_at_us>:<rem>": the bucket is full
-- again at full_at_us + rem / tokens microseconds. Time is counted in units of
-- 1/tokens microsecond, so one token is exactly `period` units and refill is
-- exact for any rate. Every number stays below 2^53 (the quota is checked),
-- so Lua's doubles hold them exactly.
--
-- Returns {allowed (0|1), remaining, retry_after_us, reset_after_us}.

local tokens = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local now
if ARGV[5] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[5])
end

-- Exact floor division of non-negative integers below 2^53: the quotient of
-- two doubles can round up across an integer, so correct it by the remainder.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

local function div_ceil(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end

local depth = capacity * period
local inc = cost * period

-- A full_at in the past means a full bucket. A clock that went backwards finds
-- full_at further away, so it sees fewer tokens, never more.
local full_at, rem = now, 0
local stored = redis.call('GET', KEYS[1])
if stored then
  local f, r = string.match(stored, '^(%d+):?(%d*)$')
  if not f then
    return redis.error_reply('ratelimit: unexpected value at ' .. KEYS[1])
  end
  f = tonumber(f)
  if f >= now then
    full_at = f
    rem = tonumber(r) or 0
  end
end

local debt = (full_at - now) * tokens + rem
local new_debt = debt + inc

if new_debt > depth then
  -- Denied: nothing is written.
  local left = depth - debt
  if left < 0 then left = 0 end
  return {0, divmod(left, period), div_ceil(new_debt - depth, tokens), div_ceil(debt, tokens)}
end

local reset_us = div_ceil(new_debt, tokens)
if inc > 0 then
  local carry, new_rem = divmod(rem + inc, tokens)
  local value = string.format('%.0f', full_at + carry)
  if new_rem > 0 then
    value = value .. ':' .. string.format('%.0f', new_rem)
  end
  -- The key expires when the bucket is full again: a full bucket needs no state.
  redis.call('SET', KEYS[1], value, 'PX', div_ceil(reset_us, 1000))
end
return {1, divmod(depth - new_debt, period), 0, reset_us}
