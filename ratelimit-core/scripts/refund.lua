-- Refunds: give back `cost` an admission took from a key, when a later
-- dimension of an all-or-nothing check on another Redis Cluster slot denied,
-- or when the caller gives an admission back. Never gives back more than was
-- taken, and never beyond a full quota. The twin of src/algorithm/refund.rs.
-- REFUNDS[id] has the form refund(key, now, cost, p1, p2, p3), under the
-- algorithms' ids of prelude.lua. Uses parse_full_at (gcra.lua), window_end
-- (fixed_window.lua) and call (prelude.lua).
--
-- The buckets' p3 is the debt to take off, in the algorithm's units. The
-- windows' p3 is `until_end`: microseconds from the refund to the end of
-- the admission's window, as the caller measured it. `now + until_end` at
-- the nearest window boundary is that end, whatever the offset between the
-- caller's clock and this one, while round trips stay below half a window.

local REFUNDS = {}

-- The token bucket, GCRA and the leaky bucket: the debt shrinks by `units`,
-- what the caller found is left of the admission's cost (see the twin).
local function refund_gcra(key, now, cost, tokens, period, units)
  local s_full_at, s_rem = parse_full_at(get_string(key))
  -- Nothing to give back leaves the key as it is, expiry included.
  if not s_full_at or s_full_at < now or units == 0 then return end
  local debt = (s_full_at - now) * tokens + s_rem - units
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

-- The end of the admission's window (see above).
local function admission_end(now, until_end, window)
  return floor((now + until_end + floor(window / 2)) / window) * window
end

-- Fixed window: the admission's window's count falls by the cost, while it
-- is the current window.
REFUNDS[FIXED_WINDOW] = function(key, now, cost, limit, window, until_end)
  local s_start, s_count = load(key, '^(%d+):(%d+)$')
  local current = now - now % window
  if not s_start or s_start < current then return end
  local ends = window_end(s_start, current, window)
  -- Only the count begun in the admission's window: one begun later under
  -- another window (the rule changed since) never held it.
  if ends ~= admission_end(now, until_end, window) or s_start ~= ends - window then return end
  if cost == 0 then return end
  local count = s_count - cost
  if count <= 0 then
    call('DEL', key)
  else
    store(key, int(s_start) .. ':' .. int(count), ends - now)
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
      -- A key of another type holds no admission: left as it is.
      try_call('ZREM', key, unpack(members))
      members = {}
    end
  end
end

-- Sliding window: the admission's window's count falls by the cost, while
-- it is the current or the previous window.
REFUNDS[SLIDING_WINDOW] = function(key, now, cost, limit, window, until_end)
  local s_start, s_current, s_previous = load(key, '^(%d+):(%d+):(%d+)$')
  if not s_start then return end
  local stored = s_start - s_start % window
  -- A count begun off this quota's windows was begun under another window.
  if stored ~= s_start or stored + 2 * window <= now then return end
  local admitted = admission_end(now, until_end, window) - window
  local current, previous = s_current, s_previous
  if stored == admitted then
    current = current - cost
    if current < 0 then current = 0 end
  elseif stored == admitted + window then
    previous = previous - cost
    if previous < 0 then previous = 0 end
  else
    return
  end
  -- A window whose count was already 0 gives nothing back: the key is left
  -- as it is, expiry included.
  if current == s_current and previous == s_previous then return end
  if current == 0 and previous == 0 then
    call('DEL', key)
    return
  end
  store(key, int(s_start) .. ':' .. int(current) .. ':' .. int(previous), stored + 2 * window - now)
end
