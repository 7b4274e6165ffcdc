-- One script holds every algorithm: this prelude, then one file per algorithm
-- (each adds a function to ALGORITHMS), then refund.lua and entry.lua, which
-- decides for every key the call names. See entry.lua for the arguments and
-- the reply.
--
-- Every algorithm function has the form
--   decide(key, stored, now, cost, commit, p1, p2, p3, p4)
--     -> allowed (0|1), remaining, retry_after_us, reset_after_us, delay_us[, write]
-- where `stored` is the key's string value, read for the whole group of keys
-- by one MGET (false when absent; unused by the sliding log, which keeps a
-- sorted set).
-- When the decision consumes, it stores the new state at once if `commit`,
-- and otherwise also returns `write`, a function that stores it: so several
-- keys can be decided first and written only if all of them admit. A value
-- the algorithm did not write answers allowed = -1 (see `corrupt`).
--
-- This runs for every decision, many per call: values are returned rather
-- than put in tables, library functions are reached through locals, and
-- integers are formatted as integers (see `int`).
--
-- Time is in integer microseconds and every number stays below 2^53 (the
-- quota's constructors check it), so Lua's doubles hold them exactly. A denial
-- writes nothing. A write sets the key's expiry in the same command, for when
-- its state no longer changes any decision.

local call = redis.call
local floor = math.floor
local format = string.format
local match = string.match

local ALGORITHMS = {}

local function corrupt()
  return -1, 0, 0, 0, 0
end

-- Floor division of integers 0 <= a < 2^53 by b >= 1 is exact in doubles:
-- the quotient's rounding error is at most a/b * 2^-53 < 1/b, while a
-- quotient short of an integer is short by at least 1/b, so rounding never
-- reaches the next integer. Hot paths write floor(a / b) inline: a Lua call
-- costs more than the division.
local function divmod(a, b)
  local q = floor(a / b)
  return q, a - q * b
end

local function div_ceil(a, b)
  local q = floor(a / b)
  if q * b < a then q = q + 1 end
  return q
end

-- Integers as plain digits. tostring would switch to exponent notation, and a
-- number handed to redis.call is formatted by Redis as a double, several
-- times slower than '%d' (a C long here: exact below 2^53).
local function int(x)
  return format('%d', x)
end

-- The numbers of a stored value, matched by `pattern` (digits and colons,
-- such as '^(%d+):(%d+)$'): nil when absent, false for anything this
-- algorithm did not write. One match call.
local function parse(stored, pattern)
  if not stored then return nil end
  local a, b, c = match(stored, pattern)
  if not a then return false end
  return tonumber(a), tonumber(b), tonumber(c)
end

local function load(key, pattern)
  return parse(call('GET', key), pattern)
end

-- Extra expiry, in milliseconds, when the caller's clock decides: Redis
-- expires keys on its own clock, which may run ahead of the caller's. State
-- kept past its use never changes a decision, so a longer expiry is safe.
local grace_ms = 0

local function expiry_ms(ttl_us)
  return int(div_ceil(ttl_us, 1000) + grace_ms)
end

local function store(key, value, ttl_us)
  call('SET', key, value, 'PX', expiry_ms(ttl_us))
end
