-- Refunds: give back `cost` just taken from a key, when a later dimension of
-- an all-or-nothing check on another Redis Cluster slot denied. Never gives
-- back more than was taken, and never beyond a full quota. REFUNDS[id] has the
-- form refund(key, now, cost, p1, p2, p3), under the algorithms' ids of
-- prelude.lua. Uses parse_full_at (gcra.lua) and call (prelude.lua).

local REFUNDS = {}

-- The token bucket, GCRA and the leaky bucket: the debt shrinks by the cost.
local function refund_gcra(key, now, cost, tokens, period)
  local s_full_at, s_rem = parse_full_at(call('GET', key))
  if not s_full_at or s_full_at < now then return end
  local debt = (s_full_at - now) * tokens + s_rem - cost * period
  if debt <= 0 then
    call('DEL', key)
    return
  end
  local whole, rem = divmod(debt, tokens)
  local value = int(now + whole)
  if rem > 0 then value = value .. ':' .. int(rem) end
  store(key, value, div_ceil(debt, tokens))
end
REFUNDS[TOKEN_BUCKET] = refund_gcra
REFUNDS[GCRA] = refund_gcra
REFUNDS[LEAKY_BUCKET] = refund_gcra

-- Fixed window: the current window's count falls by the cost.
REFUNDS[FIXED_WINDOW] = function(key, now, cost, limit, window)
  local s_start, s_count = load(key, '^(%d+):(%d+)$')
  if not s_start or s_start < now - now % window then return end
  local count = s_count - cost
  if count <= 0 then
    call('DEL', key)
  else
    local until_end = window_end(s_start, now - now % window, window) - now
    if until_end < 1 then until_end = 1 end
    store(key, int(s_start) .. ':' .. int(count), until_end)
  end
end

-- Sliding log: the admissions its tagged decision added are removed, by
-- name, so a refund never takes another caller's admission and applying it
-- twice removes nothing more. An untagged request is never refunded.
REFUNDS[SLIDING_LOG] = function(key, now, cost, limit, window, tag)
  if tag == 0 then return end
  local members = {}
  for i = 1, cost do
    members[i] = 't' .. int(tag) .. ':' .. int(i)
    if #members == ZADD_CHUNK or i == cost then
      call('ZREM', key, unpack(members))
      members = {}
    end
  end
end

-- Sliding window: the current window's count falls by the cost.
REFUNDS[SLIDING_WINDOW] = function(key, now, cost, limit, window)
  local s_start, s_current, s_previous = load(key, '^(%d+):(%d+):(%d+)$')
  if not s_start or s_start < now - now % window then return end
  local current = s_current - cost
  if current < 0 then current = 0 end
  local ttl = s_start - s_start % window + 2 * window - now
  if ttl < 1 then ttl = 1 end
  store(key, int(s_start) .. ':' .. int(current) .. ':' .. int(s_previous), ttl)
end
