-- Decides for every key of the call, with one TIME at most.
--
-- KEYS[i]  the i-th key (all in one hash slot on Redis Cluster)
-- ARGV[1]  'each': decide each key on its own, in order, writing as it goes;
--          'all': admit all or none: decide every key, then write only if
--          every one admits (the keys must be distinct);
--          'refund': give back each key's cost (see refund.lua); no reply
-- then for each key, 7 fields:
--   algorithm (the index of Algorithm::ALL), cost, now in µs or '' for Redis
--   TIME, and the algorithm's numbers p1..p4
--
-- Reply: 5 numbers per key (see the prelude). A key whose value this
-- algorithm did not write answers allowed = -1; in 'each' mode the others are
-- still decided, in 'all' mode nothing is written.

local time_now = nil
local function now_of(arg)
  if arg ~= '' then
    grace_ms = 1000
    return tonumber(arg)
  end
  if not time_now then
    local t = redis.call('TIME')
    time_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_now
end

local all = ARGV[1] == 'all'
if ARGV[1] == 'refund' then
  for i = 1, #KEYS do
    local base = 1 + (i - 1) * 7
    local refund = REFUNDS[tonumber(ARGV[base + 1])]
    refund(KEYS[i], now_of(ARGV[base + 3]), tonumber(ARGV[base + 2]),
      tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5]), tonumber(ARGV[base + 6]), tonumber(ARGV[base + 7]))
  end
  return {}
end
local flat = {}
local replies = {}
local writes = {}
local denied = false
for i = 1, #KEYS do
  local base = 1 + (i - 1) * 7
  local decide = ALGORITHMS[tonumber(ARGV[base + 1])]
  local cost = tonumber(ARGV[base + 2])
  local now = now_of(ARGV[base + 3])
  local p1, p2, p3, p4 = tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5]), tonumber(ARGV[base + 6]), tonumber(ARGV[base + 7])
  if all then
    local reply, write = decide(KEYS[i], now, cost, false, p1, p2, p3, p4)
    replies[i], writes[i] = reply, write
    if reply[1] ~= 1 then denied = true end
  else
    -- Deciding one key at a time: append the reply as it comes.
    local reply = decide(KEYS[i], now, cost, true, p1, p2, p3, p4)
    local n = #flat
    flat[n + 1], flat[n + 2], flat[n + 3], flat[n + 4], flat[n + 5] = reply[1], reply[2], reply[3], reply[4], reply[5]
  end
end
if all and not denied then
  for i = 1, #KEYS do
    if writes[i] then writes[i]() end
  end
end

for i = 1, #replies do
  for j = 1, 5 do flat[#flat + 1] = replies[i][j] end
end
return flat
