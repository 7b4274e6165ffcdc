-- One script holds every algorithm: this prelude, then one file per algorithm
-- (each adds functions to ALGORITHMS), then refund.lua and entry.lua, which
-- decides for every key the call names. See entry.lua for the arguments and
-- the reply. The files are one chunk, concatenated in that order (backend/
-- redis.rs), so each uses the locals of the files before it; each says
-- which at its top.
--
-- Every algorithm is a function that decides for a group of keys:
--   ALGORITHMS[a](first, last, values, now, cost, commit, p1, p2, p3)
-- for KEYS[first..last] (distinct keys, one quota and cost), where values[j]
-- is the string value of KEYS[first + j - 1], read for the whole group by one
-- MGET (false when absent; the sliding log keeps a sorted set and reads it
-- itself). For each key in order it appends its answer to `out` (the bucket
-- algorithms: the number their decision follows from, see gcra.lua; the
-- others: allowed (1, 0, or -1 for a value the algorithm did not write),
-- remaining, retry_after_us, reset_after_us, delay_us) and sets `denied`
-- when the key is not admitted. When a decision consumes, it stores the new
-- state at once if `commit`, and otherwise defers it (`keep`, `release`): so
-- several keys can be decided first and written only if all of them admit.
--
-- This runs for every decision, many per call: the bucket algorithms (one
-- function, in gcra.lua) loop over their group themselves, with their
-- divisions inline, and answer with the one number their decision follows
-- from; library functions are reached through locals, and integers are
-- formatted as integers, each expiry once (see `int` and `expiry_ms`). The
-- window algorithms decide key by key through `each_key`.
--
-- Time is in integer microseconds and every number stays below 2^53 (the
-- quota's constructors check it), so Lua's doubles hold them exactly. A denial
-- writes nothing. A write sets the key's expiry in the same command, for when
-- its state no longer changes any decision.

-- redis.call, redis.pcall and the library functions used most, set by each
-- call: Redis loads a function library where no global is readable.
local call, try_call, floor, format, match = nil, nil, nil, nil, nil
-- The keys decided: the call's KEYS, or on Redis Cluster the keys of a
-- per-node batch, which come in ARGV; set by each call (see entry.lua), as
-- are the reply and the other state of one call below.
local KEYS = nil

-- The algorithms' ids, as the caller sends them (`Algorithm::wire_id` in
-- quota.rs): the keys of ALGORITHMS and of REFUNDS (refund.lua).
local TOKEN_BUCKET, GCRA, FIXED_WINDOW, SLIDING_LOG, SLIDING_WINDOW, LEAKY_BUCKET = 0, 1, 2, 3, 4, 5

-- Each algorithm's file adds its function here, under its id.
local ALGORITHMS = {}

-- The reply, each key's numbers in KEYS order, and its length.
local out, n = nil, 0
-- Whether some key was not admitted, and the writes all-or-nothing decisions
-- defer: writes[i] a function that stores KEYS[i]'s state, or held[i] the
-- state itself, stored with PX held_px[i] (no closure for the common case).
local denied, writes, held, held_px = false, nil, nil, nil

-- Stores what the decisions of KEYS[from..to] deferred.
local function release(from, to)
  for i = from, to do
    local write = writes[i]
    if write then
      write()
    elseif held[i] then
      call('PSETEX', KEYS[i], held_px[i], held[i])
    end
  end
end

local function answer(allowed, remaining, retry, reset, delay)
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5] = allowed, remaining, retry, reset, delay
  n = n + 5
  if allowed ~= 1 then denied = true end
end

local function corrupt()
  return -1, 0, 0, 0, 0
end

-- An algorithm that decides one key at a time, as
--   decide(key, stored, now, cost, commit, p1, p2, p3)
--     -> allowed, remaining, retry_after_us, reset_after_us, delay_us[, write]
-- made a group function.
local function each_key(decide)
  return function(first, last, values, now, cost, commit, p1, p2, p3)
    for i = first, last do
      local allowed, remaining, retry, reset, delay, write =
        decide(KEYS[i], values[i - first + 1], now, cost, commit, p1, p2, p3)
      answer(allowed, remaining, retry, reset, delay)
      writes[i] = write
    end
  end
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

-- A key's string value; false for no key, and for a key of another type,
-- which a refund leaves as it is, as the native module does: its error
-- would fail the refunds of the other keys of the call.
local function get_string(key)
  local value = try_call('GET', key)
  if type(value) == 'table' then return false end
  return value
end

local function load(key, pattern)
  return parse(get_string(key), pattern)
end

-- Extra expiry, in milliseconds, when the caller's clock decides: Redis
-- expires keys on its own clock, which may run ahead of the caller's. State
-- kept past its use never changes a decision, so a longer expiry is safe.
local grace_ms = 0

-- PX arguments already formatted in this call: many keys share an expiry.
local px_of = nil

-- The expiry, in whole milliseconds, of state that matters for ttl_us more.
local function expiry_ms(ttl_us)
  local ms = floor(ttl_us / 1000)
  if ms * 1000 < ttl_us then ms = ms + 1 end
  ms = ms + grace_ms
  local px = px_of[ms]
  if not px then
    px = format('%d', ms)
    px_of[ms] = px
  end
  return px
end

-- A value standing for a key that holds something no algorithm here wrote
-- (another type, found by the 'all' mode's EXISTS): it matches no pattern.
local FOREIGN = '\0'

-- Writes a key's state with its expiry. PSETEX is SET ... PX with no
-- options for Redis to parse. A key read as absent (`fresh`) may hold
-- another type, which GET and MGET read as absent too: it is written with
-- NX, so such a value is never overwritten. Returns false when it was not
-- written, because the key holds a value this algorithm did not write.
local function store(key, value, ttl_us, fresh)
  local px = expiry_ms(ttl_us)
  if fresh then
    return call('SET', key, value, 'PX', px, 'NX') ~= false
  end
  call('PSETEX', key, px, value)
  return true
end

-- Stores KEYS[i]'s new state now if `commit`, else once every key admits
-- ('all' mode has found every absent key absent with EXISTS). Returns false
-- when a fresh key holds a foreign value (see `store`).
local function keep(i, value, ttl_us, commit, fresh)
  if commit then
    return store(KEYS[i], value, ttl_us, fresh)
  end
  held[i], held_px[i] = value, expiry_ms(ttl_us)
  return true
end
