-- LimiterStore::acquire_slot: count, decide and record in one atomic step.
-- KEYS[1]: the tenant's window (sorted set).
-- ARGV: now (µs, or '' for the server's TIME), window (µs), limit,
--       ttl (µs), ttl (ms, rounded up).
-- Returns {1, remaining, at} when admitted, {0, used, retry_after_us, at} when
-- refused. The decision is limiter::decide's, line for line.
local w = KEYS[1]
local now = now_from(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local since = now - window
if since < 0 then
  since = 0
end
local count = redis.call('ZCOUNT', w, int(since), '+inf')
if count < limit then
  record(w, now, tonumber(ARGV[4]), tonumber(ARGV[5]))
  return {1, limit - count - 1, now}
end
-- Refused: nothing is recorded. The wait runs until the oldest hit in the
-- window has left the inclusive window: (oldest + window) - now plus one
-- microsecond, never less than one microsecond; the full window if there is
-- no oldest hit.
local first = redis.call('ZRANGEBYSCORE', w, int(since), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local retry = window
if first[2] then
  retry = tonumber(first[2]) + window + 1 - now
  if retry < 1 then
    retry = 1
  end
end
return {0, count, retry, now}
