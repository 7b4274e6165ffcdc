-- The least a GCRA in Lua does: one MGET; per key, parse the stored instant,
-- compare, answer the debt and write the next instant with its expiry. One
-- quota (10 at 2/s) written into the script, no other algorithm, no check of
-- what another writer left, no all-or-nothing.
local call, format, floor = redis.call, string.format, math.floor
local values = call('MGET', unpack(KEYS))
local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local period, depth = 500000, 5000000
local out = {}
for i = 1, #KEYS do
  local full_at = values[i] and tonumber(values[i]) or now
  if full_at < now then full_at = now end
  local debt = full_at - now
  out[i] = debt
  if debt + period <= depth then
    local next_full_at = full_at + period
    call('PSETEX', KEYS[i], format('%d', floor((next_full_at - now) / 1000) + 1), format('%d', next_full_at))
  end
end
return out
