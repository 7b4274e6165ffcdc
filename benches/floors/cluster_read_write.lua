#!lua flags=allow-cross-slot-keys
-- read_write.lua on a Redis Cluster node, for keys of many slots sent in
-- ARGV as the limiter's 'batch' mode sends them (ARGV[2] keys follow it):
-- a command from the script must stay within one slot, so each key is read
-- by a GET of its own.
local count = tonumber(ARGV[2])
local t = redis.call('TIME')
local value = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local out = {}
for i = 3, 2 + count do out[i - 2] = redis.call('GET', ARGV[i]) and 1 or 0 end
for i = 3, 2 + count do redis.call('PSETEX', ARGV[i], '5000', value) end
return out
