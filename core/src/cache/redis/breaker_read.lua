-- BreakerStore::breaker_read: the four raw values and the instant to judge
-- them at, in one round trip, changing nothing.
-- KEYS: state, failures, opened_at, half_open_calls.
-- ARGV[1]: now (µs, or '' for the server's TIME).
local values = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return {int(now_from(ARGV[1])), values[1], values[2], values[3], values[4]}
