-- Decides for every key of the call, with one TIME at most.
--
-- KEYS[i]  the i-th key (all in one hash slot on Redis Cluster)
-- ARGV[1]  'each': decide each key on its own, in order, writing as it goes;
--          'all': admit all or none: decide every key, then write only if
--          every one admits (the keys must be distinct);
--          'peek': decide as 'all' does, and write nothing (an inspection);
--          'refund': give back each key's cost (see refund.lua); no reply
-- then groups of 7 fields, each for the next `count` keys in KEYS order:
--   count, algorithm (the index of Algorithm::ALL), cost, now in µs or ''
--   for Redis TIME, and the algorithm's numbers p1..p3
-- Concurrent decisions on one quota form one group, so a key costs Redis one
-- argument, not seven. The keys of a group are distinct (the caller starts a
-- new group where a key repeats): the group's values are read before any of
-- its decisions writes.
--
-- Reply: each key's answer in KEYS order (see the prelude and the algorithm's
-- file). A key whose value this algorithm did not write answers -1 first; in
-- 'each' mode the others are still decided, in 'all' mode nothing is written.

local time_now = nil
local function now_of(arg)
  if arg ~= '' then
    grace_ms = 1000
    return tonumber(arg)
  end
  if not time_now then
    local t = call('TIME')
    time_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_now
end

local mode = ARGV[1]
local commit = mode == 'each'
local last = 0
for g = 2, #ARGV, 7 do
  local first = last + 1
  last = last + tonumber(ARGV[g])
  local algorithm, cost, now = tonumber(ARGV[g + 1]), tonumber(ARGV[g + 2]), now_of(ARGV[g + 3])
  local p1, p2, p3 = tonumber(ARGV[g + 4]), tonumber(ARGV[g + 5]), tonumber(ARGV[g + 6])
  if mode == 'refund' then
    local refund = REFUNDS[algorithm]
    for i = first, last do
      refund(KEYS[i], now, cost, p1, p2, p3)
    end
  else
    -- One read for the group: a command costs Redis far more than a key.
    local values = {}
    if algorithm ~= SLIDING_LOG then
      values = call('MGET', unpack(KEYS, first, last))
      -- MGET reads a key of another type as absent. 'each' mode finds those
      -- when it writes (with NX); 'all' mode must know before anything is
      -- written.
      if not commit then
        for j = 1, last - first + 1 do
          if not values[j] and call('EXISTS', KEYS[first + j - 1]) == 1 then values[j] = FOREIGN end
        end
      end
    end
    ALGORITHMS[algorithm](first, last, values, now, cost, commit, p1, p2, p3)
  end
end
if not commit and not denied and mode ~= 'peek' then
  for i = 1, last do
    if writes[i] then writes[i]() end
  end
end
return out
