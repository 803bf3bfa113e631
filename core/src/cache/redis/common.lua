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

