-- Helpers shared by the redstring scripts; prepended to each script body.
--
-- Instants are integer microseconds since the Unix epoch and cross the wire as
-- decimal strings. A Lua number holds them exactly (they are far below 2^53),
-- but `redis.call` would format a number argument with "%.14g" and lose digits,
-- so every number handed to Redis goes through `int` first.

local function int(n)
  return string.format('%d', n)
end

-- The server's own clock, in µs.
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The instant to judge at: the caller's (a decimal string) or, when the caller
-- sent the empty string, the server's own clock (TimeSource::Store).
local function now_from(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  return server_now()
end

-- One number of a stored record, as time::stored_number reads it: 1 to 16
-- decimal digits, at most 2^53; nil for anything else. The bound is checked
-- on the digits: a 16-digit string just above 2^53 would round to it as a
-- Lua number.
local function stored_number(s)
  if not s or #s == 0 or #s > 16 or string.find(s, '^%d+$') == nil then
    return nil
  end
  if #s == 16 and s > '9007199254740992' then
    return nil
  end
  return tonumber(s)
end

-- The largest score the adapter ever writes (2^53 µs). Anything above it (a
-- foreign `ZADD key +inf x`) is no hit of ours and would hold a slot forever.
local MAX_SCORE = '9007199254740992'

-- What a key a value should live at (a string) holds, as text: the value,
-- false when the key is absent, or "WRONGTYPE: a <type>, not a string" when a
-- foreign writer left another type there (GET would fail on it). The marker
-- parses as no value, so a wrong-typed key reads like an unreadable one and
-- the next write replaces it (SET overwrites any type).
local function read_string(key)
  local t = redis.call('TYPE', key).ok
  if t ~= 'string' and t ~= 'none' then
    return 'WRONGTYPE: a ' .. t .. ', not a string'
  end
  return redis.call('GET', key)
end

-- Whether `w` can be read as a hit window: a sorted set, or nothing. A value
-- of another type reads as an empty window.
local function window_readable(w)
  local t = redis.call('TYPE', w).ok
  return t == 'zset' or t == 'none'
end

-- Makes `w` fit to record in: a foreign value of another type is deleted,
-- and scores beyond any the adapter writes are dropped. Returns 1 when it
-- removed something, 0 when the window was sound. A sound window sees reads
-- only: the first write of a script is the one Redis checks against
-- `maxmemory`, and that must stay the hit itself.
local function heal_window(w)
  if not window_readable(w) then
    redis.call('DEL', w)
    return 1
  end
  if redis.call('ZCOUNT', w, '(' .. MAX_SCORE, '+inf') > 0 then
    redis.call('ZREMRANGEBYSCORE', w, '(' .. MAX_SCORE, '+inf')
    return 1
  end
  return 0
end

-- HitWindow::record_hit, as MemoryCache's State::record does it: add one hit
-- at `at`, keep the series alive at least `ttl_ms` from now (never shorten a
-- longer life), and drop hits more than `ttl_us` older than the server's
-- clock `store_now` (never than the newest stamp: a far-future stamp must not
-- prune anyone else's hits).
--
-- Members are "<score>:<n>" where n is how many hits already sit at that exact
-- score. Hits only ever leave a score all together (pruning by score, expiry,
-- DEL), so n is unique without any client nonce, across every process.
local function record(w, at, ttl_us, ttl_ms, store_now)
  local score = int(at)
  local member = score .. ':' .. redis.call('ZCOUNT', w, score, score)
  redis.call('ZADD', w, score, member)
  local floor = store_now - ttl_us
  redis.call('ZREMRANGEBYSCORE', w, '-inf', '(' .. int(floor))
  if redis.call('PTTL', w) < ttl_ms then
    -- A fresh series has no TTL (PTTL -1); PEXPIRE 0 (a zero ttl) deletes it,
    -- as MemoryCache's series is dead on arrival.
    redis.call('PEXPIRE', w, int(ttl_ms))
  end
end

-- decide::window::clamp_stamp: the instant a slot is decided at — the server's
-- clock when the caller sent '' (TimeSource::Store), else the caller's,
-- clamped into [store_now - window, store_now + max_ahead] — and 1 when it
-- was clamped.
local function slot_stamp(arg, store_now, window, max_ahead)
  if arg == '' then
    return store_now, 0
  end
  local now = tonumber(arg)
  local floor = store_now - window
  if floor < 0 then
    floor = 0
  end
  local ceiling = store_now + max_ahead
  if now > ceiling then
    return ceiling, 1
  elseif now < floor then
    return floor, 1
  end
  return now, 0
end

-- decide::window::decide's wait for a refused slot: until the hit at
-- decide::window::freeing_rank (count - limit, counted from the oldest in the
-- window: the oldest at the limit) has left the inclusive window,
-- (hit + window) - now plus one microsecond, never less than one
-- microsecond; the full window if there is no such hit.
local function slot_wait(w, since, now, window, count, limit)
  local rank = count - limit
  if rank < 0 then
    rank = 0
  end
  local hit = redis.call('ZRANGEBYSCORE', w, int(since), MAX_SCORE, 'WITHSCORES', 'LIMIT', int(rank), 1)
  if not hit[2] then
    return window
  end
  local wait = tonumber(hit[2]) + window + 1 - now
  if wait < 1 then
    wait = 1
  end
  return wait
end
