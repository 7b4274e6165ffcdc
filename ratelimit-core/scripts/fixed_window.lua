-- Fixed window: at most `limit` per window aligned to the epoch. The twin of
-- src/algorithm/fixed_window.rs. The count and the window's expiry are
-- written by one SET ... PX, so a counter can never be left without expiry.
--
-- ARGV[3] limit, ARGV[4] window in µs. State: "<window index>:<count>".

local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local index = divmod(now, window)
local count = 0
local stored = load({2, 2})
if stored then
  if stored.err then return stored end
  -- A stored window at or after ours (the clock went back) still counts.
  if stored[1] >= index then
    index, count = stored[1], stored[2]
  end
end
local until_end = (index + 1) * window - now
if until_end < 0 then until_end = 0 end

if count + cost > limit then
  return {0, limit - count, until_end, until_end, 0}
end
count = count + cost
if cost > 0 then
  store(int(index) .. ':' .. int(count), until_end)
end
return {1, limit - count, 0, until_end, 0}
