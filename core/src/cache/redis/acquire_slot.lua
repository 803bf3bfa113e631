-- LimiterStore::acquire_slot: count, decide and record in one atomic step.
-- KEYS[1]: the tenant's window (sorted set).
-- ARGV: now (µs, or '' for the server's TIME), window (µs), limit,
--       ttl (µs), ttl (ms, rounded up), max_ahead (µs).
-- Returns {1, remaining, at, clamped, healed} when admitted, {0, used,
-- retry_after_us, at, clamped, healed} when refused; healed is 1 when a
-- foreign value (another type, scores beyond 2^53 µs) was removed first.
-- The decision is decide::window::decide's, line for line; a caller's stamp is
-- clamped as decide::window::clamp_stamp clamps it.
local w = KEYS[1]
local healed = heal_window(w)
local store_now = server_now()
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local now, clamped = slot_stamp(ARGV[1], store_now, window, tonumber(ARGV[6]))
local since = now - window
if since < 0 then
  since = 0
end
local count = redis.call('ZCOUNT', w, int(since), MAX_SCORE)
if count < limit then
  record(w, now, tonumber(ARGV[4]), tonumber(ARGV[5]), store_now)
  return {1, limit - count - 1, now, clamped, healed}
end
-- Refused: nothing is recorded, but a window left without a TTL (by a
-- foreign writer) gets one, so no hit holds a slot forever.
if redis.call('PTTL', w) == -1 then
  redis.call('PEXPIRE', w, ARGV[5])
end
return {0, count, slot_wait(w, since, now, window, count, limit), now, clamped, healed}
