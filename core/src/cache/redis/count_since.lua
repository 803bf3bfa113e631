-- HitWindow::count_since: hits at or after ARGV[1] (µs), inclusive.
-- KEYS[1]: the window's sorted set; a foreign value of another type counts
-- nothing, as do scores beyond any the adapter writes.
if not window_readable(KEYS[1]) then
  return 0
end
return redis.call('ZCOUNT', KEYS[1], ARGV[1], MAX_SCORE)
