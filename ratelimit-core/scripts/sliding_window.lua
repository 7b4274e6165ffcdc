-- Sliding window counter: this window's count plus the previous window's,
-- weighted by the share of it the sliding window still covers, in whole
-- milliseconds. The twin of src/algorithm/sliding_window.rs. Uses from
-- prelude.lua: ALGORITHMS and the ids, each_key, parse, answer, keep, int.
--
-- p1 limit, p2 window in µs. State: "<start_us>:<current>:<previous>", the
-- instant the current window began: a count begun inside the current window
-- is current under any quota, one begun in the window before is previous.

ALGORITHMS[SLIDING_WINDOW] = each_key(function(key, stored, now, cost, commit, limit, window)
  local window_ms = window / 1000
  local this = now - now % window
  local start, current, previous = this, 0, 0
  local s_start, s_current, s_previous = parse(stored, '^(%d+):(%d+):(%d+)$')
  if s_start == false then return corrupt() end
  if s_start then
    if s_start >= this then
      -- Begun in this window, or later (the clock went back).
      start, current, previous = s_start - s_start % window, s_current, s_previous
    elseif s_start + window >= this then
      previous = s_current
    end
  end
  local finish = start + window
  -- Before the window's start only after the clock went back: count the
  -- previous window fully then.
  local elapsed_ms = 0
  if now > start then elapsed_ms = divmod(now - start, 1000) end
  local weight = window_ms - elapsed_ms
  -- Everything is scaled by window_ms to stay in integers.
  local used = previous * weight + current * window_ms
  local capacity = limit * window_ms

  -- When the estimate is back to zero.
  local function reset_at(cur)
    if cur > 0 then return finish + window end
    if previous > 0 then return finish end
    return 0
  end
  local function positive(x)
    if x < 0 then return 0 end
    return x
  end

  if used + cost * window_ms > capacity then
    -- The first instant the cost fits: in this window as the previous window's
    -- weight fades, or in the next, where this window's count is the previous.
    local retry_at = nil
    local room = limit - current - cost
    if room >= 0 and previous > 0 then
      local e = window_ms - math.min(divmod(room * window_ms, previous), window_ms)
      if e < window_ms then retry_at = start + e * 1000 end
    end
    if not retry_at then
      local e = 0
      if current > 0 then
        e = window_ms - math.min(divmod((limit - cost) * window_ms, current), window_ms)
      end
      retry_at = finish + e * 1000
    end
    return 0, (divmod(positive(capacity - used), window_ms)), retry_at - now, positive(reset_at(current) - now), 0
  end

  local new_current = current + cost
  local reset = positive(reset_at(new_current) - now)
  local remaining = divmod(capacity - used - cost * window_ms, window_ms)
  if cost == 0 then return 1, remaining, 0, reset, 0 end
  local value = int(start) .. ':' .. int(new_current) .. ':' .. int(previous)
  if commit then
    if not store(key, value, reset, not stored) then return corrupt() end
    return 1, remaining, 0, reset, 0
  end
  return 1, remaining, 0, reset, 0, function() store(key, value, reset) end
end)
