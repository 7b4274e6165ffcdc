-- Fixed window: at most `limit` per window aligned to the epoch. The twin of
-- src/algorithm/fixed_window.rs. Uses from prelude.lua: ALGORITHMS and the
-- ids, each_key, parse, answer, keep, int. The count and the window's expiry are
-- written by one PSETEX, so a counter can never be left without expiry.
--
-- p1 limit, p2 window in µs. State: "<start_us>:<count>", the instant the
-- counted window began: a count begun inside the current window counts
-- under any quota, an older one does not.

-- The end of the window a count begun at `start` belongs to (see the twin).
local function window_end(start, current, window)
  if start < current + window then return current + window end
  return start - start % window + window
end

ALGORITHMS[FIXED_WINDOW] = each_key(function(key, stored, now, cost, commit, limit, window)
  local current = now - now % window
  local start, count = current, 0
  local s_start, s_count = parse(stored, '^(%d+):(%d+)$')
  if s_start == false then return corrupt() end
  -- Counted in a window that began in ours, or later (the clock went back),
  -- from the start of its window as this quota cuts windows (see the twin).
  if s_start and s_start >= current then
    start, count = s_start - s_start % window, s_count
  end
  local until_end = window_end(start, current, window) - now
  if until_end < 0 then until_end = 0 end

  if count + cost > limit then
    local remaining = limit - count
    if remaining < 0 then remaining = 0 end
    return 0, remaining, until_end, until_end, 0
  end
  count = count + cost
  if cost == 0 then return 1, limit - count, 0, until_end, 0 end
  local value = int(start) .. ':' .. int(count)
  if commit then
    if not store(key, value, until_end, not stored) then return corrupt() end
    return 1, limit - count, 0, until_end, 0
  end
  return 1, limit - count, 0, until_end, 0, function() store(key, value, until_end) end
end)
