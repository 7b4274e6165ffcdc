-- Decides for every key of the call, with one TIME at most.
--
-- KEYS[i]  the i-th key (all in one hash slot on Redis Cluster)
-- ARGV[1]  'each': decide each key on its own, in order, writing as it goes;
--          'all': admit all or none: decide every key, then write only if
--          every one admits (the keys must be distinct);
--          'peek': decide as 'all' does, and write nothing (an inspection);
--          'refund': give back each key's cost (see refund.lua); no reply;
--          'batch': 'each' over keys of several slots of this Redis Cluster
--          node, sent as the script flagged allow-cross-slot-keys, with no
--          KEYS (Redis would refuse the whole call for a key there that
--          moved, or that the user may not touch): ARGV[2] is the number
--          of keys and the keys follow it, then the requests and the groups;
--          'runs': runs of keys in KEYS order, each decided as 'each' or as
--          'all' on its own (a batch of single decisions and all-or-nothing
--          checks): ARGV[2] is the number of runs, one count of keys per run
--          follows (negative for an 'all' run), then the requests and the
--          groups, which never span two runs; a run's writes land before
--          the next run reads
-- then the call's requests: their number, and 6 fields each: algorithm (its
--   id: prelude.lua, `Algorithm::wire_id`), cost, now in µs or '' for Redis
--   TIME, and the algorithm's numbers p1..p3;
-- then groups of 2 fields, each for the next `count` keys in KEYS order:
--   count, and the place of the keys' request among the requests, from 1.
-- Concurrent decisions on one quota form one group, so a key costs Redis one
-- argument, and a request is named once a call however many groups it has
-- (the limits of checks of several limits). The keys of a group are
-- distinct (the caller starts a new group where a key repeats): the group's
-- values are read before any of its decisions writes.
--
-- Reply: each key's answer in KEYS order (see the prelude and the algorithm's
-- file). A key whose value this algorithm did not write answers -1 first; in
-- 'each' mode the others are still decided, in 'all' mode nothing is written.
-- A 'batch' reply starts with the number of its keys this node does not
-- serve now (moved, migrating, importing, or the cluster down): when that is
-- not 0, their indexes (from 1) follow, nothing else, and nothing was
-- written; when it is 0, the keys' answers follow.

-- Redis TIME in µs, read once a call (set by each call, as the prelude's state).
local time_now = nil
-- A request's instant: its own (a number), or Redis TIME for ''.
local function now_of(arg)
  if arg ~= '' then
    grace_ms = 1000
    return arg
  end
  if not time_now then
    local t = call('TIME')
    time_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return time_now
end

-- The values of KEYS[from..to], the keys of an all-or-nothing run whose
-- groups start at the g-th, by one MGET. MGET reads a key of another type as
-- absent, and 'each' mode finds those when it writes (with NX); all or
-- nothing must know before anything is written: one EXISTS for the absent
-- keys, and only when some of them exist after all (another type, or the
-- sliding log's sorted sets, which the log reads itself), one a key for the
-- absent keys of the other algorithms, found by walking the run's groups
-- (`sizes`, `places` and `requests`: see check_call).
local function read_whole(from, to, g, sizes, places, requests)
  local values = call('MGET', unpack(KEYS, from, to))
  local absent, n_absent = {}, 0
  for j = from, to do
    if not values[j - from + 1] then
      n_absent = n_absent + 1
      absent[n_absent] = KEYS[j]
    end
  end
  if n_absent == 0 or call('EXISTS', unpack(absent, 1, n_absent)) == 0 then return values end
  local i = from
  while i <= to do
    local count = sizes[g]
    if requests[places[g]][1] ~= SLIDING_LOG then
      for j = i, i + count - 1 do
        if not values[j - from + 1] and call('EXISTS', KEYS[j]) == 1 then
          values[j - from + 1] = FOREIGN
        end
      end
    end
    i, g = i + count, g + 1
  end
  return values
end
-- Every number a call sends stays below 2^53 (see the prelude), and a
-- quota's depth at most 2^52 (`quota::MAX_EXACT`).
local BOUND = 9007199254740992
local MAX_EXACT = 4503599627370496
-- The longest sliding log (`Quota::MAX_LOG_LIMIT`): an admission adds its
-- cost in members, at most the limit.
local MAX_LOG_LIMIT = 10000

-- Refuses the call's arguments, before anything is written, as the module
-- does (`RLARGS`): a call no limiter sends (another program's, or garbage)
-- must neither loop past its keys nor write a value or an expiry no
-- decision can make.
local function refuse(what)
  error(redis.error_reply('RLARGS ' .. what))
end

-- `text` as a whole number in [lo, hi] (never NaN or infinite), or the call
-- is refused.
local function whole(text, lo, hi, what)
  local x = tonumber(text)
  if not x or x ~= floor(x) or x < lo or x > hi then refuse(what) end
  return x
end

-- Reads and checks the requests (from ARGV[at], `count` of them) and the
-- groups (from ARGV[first_group]) of a call over `keys` keys in `mode`,
-- whose runs end at `run_last` (in 'runs' mode), each number once: the
-- requests, each {algorithm, cost, instant or '', p1, p2, p3}; and each
-- group's count of keys and its request's place among them.
local function check_call(ARGV, mode, at, count, first_group, keys, run_last)
  local requests = {}
  for r = 1, count do
    local f = at + 6 * (r - 1)
    local algorithm = tonumber(ARGV[f])
    if not ALGORITHMS[algorithm] then refuse('a request names no quota') end
    local cost = whole(ARGV[f + 1], 0, BOUND, 'a cost was expected')
    -- A clock past 2^53 µs (year 2255) is the caller's to keep.
    local now = ARGV[f + 2]
    if now ~= '' then now = whole(now, 0, 2 ^ 64, 'an instant was expected') end
    local p1 = whole(ARGV[f + 3], 1, MAX_EXACT, "a quota's number was expected")
    local p2 = whole(ARGV[f + 4], 1, MAX_EXACT, "a quota's number was expected")
    -- Signed: a refund's `until_end`.
    local p3 = whole(ARGV[f + 5], -BOUND, BOUND, "a quota's number was expected")
    -- What a quota holds (`Quota::windowed`, `Quota::bucket`): a window of
    -- whole milliseconds, its limit times its milliseconds at most 2^52; a
    -- bucket's capacity times its period at most 2^52; a bucket refund's
    -- units are none below 0.
    local windowed = algorithm == FIXED_WINDOW or algorithm == SLIDING_LOG
      or algorithm == SLIDING_WINDOW
    if windowed then
      if p2 % 1000 ~= 0 or p1 * (p2 / 1000) > MAX_EXACT then refuse('a window no quota has') end
    elseif mode == 'refund' then
      if p3 < 0 then refuse('a refund of less than nothing') end
    elseif p3 < 1 or p3 * p2 > MAX_EXACT then
      refuse('a bucket no quota has')
    end
    -- A log's admission adds its cost in members, and its refund removes
    -- them one by one: never more than the limit.
    if algorithm == SLIDING_LOG and (p1 > MAX_LOG_LIMIT or mode == 'refund' and cost > p1) then
      refuse('a sliding log longer than ' .. MAX_LOG_LIMIT .. ', or a refund above its limit')
    end
    requests[r] = { algorithm, cost, now, p1, p2, p3 }
  end
  local sizes, places, named, run = {}, {}, 0, 1
  for g = first_group, #ARGV, 2 do
    local first = named + 1
    local size = whole(ARGV[g], 0, keys, "a group's count of keys was expected")
    named = named + size
    if named > keys then refuse('the groups name more keys than the call') end
    sizes[#sizes + 1] = size
    places[#places + 1] = whole(ARGV[g + 1], 1, count, 'a group names no request of the call')
    if run_last and named >= first then
      while run_last[run] and run_last[run] < first do run = run + 1 end
      if not run_last[run] or named > run_last[run] then refuse('a group spans two runs') end
    end
  end
  return requests, sizes, places
end

-- One call: the keys, and the arguments described above. Everything above is
-- defined once when the script is loaded as a Redis function library, and
-- only this runs per FCALL (by EVALSHA, the whole script runs each call).
local function decide_call(keys, ARGV)
  call, try_call = redis.call, redis.pcall
  floor, format, match = math.floor, string.format, string.match
  KEYS, out, n, denied, writes, held, held_px = keys, {}, 0, false, {}, {}, {}
  grace_ms, px_of, time_now = 0, {}, nil
  local mode = ARGV[1]
  if not (mode == 'each' or mode == 'all' or mode == 'peek' or mode == 'refund' or mode == 'runs'
      or mode == 'batch') then
    refuse('an unknown mode')
  end
  local first_group = 2
  -- In 'batch' mode, each key's value read up front, and the keys read since.
  local batch, read_first, reread = mode == 'batch', nil, nil
  if batch then
    local count = whole(ARGV[2], 0, #ARGV - 2, 'a count of keys was expected')
    KEYS = { unpack(ARGV, 3, 2 + count) }
    first_group = 3 + count
    mode = 'each'
    -- Every key is read before any is written: a key this node does not
    -- serve fails its command, and a batch must not fail half written. The
    -- read is a pcall so that such a key is reported, not raised; a key the
    -- user may read but not write is reported too, before its write fails.
    read_first, reread = {}, {}
    local elsewhere = {}
    for i = 1, count do
      local value = try_call('GET', KEYS[i])
      if not redis.acl_check_cmd('SET', KEYS[i], '') then
        value = { err = 'NOPERM' }
      end
      if type(value) == 'table' and value.err then
        -- A key of another type is this node's, and foreign to every algorithm.
        if string.sub(value.err, 1, 9) == 'WRONGTYPE' then
          value = FOREIGN
        else
          elsewhere[#elsewhere + 1] = i
        end
      end
      read_first[i] = value
    end
    if #elsewhere > 0 then
      table.insert(elsewhere, 1, #elsewhere)
      return elsewhere
    end
    out[1], n = 0, 1
  end
  -- An all-or-nothing run's values, once read, and the run's first group.
  local run_values, run_group = nil, 1

  -- In 'runs' mode, the last key of each run and whether it is all or
  -- nothing; the run being decided, and its first key.
  local run_last, run_all, run, run_first = nil, nil, 1, 1
  if mode == 'runs' then
    local count = whole(ARGV[2], 0, #ARGV, 'a count of runs was expected')
    run_last, run_all = {}, {}
    local through = 0
    for r = 1, count do
      local keys = whole(ARGV[2 + r], -#KEYS, #KEYS, "a run's length was expected")
      run_all[r] = keys < 0
      through = through + (keys < 0 and -keys or keys)
      if through > #KEYS then refuse('the runs name more keys than the call') end
      run_last[r] = through
    end
    first_group = 3 + count
  end
  -- The requests' fields, then the groups.
  local count = whole(ARGV[first_group], 0, (#ARGV - first_group) / 6,
    'a count of requests was expected')
  local requests, sizes, places = check_call(ARGV, mode, first_group + 1, count,
    first_group + 1 + 6 * count, #KEYS, run_last)
  local commit = mode == 'each' or mode == 'runs'
  local last = 0
  for g = 1, #sizes do
    local first = last + 1
    last = last + sizes[g]
    -- The run's first group, where read_whole starts.
    if first == run_first then run_group = g end
    if run_last then
      commit = not run_all[run]
      -- An all-or-nothing run is denied by its own keys alone.
      if first == run_first then denied = false end
    end
    local request = requests[places[g]]
    local algorithm, cost, now = request[1], request[2], now_of(request[3])
    local p1, p2, p3 = request[4], request[5], request[6]
    if mode == 'refund' then
      local refund = REFUNDS[algorithm]
      for i = first, last do
        refund(KEYS[i], now, cost, p1, p2, p3)
      end
    else
      -- One read for the group, or for an all-or-nothing run: a command costs
      -- Redis far more than a key.
      local values = {}
      if batch then
        -- One slot per command across slots, so no MGET: the values read up
        -- front, unless an earlier group of this call wrote the key since.
        for i = first, last do
          local key = KEYS[i]
          if reread[key] then
            local value = try_call('GET', key)
            if type(value) == 'table' then value = FOREIGN end
            values[i - first + 1] = value
          else
            values[i - first + 1] = read_first[i]
            reread[key] = true
          end
        end
      elseif algorithm ~= SLIDING_LOG then
        if commit then
          values = call('MGET', unpack(KEYS, first, last))
        else
          -- An all-or-nothing run's keys are distinct and read together, at
          -- its first group.
          if not run_values then
            run_values = read_whole(run_first, run_last and run_last[run] or #KEYS, run_group,
              sizes, places, requests)
          end
          for i = first, last do
            values[i - first + 1] = run_values[i - run_first + 1]
          end
        end
      end
      ALGORITHMS[algorithm](first, last, values, now, cost, commit, p1, p2, p3)
    end
    if run_last and last == run_last[run] then
      if run_all[run] and not denied then release(run_first, last) end
      run, run_first, run_values = run + 1, last + 1, nil
    end
  end
  if not run_last and not commit and not denied and mode ~= 'peek' then release(1, last) end
  return out
end
