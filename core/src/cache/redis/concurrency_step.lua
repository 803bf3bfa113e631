-- InFlightStore::concurrency_step: drop ended leases, read the limit, decide
-- and write, in one atomic step. decide::concurrency::step, line for line.
-- KEYS[1]: the limit (a string: millionths of a call, decimal).
-- KEYS[2]: the calls in flight (sorted set: member = a call's id, score = its
--          lease's end in µs).
-- ARGV: now (µs, or '' for the server's TIME), the call's id, its lease (µs),
--       its lease (ms, rounded up), max_ahead (µs), the command ('admit',
--       'success', 'overload' or 'neither'), initial, min, max (millionths),
--       backoff (thousandths), the limit's ttl (ms), the reserve an
--       admission may not take (parts per million of the whole limit).
-- Returns {admitted (0|1), in_flight, limit, next, healed (0|1)}.
local now = server_now()
if ARGV[1] ~= '' then
  local ceiling = now + tonumber(ARGV[5])
  now = tonumber(ARGV[1])
  if now > ceiling then
    now = ceiling
  end
end
local unit = 1000000
local command = ARGV[6]
local initial, min, max, backoff = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])

-- limit_in_force: the stored limit within [min, max]; nothing readable is
-- the initial one (and, when something was there, healed).
local raw = read_string(KEYS[1])
local stored = stored_number(raw or nil)
local healed = 0
if raw and stored == nil then
  healed = 1
end
local limit = stored or initial
if limit < min then
  limit = min
elseif limit > max then
  limit = max
end

-- The live leases; a lease counts through its last microsecond.
local set = KEYS[2]
if not window_readable(set) then
  redis.call('DEL', set)
end
redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. int(now))
local in_flight = redis.call('ZCARD', set)
local held = redis.call('ZSCORE', set, ARGV[2]) ~= false

-- whole: a limit's whole calls, never below one.
local whole = math.floor(limit / unit)
if whole < 1 then
  whole = 1
end

-- allowance: the whole limit less ⌈whole × reserve / 10^6⌉; every product
-- stays below 2^53, and the quotient is an integer or at least 10^-6 from one.
local reserved = math.ceil(whole * tonumber(ARGV[12]) / 1000000)
local allowance = whole - reserved

local admitted, next = 0, limit
if command == 'admit' then
  if in_flight < allowance then
    admitted = 1
  end
elseif held then
  admitted = 1
  if command == 'overload' then
    -- limit <= 10^10 and backoff < 10^3: the product is exact.
    next = math.floor(limit * backoff / 1000)
    if next < min then
      next = min
    end
  elseif command == 'success' and in_flight * 2 >= whole then
    next = limit + math.floor(unit / whole)
    if next > max then
      next = max
    end
  end
end

if command == 'admit' then
  if admitted == 1 then
    redis.call('ZADD', set, int(now + tonumber(ARGV[3])), ARGV[2])
    if redis.call('PTTL', set) < tonumber(ARGV[4]) then
      redis.call('PEXPIRE', set, ARGV[4])
    end
  end
else
  redis.call('ZREM', set, ARGV[2])
end
redis.call('SET', KEYS[1], int(next), 'PX', ARGV[11])
return {admitted, in_flight, limit, next, healed}
