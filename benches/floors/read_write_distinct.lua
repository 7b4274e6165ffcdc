-- read_write.lua, writing a key repeated in the call once: the least a batch
-- of checks that share a global key costs Redis.
local values = redis.call('MGET', unpack(KEYS))
local t = redis.call('TIME')
local value = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local out, written = {}, {}
for i = 1, #KEYS do
  local key = KEYS[i]
  if not written[key] then
    written[key] = true
    redis.call('PSETEX', key, '5000', value)
  end
  out[i] = values[i] and 1 or 0
end
return out
