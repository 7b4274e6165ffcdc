-- Fixed window (2): at most `limit` per window aligned to the epoch. The twin
-- of src/algorithm/fixed_window.rs. The count and the window's expiry are
-- written by one PSETEX, so a counter can never be left without expiry.
--
-- p1 limit, p2 window in µs. State: "<window index>:<count>".

ALGORITHMS[2] = each_key(function(key, stored, now, cost, commit, limit, window)
  local index = divmod(now, window)
  local count = 0
  local s_index, s_count = parse(stored, '^(%d+):(%d+)$')
  if s_index == false then return corrupt() end
  -- A stored window at or after ours (the clock went back) still counts.
  if s_index and s_index >= index then
    index, count = s_index, s_count
  end
  local until_end = (index + 1) * window - now
  if until_end < 0 then until_end = 0 end

  if count + cost > limit then
    return 0, limit - count, until_end, until_end, 0
  end
  count = count + cost
  if cost == 0 then return 1, limit - count, 0, until_end, 0 end
  local value = int(index) .. ':' .. int(count)
  if commit then
    if not store(key, value, until_end, not stored) then return corrupt() end
    return 1, limit - count, 0, until_end, 0
  end
  return 1, limit - count, 0, until_end, 0, function() store(key, value, until_end) end
end)
