-- GCRA (1), and the leaky bucket as a queue on the same arithmetic (5). The
-- twin of src/algorithm/gcra.rs.
--
-- p1 rate tokens (reduced numerator), p2 rate period in µs (reduced
-- denominator), p3 capacity.
--
-- State: "<full_at>" or "<full_at>:<rem>": the bucket is full again (the queue
-- drained) at full_at + rem / tokens µs. Time is counted in units of 1/tokens
-- µs, so one token is exactly `period` units and refill is exact for any rate.

local function gcra(key, now, cost, commit, tokens, period, capacity, leaky)
  local depth = capacity * period
  local inc = cost * period

  -- A full_at in the past means a full bucket. A clock that went backwards
  -- finds full_at further away, so it sees fewer tokens, never more.
  local full_at, rem = now, 0
  local s_full_at, s_rem = load(key, '^(%d+):?(%d*)$')
  if s_full_at == false then return CORRUPT end
  if s_full_at and s_full_at >= now then
    full_at, rem = s_full_at, s_rem or 0
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
  local reply = {1, divmod(depth - new_debt, period), 0, reset, delay}
  if inc == 0 then return reply end
  local carry, new_rem = divmod(rem + inc, tokens)
  local value = int(full_at + carry)
  if new_rem > 0 then value = value .. ':' .. int(new_rem) end
  if commit then
    store(key, value, reset)
    return reply
  end
  return reply, function() store(key, value, reset) end
end

ALGORITHMS[1] = function(key, now, cost, commit, p1, p2, p3)
  return gcra(key, now, cost, commit, p1, p2, p3, false)
end
ALGORITHMS[5] = function(key, now, cost, commit, p1, p2, p3)
  return gcra(key, now, cost, commit, p1, p2, p3, true)
end
