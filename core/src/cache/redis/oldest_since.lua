-- HitWindow::oldest_since: the earliest hit at or after ARGV[1] (µs), as a
-- decimal string, or nil.
-- KEYS[1]: the window's sorted set; a foreign value of another type holds no
-- hit, nor do scores beyond any the adapter writes.
if not window_readable(KEYS[1]) then
  return false
end
local first = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], MAX_SCORE, 'WITHSCORES', 'LIMIT', 0, 1)
if first[2] then
  return int(tonumber(first[2]))
end
return false
