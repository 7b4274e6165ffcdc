-- GCRA (1), and the leaky bucket as a queue on the same arithmetic (5). The
-- twin of src/algorithm/gcra.rs.
--
-- p1 rate tokens (reduced numerator), p2 rate period in µs (reduced
-- denominator), p3 capacity, p4 1 for the leaky bucket (which reports the
-- delay before the request's turn), else 0.
--
-- State: "<full_at>" or "<full_at>:<rem>": the bucket is full again (the queue
-- drained) at full_at + rem / tokens µs. Time is counted in units of 1/tokens
-- µs, so one token is exactly `period` units and refill is exact for any rate.
-- Most states are a bare number, which Redis keeps inside the key's object,
-- with no string allocated.
--
-- The most common path of the script: its divisions are written inline.

-- The stored full_at and rem: nil when absent, false for a foreign value.
local function parse_full_at(stored)
  if not stored then return nil end
  local full_at = tonumber(stored)
  if full_at and full_at >= 0 and full_at % 1 == 0 then return full_at, 0 end
  local a, b = match(stored, '^(%d+):(%d+)$')
  if not a then return false end
  return tonumber(a), tonumber(b)
end

local function gcra(key, stored, now, cost, commit, tokens, period, capacity, leaky)
  local depth = capacity * period
  local inc = cost * period

  -- A full_at in the past means a full bucket. A clock that went backwards
  -- finds full_at further away, so it sees fewer tokens, never more.
  local full_at, rem = now, 0
  local s_full_at, s_rem = parse_full_at(stored)
  if s_full_at == false then return corrupt() end
  if s_full_at and s_full_at >= now then
    full_at, rem = s_full_at, s_rem
  end

  local debt = (full_at - now) * tokens + rem
  local new_debt = debt + inc
  if new_debt > depth then
    local left = depth - debt
    if left < 0 then left = 0 end
    return 0, floor(left / period), div_ceil(new_debt - depth, tokens), div_ceil(debt, tokens), 0
  end

  local delay = 0
  if leaky == 1 then delay = div_ceil(debt, tokens) end
  local reset = floor(new_debt / tokens)
  if reset * tokens < new_debt then reset = reset + 1 end
  local remaining = floor((depth - new_debt) / period)
  if inc == 0 then return 1, remaining, 0, reset, delay end

  local sum = rem + inc
  local carry = floor(sum / tokens)
  local new_rem = sum - carry * tokens
  local value
  if new_rem > 0 then
    value = format('%d:%d', full_at + carry, new_rem)
  else
    value = format('%d', full_at + carry)
  end
  local ttl_ms = floor(reset / 1000)
  if ttl_ms * 1000 < reset then ttl_ms = ttl_ms + 1 end
  local px = format('%d', ttl_ms + grace_ms)
  if commit then
    call('SET', key, value, 'PX', px)
    return 1, remaining, 0, reset, delay
  end
  return 1, remaining, 0, reset, delay, function() call('SET', key, value, 'PX', px) end
end

ALGORITHMS[1] = gcra
ALGORITHMS[5] = gcra
