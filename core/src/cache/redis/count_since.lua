-- HitWindow::count_since: hits at or after ARGV[1] (µs), inclusive.
-- KEYS[1]: the window's sorted set.
return redis.call('ZCOUNT', KEYS[1], ARGV[1], '+inf')
