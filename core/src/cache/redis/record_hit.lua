-- HitWindow::record_hit.
-- KEYS[1]: the window's sorted set.
-- ARGV: at (µs), ttl (µs), ttl (ms, rounded up).
-- Returns 1 when a foreign value (another type, or scores beyond 2^53 µs)
-- was removed first, else 0.
local healed = heal_window(KEYS[1])
record(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), server_now())
return healed
