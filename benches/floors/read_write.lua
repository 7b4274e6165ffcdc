-- The least a decision of this shape costs Redis: every key read by one
-- MGET, then one PSETEX per key (a number and its expiry), one integer
-- answered per key; no decision at all. KEYS may repeat (a check's global
-- key): each occurrence is written, as a decision per key would.
local values = redis.call('MGET', unpack(KEYS))
local t = redis.call('TIME')
local value = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local out = {}
for i = 1, #KEYS do
  redis.call('PSETEX', KEYS[i], '5000', value)
  out[i] = values[i] and 1 or 0
end
return out
