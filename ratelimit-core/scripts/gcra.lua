-- GCRA, which is also how the token bucket is kept: the instant it is full
-- again, one number instead of a level and a time, with the same admissions;
-- and the leaky bucket as a queue on the same arithmetic. The twin of
-- src/algorithm/gcra.rs.
--
-- Uses from prelude.lua: ALGORITHMS and the ids, the per-call state (out, n,
-- denied, KEYS), keep, release, int, expiry_ms, FOREIGN, call. Defines
-- parse_full_at for refund.lua.
--
-- p1 rate tokens (reduced numerator), p2 rate period in µs (reduced
-- denominator), p3 capacity.
--
-- Reply: one number a key, the debt before the request in units (-1 for a
-- foreign value); the decision follows from it, the quota and the cost
-- (gcra::decide_debt on the caller's side, the same arithmetic as below).
--
-- State: "<full_at>" or "<full_at>:<rem>": the bucket is full again (the queue
-- drained) at full_at + rem / tokens µs. Time is counted in units of 1/tokens
-- µs, so one token is exactly `period` units and refill is exact for any rate.
-- Most states are a bare number, which Redis keeps inside the key's object,
-- with no string allocated.
--
-- The most common path of the script: it loops over its group itself.

-- The stored full_at and rem: nil when absent, false for a foreign value.
local function parse_full_at(stored)
  if not stored then return nil end
  local full_at = tonumber(stored)
  if full_at and full_at >= 0 and full_at % 1 == 0 then return full_at, 0 end
  local a, b = match(stored, '^(%d+):(%d+)$')
  if not a then return false end
  return tonumber(a), tonumber(b)
end

ALGORITHMS[GCRA] = function(first, last, values, now, cost, commit, tokens, period, capacity)
  local depth = capacity * period
  local inc = cost * period
  for i = first, last do
    -- A full_at in the past means a full bucket. A clock that went backwards
    -- finds full_at further away, so it sees fewer tokens, never more.
    local full_at, rem = now, 0
    local stored, s_full_at, s_rem = values[i - first + 1], nil, 0
    if stored then s_full_at, s_rem = parse_full_at(stored) end
    if s_full_at and s_full_at >= now then
      full_at, rem = s_full_at, s_rem
    end
    -- A debt deeper than this bucket (run up under another quota, or on a
    -- clock that went back) is waited out as it is, and read as at most
    -- 2^53 - 1, which a double holds exactly (gcra::MAX_DEBT).
    local debt = (full_at - now) * tokens + rem
    if debt > 9007199254740991 then debt = 9007199254740991 end
    local new_debt = debt + inc

    n = n + 1
    if s_full_at == false then
      out[n] = -1
      denied = true
    else
      -- The debt alone answers: the caller derives the rest of the decision.
      -- A request of no cost is admitted however deep the debt, and writes
      -- nothing.
      out[n] = debt
      if inc > 0 and new_debt > depth then
        denied = true
      elseif inc > 0 then
        local reset = floor(new_debt / tokens)
        if reset * tokens < new_debt then reset = reset + 1 end
        local sum = rem + inc
        local carry = floor(sum / tokens)
        local new_rem = sum - carry * tokens
        local value
        if new_rem > 0 then
          value = format('%d:%d', full_at + carry, new_rem)
        else
          value = format('%d', full_at + carry)
        end
        if not keep(i, value, reset, commit, not stored) then
          out[n] = -1
          denied = true
        end
      end
    end
  end
end
ALGORITHMS[TOKEN_BUCKET] = ALGORITHMS[GCRA]
ALGORITHMS[LEAKY_BUCKET] = ALGORITHMS[GCRA]
