-- One script holds every algorithm: this prelude, then one file per algorithm
-- (each adds a function to ALGORITHMS), then entry.lua, which decides for
-- every key the call names. See entry.lua for the arguments and the reply.
--
-- Every algorithm function has the form
--   decide(key, now, cost, commit, p1, p2, p3, p4) -> reply[, write]
-- where reply is {allowed (0|1), remaining, retry_after_us, reset_after_us,
-- delay_us}. When the decision consumes, it stores the new state at once if
-- `commit`, and otherwise returns `write`, a function that stores it: so
-- several keys can be decided first and written only if all of them admit.
-- A value the algorithm did not write answers CORRUPT.
--
-- Time is in integer microseconds and every number stays below 2^53 (the
-- quota's constructors check it), so Lua's doubles hold them exactly. A denial
-- writes nothing. A write sets the key's expiry in the same command, for when
-- its state no longer changes any decision.

local ALGORITHMS = {}
local CORRUPT = {-1, 0, 0, 0, 0}

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

-- The numbers of the string at `key`, matched by `pattern` (digits and
-- colons, such as '^(%d+):(%d+)$'): nil when absent, false for anything this
-- algorithm did not write. One match call: this runs for every decision.
local function load(key, pattern)
  local stored = redis.call('GET', key)
  if not stored then return nil end
  local a, b, c = string.match(stored, pattern)
  if not a then return false end
  return tonumber(a), tonumber(b), tonumber(c)
end

-- Extra expiry, in milliseconds, when the caller's clock decides: Redis
-- expires keys on its own clock, which may run ahead of the caller's. State
-- kept past its use never changes a decision, so a longer expiry is safe.
local grace_ms = 0

local function expiry_ms(ttl_us)
  return div_ceil(ttl_us, 1000) + grace_ms
end

local function store(key, value, ttl_us)
  redis.call('SET', key, value, 'PX', expiry_ms(ttl_us))
end
