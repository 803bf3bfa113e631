-- HitWindow::record_hit.
-- KEYS[1]: the window's sorted set.
-- ARGV: at (µs), ttl (µs), ttl (ms, rounded up).
record(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), server_now())
return 1
