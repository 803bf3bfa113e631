-- InFlightStore::pick_least_loaded: drop ended leases, count, pick and
-- lease, in one atomic step.
-- KEYS: each deployment's in-flight set (sorted set: member = a call's id,
-- score = its lease's end in µs).
-- ARGV: now (µs, or '' for the server's TIME), the call's id, its lease
--       (µs), its lease (ms, rounded up), max_ahead (µs), then one weight
--       per key. A caller's now is clamped to at most max_ahead past the
--       server's clock, as decide::budget::clamp_budget_stamp clamps it.
-- Returns {index (0-based), count per key...}. The pick is
-- decide::pick::least_loaded's, line for line.
local now = server_now()
if ARGV[1] ~= '' then
  local ceiling = now + tonumber(ARGV[5])
  now = tonumber(ARGV[1])
  if now > ceiling then
    now = ceiling
  end
end
local counts = {}
for i, k in ipairs(KEYS) do
  if not window_readable(k) then
    redis.call('DEL', k)
  end
  -- A lease counts through its last microsecond.
  redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. int(now))
  counts[i] = redis.call('ZCARD', k)
end
local best = nil
for i = 1, #KEYS do
  local w = tonumber(ARGV[5 + i])
  if w > 0 and (best == nil or counts[i] * tonumber(ARGV[5 + best]) < counts[best] * w) then
    best = i
  end
end
local k = KEYS[best]
redis.call('ZADD', k, int(now + tonumber(ARGV[3])), ARGV[2])
if redis.call('PTTL', k) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', k, ARGV[4])
end
local reply = {best - 1}
for i = 1, #KEYS do
  reply[#reply + 1] = counts[i]
end
return reply
