-- Shared by every algorithm's script; each script is this prelude followed by
-- the algorithm. Every script has the same arguments and reply:
--
-- KEYS[1]  the key
-- ARGV[1]  now in microseconds, or '' to read Redis TIME (no skew between instances)
-- ARGV[2]  cost (0 <= cost <= capacity, checked by the caller)
-- ARGV[3..] the algorithm's numbers
--
-- Reply: {allowed (0|1), remaining, retry_after_us, reset_after_us, delay_us}
--
-- Time is in integer microseconds and every number stays below 2^53 (the
-- quota's constructors check it), so Lua's doubles hold them exactly. A denial
-- writes nothing. When a decision writes, the key expires when its state no
-- longer changes any decision.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
local cost = tonumber(ARGV[2])
local key = KEYS[1]

-- Exact floor division of non-negative integers below 2^53: the quotient of
-- two doubles can round up across an integer, so correct it by the remainder.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

local function div_ceil(a, b)
  local q, r = divmod(a, b)
  if r > 0 then q = q + 1 end
  return q
end

-- Integers as plain digits: tostring would switch to exponent notation.
local function int(x)
  return string.format('%.0f', x)
end

-- The stored string's numbers ("a", "a:b" or "a:b:c"), or nil when absent.
local function load(fields)
  local stored = redis.call('GET', key)
  if not stored then return nil end
  local values = {}
  for part in string.gmatch(stored, '[^:]+') do
    local n = tonumber(part)
    if not n or not string.match(part, '^%d+$') then
      values = nil
      break
    end
    values[#values + 1] = n
  end
  if not values or #values < fields[1] or #values > fields[2] then
    return redis.error_reply('ratelimit: unexpected value at ' .. key .. '; was it written by another algorithm?')
  end
  return values
end

local function store(value, ttl_us)
  redis.call('SET', key, value, 'PX', div_ceil(ttl_us, 1000))
end
